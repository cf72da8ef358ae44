"""dsp-sim template for pad (explicit, possibly asymmetric spatial padding of an NCHW or NHWC
tensor, fill zero or the fp32 lowest value: what graphs put in front of a conv / pool whose ONNX
pads are asymmetric).

The tensors are viewed as (planes, rows, columns): NCHW as (n*c, h, w), NHWC as (n, h, w*c) (a
row holds its pixels' channels interleaved, so the left / right padding is pl*c / pr*c columns).

An item is (block of `planes` planes, block of `rows` output rows), split over the cores. The
output tile is assembled in AM: the fill value by vector stores (the left / right columns once
per buffer, since the DMA never writes them; rows above / below the input when the item has
them), the input rows by DMA DDR -> AM into the interior; the tile (whole output rows) is
DMAed AM -> DDR. `apply` is the TVM schedule of the op's compute (`move.pad_schedule`: the
pad block computed into the AM tile), lowered by the backend (`tir_move`).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from . import move
from .stream import cdiv, cores_knob, geo_shares, item_features

PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 8, 16, 32, 64)


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.pt, self.pl, self.pb, self.pr = p["pt"], p["pl"], p["pb"], p["pr"]
        self.H, self.W = self.h + self.pt + self.pb, self.w + self.pl + self.pr
        # the (planes, rows, columns) view `move.pad_schedule` gives the tensors: NCHW planes
        # are the n*c channel planes, a row w elements; NHWC planes are the n images, a row the w*c
        # interleaved elements of one image row
        self.P = self.n * self.c if wl.layout == "NCHW" else self.n
        if wl.layout != "NCHW":
            self.w, self.W = self.w * self.c, self.W * self.c
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
        return item_features(m, g, g.items(), config["cores"], float((g.P * g.h * g.w + g.P * g.H * g.W) * F32))

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        self.space(wl, target)
        m, g, shares = geo_shares(self, wl, target, config, _Geo)
        return move.scheduled(wl, target, config, (g.planes, g.rows), bool(config["dbuf"]), shares, g.key, {})
