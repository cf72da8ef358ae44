"""dsp-sim template for pad (explicit, possibly asymmetric spatial padding of an NCHW tensor, fill
zero or the fp32 lowest value: what graphs put in front of a conv / pool whose ONNX pads are
asymmetric).

An item is (block of `planes` planes, block of `rows` output rows), split over the cores. The
output tile is assembled in AM: the fill value by vector stores (the left / right columns once
per buffer, since the DMA never writes them; rows above / below the input when the item has
them), the input rows by DMA DDR -> AM into the interior; the tile (whole output rows) is
DMAed AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .stream import cdiv, cores_knob, fill_kernel, group_key, share, stream, vpu_op

PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 8, 16, 32, 64)


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.pt, self.pl, self.pb, self.pr = p["pt"], p["pl"], p["pb"], p["pr"]
        self.H, self.W = self.h + self.pt + self.pb, self.w + self.pl + self.pr
        self.P = self.n * self.c
        self.L = m.lanes
        self.value = 0.0 if p["fill"] == "zero" else float(np.finfo(np.float32).min)
        self.planes = max(1, min(int(cfg["planes"]), self.P))
        self.rows = max(1, min(int(cfg["rows"]), self.H))
        self.nbuf = 1 + int(cfg["dbuf"])
        self.OP = self.rows * self.W

    def items(self) -> list[tuple[int, int, int, int]]:
        return [(p0, min(self.planes, self.P - p0), y0, min(self.rows, self.H - y0))
                for p0 in range(0, self.P, self.planes) for y0 in range(0, self.H, self.rows)]

    def key(self, it: tuple[int, int, int, int]) -> tuple:
        _, np_, y0, nr = it
        lo, hi = max(0, y0 - self.pt), min(self.h, y0 + nr - self.pt)
        return (np_, nr, lo + self.pt - y0, hi - lo)

    def am_elems(self) -> int:
        return self.nbuf * self.planes * self.OP


class DspPad(Template):
    """Explicit padding by DMA into fill-initialized AM tiles (dispatched to by `dsp.elemwise`)."""

    name = "dsp.pad"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        from .common import require_fp32
        require_fp32(wl, target)
        g = _Geo(machine(target), wl, {"planes": 1, "rows": 1, "dbuf": 0})
        return [Knob("planes", tuple(v for v in PLANES if v <= g.P) or (1,), "planes per stage"),
                Knob("rows", tuple(sorted({v for v in ROWS if v < g.H} | {g.H})), "output rows per stage"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        g = _Geo(m, wl, {"planes": 1, "rows": 1, "dbuf": 0})
        for rows in sorted(knobs["rows"], reverse=True):
            for planes in sorted(knobs["planes"], reverse=True):
                cfg = {"planes": planes, "rows": rows, "dbuf": 1, "cores": m.cores}
                if cdiv(g.P, planes) * cdiv(g.H, rows) < min(2 * m.cores, g.P * cdiv(g.H, rows)):
                    continue
                if self.check(wl, target, cfg) is None:
                    return cfg
        return {"planes": 1, "rows": 1, "dbuf": 1, "cores": m.cores}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        am = _Geo(m, wl, config).am_elems() * F32
        return f"AM needs {am} B > {m.cap('AM')} B" if am > m.cap("AM") else None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        return {"ddr_bytes": float((g.P * g.h * g.w + g.P * g.H * g.W) * F32), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM")}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        self.space(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            if not shares[core]:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            bufs = [am.alloc(f"output tile[{b}]", g.planes * g.OP) for b in range(g.nbuf)]

            def stage(it, slot, first):
                return self._stage(m, g, it, slot, first, bufs[slot], functional)

            return stream(shares[core], g.nbuf, functional, stage, g.key, cache)

        ddr = {"x": (g.n, g.c, g.h, g.w), "out": (g.n, g.c, g.H, g.W)}
        hpre, hpost = host_ops(m, [("x", nbytes(ddr["x"]))], [("out", nbytes(ddr["out"]))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=["x"], output="out", out_shape=ddr["out"],
                        flops=op.flops(wl), cores_used=sum(1 for s in shares if s), info={"layout_change": "none"})

    def _stage(self, m, g: _Geo, it, slot, first, ob, fn):
        p0, np_, y0, nr = it
        tag, tpad = f"t{slot}", f"pad{slot}"
        lo, hi = max(0, y0 - g.pt), min(g.h, y0 + nr - g.pt)
        r_in = lo + g.pt - y0  # first tile row the input lands in
        fills = []
        if first:
            if g.pl:
                fills.append(((0, 0), (g.planes, g.rows, g.pl)))
            if g.pr:
                fills.append(((0, g.pl + g.w), (g.planes, g.rows, g.pr)))
        if hi <= lo:
            fills.append(((0, 0), (np_, nr, g.W)))
        else:
            if r_in > 0:
                fills.append(((0, 0), (np_, r_in, g.W)))
            if r_in + hi - lo < nr:
                fills.append(((r_in + hi - lo, 0), (np_, nr - r_in - hi + lo, g.W)))
        ins: list[Op] = [vpu_op(m, fill_kernel(g.value, ob + r0 * g.W + c0, shape, (g.OP, g.W), g.L, "pad fill"), (),
                                (tpad,), fn, "fill") for (r0, c0), shape in fills]
        if hi > lo:
            src = View(("DDR", "x"), (p0 * g.h + lo) * g.w, (np_, hi - lo, g.w), (g.h * g.w, g.w, 1))
            dst = View(("AM",), ob + r_in * g.W + g.pl, (np_, hi - lo, g.w), (g.OP, g.W, 1))
            ins.append(dma_op(m, src, dst, (), (tag,), fn, "x DDR->AM"))
        osrc = View(("AM",), ob, (np_, nr, g.W), (g.OP, g.W, 1))
        odst = View(("DDR", "out"), (p0 * g.H + y0) * g.W, (np_, nr, g.W), (g.H * g.W, g.W, 1))
        return ins, [], [dma_op(m, osrc, odst, (tag, tpad), ("out",), fn, "y AM->DDR")]
