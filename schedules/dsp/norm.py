"""dsp-sim template for layer normalisation (layer_norm, add_layer_norm) over the last axis of
(rows, cols), on the VPU in fp32, lowered from the TVM schedule of the op's compute by the
backend's vector-nest lowering (`backend/dsp/lower/vector.py`), staged as the row reductions and
softmax are (`reduce.py`).

A stage is a block of `rows` rows DMAed DDR -> AM (row pitch padded to a multiple of 32 x
`acc`), blocks split over the cores; gamma and beta are DMAed into AM once per core. Per stage,
one VPU pass of five nests:

    the row sums         layer_norm: a lane reduction of x (`acc` accumulators, rotate-and-
                         combine); add_layer_norm: s = x + r as a row nest with the sum fused
    mean = sum / n       one vector pass over the block's sums
    d = s - mean         a row nest (the mean a per-row operand) storing d, the sum of d * d
                         fused (one FMA per vector)
    rstd                 1 / sqrt(sum * 1/n + eps) over the block's rows (an FMA, then the
                         VPU's reciprocal square root: estimate + Newton steps)
    y                    a row nest d * rstd * gamma + beta (a multiply, one FMA) into d's tile

A fused reduction over a row whose pitch runs past its end masks the pad lanes with a column
table (1 on the row, 0 past it; `opc.dsp.mask_tail`): the deviations' pad lanes are -mean, not
the identity. The tile is DMAed AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import CORES, DMA, F32, OP, SCOPE_AM, STAGE, VEC, DspMachine, machine
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.catalogue.norm import norm_blocks
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from . import stream
from .common import capacity_why, require_fp32
from .stream import RowBlocks, cdiv, cores_knob, geo_shares, row_default

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
ACC = (1, 2, 4, 8)
MASK_TAIL = "opc.dsp.mask_tail"  # a row nest's fused reduction masks the lanes past the row's end
_WL: dict[str, Workload] = {}


class _Geo(RowBlocks):
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        super().__init__(m, wl["rows"], wl["cols"], cfg)
        self.res = wl.op == "add_layer_norm"

    def am_elems(self) -> int:
        """AM the lowering places (`VecLowerer._allocate`: each tile in whole vectors, a stage's
        with one vector of slack; a nest's result in the tile of an operand that dies there): per
        buffer two row tiles (layer_norm: x, and d, which y takes; add_layer_norm: x, which s, d
        and y take, and r) and four per-row statistics; once gamma, beta and the tail mask."""
        L = self.L
        tile = -(-self.rows * self.npad // L) * L + L
        stat = -(-self.rows // L) * L + L
        once = 2 * -(-self.n // L) * L + (self.npad if self.n % (L * self.acc) else 0)
        return self.nbuf * (2 * tile + 4 * stat) + once


def norm_schedule(wl: Workload, rows: int, acc: int, lanes: int):
    """The schedule (see the module docstring): stage loop over row blocks, every block computed
    there; broadcasts, the squares, rstd's chain and y's products inlined."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    r = norm_blocks(sch)
    blk = sch.get_sblock
    for nm in r["pbcast"] + r["rows_b"] + [r["sq"]] + r["stats_b"][:-1] + r["rows_c"][:-1]:
        sch.compute_inline(blk(nm))
    s1, s2 = r["sums"]
    mean, rstd, y = r["stats_a"][-1], r["stats_b"][-1], r["last"]
    for nm in (s1, mean, s2, rstd):  # the statistics as (rows,) vectors: read once per row
        sch.transform_layout(blk(nm), ("write", 0), lambda i, j: [i])
    i, j = sch.get_loops(blk(y))
    io, ii = sch.split(i, [None, rows])
    sch.split(j, [None, acc, lanes])
    sch.annotate(io, STAGE, 1)
    sch.annotate(io, CORES, 1)
    o = sch.cache_write(blk(y), 0, SCOPE_AM)
    sch.reverse_compute_at(o, io, preserve_unit_loops=True)

    def stats(nm: str) -> None:  # one vector pass over the block's rows
        sch.compute_at(blk(nm), io)
        sch.set_scope(blk(nm), 0, SCOPE_AM)
        lps = sch.get_loops(blk(nm))
        sch.annotate(lps[1] if len(lps) > 1 else sch.add_unit_loop(blk(nm)), OP, VEC)

    def row_nest(nm: str, red: str) -> None:  # (rows, vectors / acc, acc, lanes), `red` fused
        sch.compute_at(blk(red), io, preserve_unit_loops=True)
        sch.set_scope(blk(red), 0, SCOPE_AM)
        sch.compute_at(blk(nm), io, preserve_unit_loops=True)
        sch.set_scope(blk(nm), 0, SCOPE_AM)
        ri, rj = sch.get_loops(blk(nm))[1:]
        sch.split(rj, [None, acc, lanes])
        sch.split(sch.get_loops(blk(red))[-1], [None, acc, lanes])
        sch.storage_align(blk(nm), 0, 0, lanes * acc, 0)
        sch.reverse_compute_at(blk(red), sch.get_loops(blk(nm))[-1], preserve_unit_loops=True)
        lp = sch.get_loops(blk(nm))[1]
        sch.annotate(lp, OP, VEC)
        sch.annotate(lp, "opc.dsp.rows", 1)
        sch.annotate(lp, MASK_TAIL, 1)

    stats(rstd)
    row_nest(r["d"], s2)
    stats(mean)
    if r["pre"]:  # add_layer_norm: s = x + r, its sum fused
        row_nest(r["pre"][-1], s1)
        first = blk(r["pre"][-1])
    else:  # the lane reduction of x
        sch.compute_at(blk(s1), io, preserve_unit_loops=True)
        sch.set_scope(blk(s1), 0, SCOPE_AM)
        _, ri, r1, rk = sch.get_loops(blk(s1))
        sch.fuse(ri, r1)  # the kept unit axis
        sch.split(rk, [None, acc, lanes])
        lp = sch.get_loops(blk(s1))[1]
        sch.annotate(lp, OP, VEC)
        sch.annotate(lp, "opc.dsp.reduce_lanes", 1)
        first = blk(s1)
    for k in range(len(sch.get(first).reads)):  # x [, r]: into AM at the stage
        src = sch.get(first).reads[k].source
        if src.name not in ("x", "r"):
            continue
        rd = sch.cache_read(first, k, SCOPE_AM)
        sch.compute_at(rd, io, preserve_unit_loops=True)
        sch.storage_align(rd, 0, 0, lanes * acc, 0)
        sch.annotate(sch.get_loops(rd)[1], OP, DMA)
    sch.storage_align(blk(y), 0, 0, lanes * acc, 0)
    for k in reversed(range(len(sch.get(blk(y)).reads))):  # gamma, beta: into AM once per core
        if sch.get(blk(y)).reads[k].source.name in ("gamma", "beta"):
            rd = sch.cache_read(blk(y), k, SCOPE_AM)
            sch.annotate(sch.get_loops(rd)[0], OP, DMA)
    sch.annotate(sch.get_loops(blk(y))[1], OP, VEC)
    sch.annotate(sch.get_loops(blk(y))[1], "opc.dsp.rows", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch


@register_template
class DspNorm(Template):
    """layer_norm / add_layer_norm on the VPU: per block of rows the sums, the mean, d with the
    sum of its squares, rstd, and d * rstd * gamma + beta."""

    name = "dsp.layer_norm"
    op_families = ("norm",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        return [Knob("rows", tuple(v for v in ROWS if v <= wl["rows"]) or (1,), "rows per stage"),
                Knob("acc", ACC, "independent accumulators per row (hide the accumulation latency)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """The largest block that still gives every core two stages, with as many accumulators as
        a row's vectors take (more only add pad lanes), that fits AM."""
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        vecs = cdiv(wl["cols"], m.lanes)
        accs = [a for a in (4, 2, 1) if a <= vecs] or [1]
        return row_default(self, wl, target, m, wl["rows"], knobs["rows"], accs)

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        return capacity_why(m, {"AM": _Geo(m, wl, config).am_elems() * F32})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        return g.features(m, config["cores"], float(((3 if g.res else 2) * g.m_ * g.n + 2 * g.n) * F32))

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`norm_schedule`), lowered by the DSP backend's
        vector lowering; the tail mask is a table the lowering computes (a host constant)."""
        require_fp32(wl, target)
        m, g, shares = geo_shares(self, wl, target, config, _Geo)
        op = get_op(wl.op)
        knobs = (g.rows, g.acc, g.L)
        ddr = {nm: tuple(s) for nm, s, _ in op.inputs(wl)}
        ddr["out"] = tuple(int(v) for v in op.output_spec(wl)[0])
        return stream.scheduled(
            "vector", wl, config, m, ("norm_schedule", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
            lambda: norm_schedule(wl, *knobs).mod, shares, g.key,
            {"layout_change": "none", "lane_use": round(g.n / g.npad, 4), "lowering": "tir"},
            ddr=ddr, tile_tags=True, tables=True)
