"""dsp-sim template for pool2d (max / average, kernel, stride, padding), NCHW: its knobs, the
tile geometry and the AM budget. The program is lowered from the TVM schedule of the op's own
compute (`pool_tir.py`) by the backend's window-nest lowering (`backend/dsp/tir_vector.py`).

The N*C planes are independent. An item is (block of `planes` planes, block of `rows` output
rows); items are split over the cores. Per item the input rows it needs (with the halo of the
window) are DMAed DDR -> AM into a tile whose rows are padded (pitch `Wr`, the widest vector's
reach): the padding columns and any rows outside the image hold the pooling identity, written
by vector stores (the side columns once per buffer, the top / bottom rows when an item needs
them). Output columns sit on the 32 lanes: for output row y and vector v, tap (r, s) is a vector
load of input row y*stride + r at column 32*v*stride + s with lane stride `stride`. `separable=1`
reduces each input row over the S taps first (into an AM scratch) and then the R rows of that.
Average pooling divides by the number of valid elements in the window (padding not counted):
1/k^2 as an immediate when there is no padding, else a vector of per-column reciprocals (AM)
times a per-row reciprocal (SM scalar), constants computed at compile time (like weights).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .common import capacity_why, refuse_invalid, require_fp32
from .pool_tir import scheduled
from .stream import cdiv, cores_knob, share

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
        return capacity_why(m, {"AM": g.am_elems(m.lanes) * F32, "SM": g.sm_elems() * F32})

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

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`pool_tir.py`), lowered by the DSP backend."""
        self._check_wl(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)  # cores with equal item keys time alike
        return scheduled(wl, target, config, g, shares)
