"""dsp-sim template for pool2d (max / average, kernel, stride, padding), NCHW.

The N*C planes are independent. An item is (block of `planes` planes, block of `rows` output
rows); items are split over the cores. Per item the input rows it needs (with the halo of the
window) are DMAed DDR -> AM into a tile whose rows are padded: the padding columns and any rows
outside the image hold the pooling identity (-inf for max, 0 for average), written by vector
stores (the side columns once per buffer, the top / bottom rows when an item needs them).

Output columns sit on the 32 lanes: for output row y and vector v, tap (r, s) is a vector load
of input row y*stride + r at column 32*v*stride + s with lane stride `stride` (a strided load
takes `stride` load slots). `separable=1` reduces each input row over the S taps first (into an
AM scratch) and then the R rows of that (max and sum are separable): fewer loads and ALU ops per
output, one more store and load. Average pooling divides by the number of valid elements in the
window (padding not counted): 1/k^2 as an immediate when there is no padding, else a vector of
per-column reciprocals (AM) times a per-row reciprocal (SM scalar), constants the host computes
with the kernel (like weights). The output tile (rows of ceil(wo/32)*32 lanes) is DMAed
AM -> DDR, wo columns per row.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.backend.dsp.vector import Mem, Nest, VI, VKernel
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .common import require_fp32
from .stream import cdiv, cores_knob, fill_kernel, group_key, share, stream, vpu_op

PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 7, 8, 14, 16, 28, 32, 56)


class _Geo:
    """Tile geometry of one workload and config (elements)."""

    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.k, self.st, self.pad, self.mode = p["kernel"], p["stride"], p["pad"], p["mode"]
        self.ho = (self.h + 2 * self.pad - self.k) // self.st + 1
        self.wo = (self.w + 2 * self.pad - self.k) // self.st + 1
        self.P = self.n * self.c
        self.L = L = m.lanes
        self.nv = cdiv(self.wo, L)
        self.OW = self.nv * L  # output tile row pitch (lanes of every vector)
        self.Wr = max(self.w + 2 * self.pad, (self.OW - 1) * self.st + self.k)  # input tile row pitch
        self.planes = max(1, min(int(cfg["planes"]), self.P))
        self.rows = max(1, min(int(cfg["rows"]), self.ho))
        self.IR = self.ir(self.rows)
        self.sep = bool(cfg["separable"]) and self.k > 1
        self.nbuf = 1 + int(cfg["dbuf"])
        self.PP = self.IR * self.Wr
        self.OP = self.rows * self.OW
        self.HP = self.IR * self.OW
        self.full = self.pad == 0  # every window inside the image: avg divides by k*k
        self.ident = -np.inf if self.mode == "max" else 0.0

    def ir(self, nr: int) -> int:
        return (nr - 1) * self.st + self.k

    def am_elems(self, lanes: int) -> int:
        per = self.planes * (self.PP + self.OP + (self.HP if self.sep else 0))
        consts = self.OW if (self.mode == "avg" and not self.full) else 0
        return self.nbuf * (per + lanes * self.st) + consts

    def sm_elems(self) -> int:
        return self.ho if (self.mode == "avg" and not self.full) else 0

    def items(self) -> list[tuple[int, int, int, int]]:
        return [(p0, min(self.planes, self.P - p0), y0, min(self.rows, self.ho - y0))
                for p0 in range(0, self.P, self.planes) for y0 in range(0, self.ho, self.rows)]

    def key(self, it: tuple[int, int, int, int]) -> tuple:
        _, np_, y0, nr = it
        iy0 = y0 * self.st - self.pad
        lo, hi = max(0, iy0), min(self.h, iy0 + self.ir(nr))
        return (np_, nr, lo - iy0, hi - lo)


def _counts(n_in: int, n_out: int, k: int, st: int, pad: int) -> np.ndarray:
    """Valid elements of each window along one axis."""
    o = np.arange(n_out) * st - pad
    return (np.minimum(o + k, n_in) - np.maximum(o, 0)).astype(np.float64)


@register_template
class DspPool2d(Template):
    """Max / average pooling on the VPU: output columns on the lanes, planes x row blocks across cores."""

    name = "dsp.pool2d"
    op_families = ("pool",)
    target_family = "dsp"
    version = 1

    def _check_wl(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)
        if wl.layout != "NCHW":
            raise OpcError("dsp.pool2d works on NCHW (output columns on the lanes)", arg="layout", value=wl.layout,
                           expected="NCHW")

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        m = machine(target)
        g = _Geo(m, wl, {"planes": 1, "rows": 1, "separable": 0, "dbuf": 0})
        planes = tuple(v for v in PLANES if v <= g.P) or (1,)
        rows = tuple(sorted({v for v in ROWS if v < g.ho} | {g.ho}))
        return [Knob("planes", planes, "planes (n x c) per stage"),
                Knob("rows", rows, "output rows per stage (the input halo is fetched again per block)"),
                Knob("separable", (1, 0) if wl["kernel"] > 1 else (0,),
                     "reduce each input row over the columns first, then the rows (AM scratch)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles so DMA overlaps the VPU"),
                cores_knob(m)]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        g0 = _Geo(m, wl, {"planes": 1, "rows": 1, "separable": 0, "dbuf": 0})
        cfg: dict[str, Any] = {}
        # whole planes when they fit, enough items that every core gets at least two
        for rows in sorted(knobs["rows"], reverse=True):
            for planes in sorted(knobs["planes"], reverse=True):
                items = cdiv(g0.P, planes) * cdiv(g0.ho, rows)
                if items < min(2 * m.cores, cdiv(g0.P, 1) * cdiv(g0.ho, rows)):
                    continue
                cfg = {"planes": planes, "rows": rows, "separable": knobs["separable"][0], "dbuf": 1,
                       "cores": m.cores}
                if self.check(wl, target, cfg) is None:
                    return cfg
        return {"planes": 1, "rows": 1, "separable": knobs["separable"][0], "dbuf": 1, "cores": m.cores}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am, sm = g.am_elems(m.lanes) * F32, g.sm_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        if sm > m.cap("SM"):
            return f"SM needs {sm} B > {m.cap('SM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        ddr_in = sum(np_ * min(g.h, g.ir(nr)) * g.w for _, np_, _, nr in items) * F32
        ddr_out = g.P * g.ho * g.wo * F32
        loads = g.k * (g.ir(g.rows) / g.rows + g.k / g.st) if g.sep else g.k * g.k
        return {"ddr_bytes": float(ddr_in + ddr_out), "halo_ratio": ddr_in / max(g.P * g.h * g.w * F32, 1),
                "stages": float(len(items)), "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems(m.lanes) * F32 / m.cap("AM"), "loads_per_vector": float(loads),
                "lane_use": g.wo / g.OW}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        """Lower to the cluster program (timing-only ops unless `functional`)."""
        self._check_wl(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        g = _Geo(m, wl, config)
        L = m.lanes
        shares = share(g.items(), int(config["cores"]), m.cores)
        ddr: dict[str, tuple] = {"x": (g.n, g.c, g.h, g.w), "out": (g.n, g.c, g.ho, g.wo)}
        prepare = []
        tables = g.mode == "avg" and not g.full
        if tables:
            cols = np.zeros(g.OW, np.float32)
            cols[:g.wo] = 1.0 / _counts(g.w, g.wo, g.k, g.st, g.pad)
            rows = (1.0 / _counts(g.h, g.ho, g.k, g.st, g.pad)).astype(np.float32)
            ddr["rcp_cols"], ddr["rcp_rows"] = (g.OW,), (g.ho,)

            def fill_tables(d, cols=cols, rows=rows):
                d["rcp_cols"][...] = cols
                d["rcp_rows"][...] = rows
            prepare.append(fill_tables)
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            items = shares[core]
            if not items:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            ibuf = [am.alloc(f"input tile[{b}]", g.planes * g.PP + L * g.st) for b in range(g.nbuf)]
            obuf = [am.alloc(f"output tile[{b}]", g.planes * g.OP) for b in range(g.nbuf)]
            hbuf = [am.alloc(f"row scratch[{b}]", g.planes * g.HP) for b in range(g.nbuf)] if g.sep else [0, 0]
            ops: list[Op] = []
            rc_am = rr_sm = 0
            if tables:
                rc_am = am.alloc("column reciprocals", g.OW)
                ops.append(dma_op(m, View(("DDR", "rcp_cols"), 0, (g.OW,), (1,)), View(("AM",), rc_am, (g.OW,), (1,)),
                                  (), ("const",), functional, "rcp_cols DDR->AM"))
                ops.append(dma_op(m, View(("DDR", "rcp_rows"), 0, (g.ho,), (1,)), View(("SM",), rr_sm, (g.ho,), (1,)),
                                  (), ("const",), functional, "rcp_rows DDR->SM"))

            def stage(it, slot, first):
                return self._stage(m, g, it, slot, first, ibuf[slot], obuf[slot], hbuf[slot], rc_am, rr_sm, functional)

            return ops + stream(items, g.nbuf, functional, stage, g.key, cache)

        hpre, hpost = host_ops(m, [("x", nbytes(ddr["x"]))], [("out", nbytes(ddr["out"]))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=["x"], output="out", out_shape=ddr["out"],
                        prepare=prepare, flops=op.flops(wl), cores_used=sum(1 for s in shares if s),
                        info={"layout_change": "none", "lane_use": round(g.wo / g.OW, 4)})

    def _stage(self, m, g: _Geo, it, slot, first, ib, ob, hb, rc_am, rr_sm, fn):
        p0, np_, y0, nr = it
        L = m.lanes
        iy0 = y0 * g.st - g.pad
        ir = g.ir(nr)
        lo, hi = max(0, iy0), min(g.h, iy0 + ir)
        tag_in, tag_pad, tag_out = f"in{slot}", f"pad{slot}", f"out{slot}"
        ins: list[Op] = []
        fills: list = []
        if first and g.pad:  # the side columns: never written by the DMA, filled once per buffer
            fills.append(((0, 0), (g.planes, g.IR, g.pad)))
            fills.append(((0, g.pad + g.w), (g.planes, g.IR, g.pad)))
        if lo > iy0:
            fills.append(((0, 0), (np_, lo - iy0, g.Wr)))
        if iy0 + ir > hi:
            fills.append(((hi - iy0, 0), (np_, iy0 + ir - hi, g.Wr)))
        for (r0, c0), shape in fills:
            k = fill_kernel(g.ident, ib + r0 * g.Wr + c0, shape, (g.PP, g.Wr), L, "pool padding")
            ins.append(vpu_op(m, k, (), (tag_pad,), fn, "padding fill"))
        src = View(("DDR", "x"), (p0 * g.h + lo) * g.w, (np_, hi - lo, g.w), (g.h * g.w, g.w, 1))
        dst = View(("AM",), ib + (lo - iy0) * g.Wr + g.pad, (np_, hi - lo, g.w), (g.PP, g.Wr, 1))
        ins.append(dma_op(m, src, dst, (), (tag_in,), fn, "x DDR->AM"))
        kern = VKernel(tuple(self._nests(g, np_, nr, ir, ib, ob, hb, rc_am, rr_sm + y0)), "pool2d")
        comp = [vpu_op(m, kern, (tag_in, tag_pad, "const"), (tag_out,), fn, f"pool {np_}x{nr} rows")]
        osrc = View(("AM",), ob, (np_, nr, g.wo), (g.OP, g.OW, 1))
        odst = View(("DDR", "out"), (p0 * g.ho + y0) * g.wo, (np_, nr, g.wo), (g.ho * g.wo, g.wo, 1))
        outs = [dma_op(m, osrc, odst, (tag_out,), ("out",), fn, "y AM->DDR")]
        return ins, comp, outs

    @staticmethod
    def _reduce(g: _Geo, taps: list[Mem]) -> list[VI]:
        """acc <- max / sum of the taps, loads rotating over 4 registers."""
        op = "vmax" if g.mode == "max" else "vadd"
        out = [VI("vld", "acc", (taps[0],))]
        for t, mem in enumerate(taps[1:]):
            r = f"x{t % 4}"
            out += [VI("vld", r, (mem,)), VI(op, "acc", ("acc", r))]
        return out

    def _nests(self, g: _Geo, np_: int, nr: int, ir: int, ib: int, ob: int, hb: int, rc_am: int, rr_sm: int
               ) -> list[Nest]:
        st, k, W, OW, vl = g.st, g.k, g.Wr, g.OW, g.L
        if g.sep:
            taps = [Mem("AM", ib + s, (g.PP, W, vl * st), st) for s in range(k)]
            hnest = Nest(outer=(np_, ir, g.nv), body=(),
                         post=tuple(self._reduce(g, taps)) + (VI("vst", Mem("AM", hb, (g.HP, OW, vl)), ("acc",)),))
            taps = [Mem("AM", hb + r * OW, (g.HP, st * OW, vl), 1) for r in range(k)]
            first = [hnest]
        else:
            taps = [Mem("AM", ib + r * W + s, (g.PP, st * W, vl * st), st) for r in range(k) for s in range(k)]
            first = []
        body = self._reduce(g, taps)
        if g.mode == "avg":
            if g.full:
                body.append(VI("vmul", "acc", ("acc", 1.0 / (k * k))))
            else:
                body += [VI("vld", "rc", (Mem("AM", rc_am, (0, 0, vl)),)), VI("sld", "rr", (Mem("SM", rr_sm, (0, 1, 0), 0),)),
                         VI("vmul", "acc", ("acc", "rc")), VI("vmul", "acc", ("acc", "rr"))]
        body.append(VI("vst", Mem("AM", ob, (g.OP, OW, vl)), ("acc",)))
        return first + [Nest(outer=(np_, nr, g.nv), post=tuple(body))]
