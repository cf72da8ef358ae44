"""dsp-sim templates for row reductions (reduce_sum, reduce_max, reduce_mean over the last axis of (m, n))
and row softmax, both lowered from the TVM schedule of the op's compute (`reduce_schedule`,
`softmax_schedule`, below) by the backend's vector-nest lowering (`backend/dsp/lower/vector.py`).

Rows are independent. A stage is a block of `rows` rows, DMAed DDR -> AM with the row pitch
padded to a multiple of 32 x `acc` (the pad columns hold the reduction's identity, written by
vector stores once per buffer: the DMA never writes them); blocks are split over the cores. Per
row the VPU walks the row's vectors with `acc` independent accumulators (more of them hide the
FMAC / ALU latency of the accumulation chain), combines them, and reduces the 32 lanes by
log2(32) rotate-and-combine steps (the VPEs' shuffle network). reduce_* store one lane per row;
reduce_mean then multiplies the block's row sums by 1/n (one vector pass over them, in place).
Softmax makes three passes over the block: the row max (to an AM scratch), e = exp(x - max)
into the e tile with its running sum (exp is the VPU's Cody-Waite + polynomial sequence) and
1 / sum (reciprocal estimate + Newton steps), and e * (1 / sum) in place; the tile is DMAed
AM -> DDR.

The row reductions' schedule (`reduce_schedule`): reduce_sum, reduce_max, reduce_mean over the last
axis of (m, n) as the TVM schedule the DSP simulator executes, the op's own TE compute with the
template's knobs as primitives.

    rows per stage                 split of the row axis; the outer loop opc.dsp.stage and
                                   opc.dsp.cores (contiguous shares of row blocks)
    the row tile                   cache_read into local.AM at the stage (a DMA nest), rows
                                   storage_align'ed to a multiple of 32 x `acc` (the pitch)
    acc accumulators               split of the reduction axis into (vectors / acc, acc, lanes):
                                   the lowering keeps one accumulator per `acc` iteration, walks
                                   the first loop, reduces the lanes (rotate-and-combine)
    the result                     cache_write into local.AM (one element per row), copied back
    reduce_mean's 1 / n            the sum (the catalogue's compute: the sum, then one multiply by
                                   1/n) into local.AM at the stage, the multiply a vector nest
                                   (opc.dsp.op = "vec") over the block's rows into the result tile

Row softmax's schedule (`softmax_schedule`): the op's own TE compute (max, subtract, exp, sum,
divide) with the template's knobs as primitives, staged as the row reductions.

    rows per stage                 split of the row axis; the outer loop opc.dsp.stage and
                                   opc.dsp.cores (contiguous shares of row blocks); every other
                                   block compute_at there
    the row tile                   cache_read into local.AM at the stage (a DMA nest), rows
                                   storage_align'ed to a multiple of 32 x `acc` (the pitch)
    the row max                    a lane reduction (opc.dsp.reduce_lanes) split (vectors / acc,
                                   acc, lanes), into local.AM (one element per row)
    e = exp(x - max) and its sum   subtract inlined into exp; one row nest (opc.dsp.rows) over
                                   (rows, vectors / acc, acc, lanes), the sum reverse_compute_at
                                   its lanes loop (accumulated as e is computed)
    e / sum                        a row nest over the same split into the output tile (the e tile,
                                   in place: the lowering multiplies by the reciprocal it stored)
    the output                     cache_write into local.AM, copied back

The backend's vector lowering (`tir_vector`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, F32, OP, SCOPE_AM, STAGE, VEC, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from . import stream
from .common import capacity_why, require_fp32
from .stream import RowBlocks, cores_knob, geo_shares, row_default

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
ACC = (1, 2, 4, 8)


class _Geo(RowBlocks):
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        super().__init__(m, wl["m"], wl["n"], cfg)
        self.softmax = wl.op == "softmax"
        self.mean = wl.op == "reduce_mean"

    def am_elems(self) -> int:
        tile = self.rows * self.npad
        if self.softmax:
            return self.nbuf * 2 * tile + 2 * self.rows * self.L
        return self.nbuf * (tile + (2 if self.mean else 1) * self.rows)  # mean: the sums, then the means


class _RowTemplate(Template):
    target_family = "dsp"
    version = 1
    ops: tuple[str, ...] = ()

    def _check_wl(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)
        if wl.op not in self.ops:
            raise OpcError(f"no {self.name} lowering for {wl.op}", arg="op", value=wl.op, expected=", ".join(self.ops))

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        return [Knob("rows", tuple(v for v in ROWS if v <= wl["m"]) or (1,), "rows per stage"),
                Knob("acc", ACC, "independent accumulators per row (hide the accumulation latency)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        return row_default(self, wl, target, m, wl["m"], knobs["rows"], (4, 2, 1))

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        return capacity_why(m, {"AM": g.am_elems() * F32})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        out = g.m_ * g.n if g.softmax else g.m_
        return g.features(m, config["cores"], float((g.m_ * g.n + out) * F32))

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`reduce_schedule` / `softmax_schedule`), lowered by
        the DSP backend."""
        self._check_wl(wl, target)
        m, g, shares = geo_shares(self, wl, target, config, _Geo)
        return (softmax_scheduled if g.softmax else scheduled)(wl, target, config, g, shares)


@register_template
class DspReduce(_RowTemplate):
    """reduce_sum / reduce_max / reduce_mean over the last axis on the VPU."""

    name = "dsp.reduce"
    op_families = ("reduce",)
    ops = ("reduce_sum", "reduce_max", "reduce_mean")


@register_template
class DspSoftmax(_RowTemplate):
    """Row softmax on the VPU (max, exp + sum, scale)."""

    name = "dsp.softmax"
    op_families = ("softmax",)
    ops = ("softmax",)


_WL: dict[str, Workload] = {}


def reduce_schedule(wl: Workload, rows: int, acc: int, lanes: int):
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if wl.op == "reduce_mean":  # the sum, then one multiply by 1/n: a vector nest over the rows' sums
        blk, scale = blocks
        io, ii = sch.split(sch.get_loops(scale)[0], [None, rows])
        o = sch.cache_write(scale, 0, SCOPE_AM)
        sch.reverse_compute_at(o, io, preserve_unit_loops=True)
        sch.compute_at(blk, io, preserve_unit_loops=True)
        sch.set_scope(blk, 0, SCOPE_AM)
        sch.annotate(ii, OP, VEC)
        ii, k = sch.get_loops(blk)[1:]
        sch.split(k, [None, acc, lanes])
    else:
        blk = blocks[-1]
        i, k = sch.get_loops(blk)
        io, ii = sch.split(i, [None, rows])
        sch.split(k, [None, acc, lanes])  # (vectors / acc, acc, lanes)
        o = sch.cache_write(blk, 0, SCOPE_AM)
        sch.reverse_compute_at(o, io, preserve_unit_loops=True)
    sch.annotate(io, STAGE, 1)
    sch.annotate(io, CORES, 1)
    rd = sch.cache_read(blk, 0, SCOPE_AM)
    sch.compute_at(rd, io, preserve_unit_loops=True)
    sch.storage_align(rd, 0, 0, lanes * acc, 0)
    sch.annotate(sch.get_loops(rd)[1], OP, DMA)
    sch.annotate(ii, OP, VEC)
    sch.annotate(ii, "opc.dsp.reduce_lanes", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list,
              schedule: Callable = reduce_schedule) -> Scheduled:
    """A row schedule (`reduce_schedule`, or `softmax_schedule`) for the backend's vector lowering
    (`lowering="vector"`: lane reductions and row nests)."""
    m = machine(target)
    op = get_op(wl.op)
    knobs = (g.rows, g.acc, g.L)
    return stream.scheduled(
        "vector", wl, config, m, (schedule.__name__, wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lane_use": round(g.n / g.npad, 4), "lowering": "tir"},
        args={0: "x", -1: "out"}, ddr={"x": (g.m_, g.n), "out": tuple(int(v) for v in op.output_spec(wl)[0])},
        tile_tags=True)



def softmax_schedule(wl: Workload, rows: int, acc: int, lanes: int):
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    # the broadcasts of the row max and the row sum exist only when a row has more than one
    # element (n = 1: the compute reads the (m, 1) reductions directly)
    names = {sch.get(x).name_hint for x in sch.get_child_blocks(sch.get_sblock("root"))}
    b = {n: sch.get_sblock(n) for n in ("reduce_max", "broadcast", "vsub", "vexp", "sum", "broadcast_1", "vdiv")
         if n in names}
    for n in ("broadcast", "vsub", "broadcast_1"):
        if n in b:
            sch.compute_inline(b[n])
    if "broadcast" not in b:
        # n = 1: exp and the division index the (m, 1) max and sum by the column too (the only
        # column, 0): the reductions as (m,) vectors, read once per row like the broadcasts
        for n in ("reduce_max", "sum"):
            sch.transform_layout(b[n], ("write", 0), lambda i, j: [i])
    i, j = sch.get_loops(b["vdiv"])
    io, ii = sch.split(i, [None, rows])
    sch.split(j, [None, acc, lanes])
    sch.annotate(io, STAGE, 1)
    sch.annotate(io, CORES, 1)
    o = sch.cache_write(b["vdiv"], 0, SCOPE_AM)
    sch.reverse_compute_at(o, io, preserve_unit_loops=True)
    for n in ("sum", "vexp", "reduce_max"):
        sch.compute_at(b[n], io, preserve_unit_loops=True)
        sch.set_scope(b[n], 0, SCOPE_AM)
    ei, ej = sch.get_loops(b["vexp"])[1:]
    sch.split(ej, [None, acc, lanes])
    sch.split(sch.get_loops(b["sum"])[-1], [None, acc, lanes])
    _, ri, r1, rk = sch.get_loops(b["reduce_max"])
    sch.fuse(ri, r1)  # the kept unit axis
    sch.split(rk, [None, acc, lanes])
    rd = sch.cache_read(b["reduce_max"], 0, SCOPE_AM)
    sch.compute_at(rd, io, preserve_unit_loops=True)
    for blk in (rd, b["vexp"], b["vdiv"]):
        sch.storage_align(blk, 0, 0, lanes * acc, 0)
    sch.reverse_compute_at(b["sum"], sch.get_loops(b["vexp"])[-1], preserve_unit_loops=True)
    sch.annotate(sch.get_loops(rd)[1], OP, DMA)
    mx = sch.get_loops(b["reduce_max"])[1]
    sch.annotate(mx, OP, VEC)
    sch.annotate(mx, "opc.dsp.reduce_lanes", 1)
    for n in ("vexp", "vdiv"):
        lp = sch.get_loops(b[n])[1]
        sch.annotate(lp, OP, VEC)
        sch.annotate(lp, "opc.dsp.rows", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch


def softmax_scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The softmax schedule for the backend's vector lowering, framed as the row reductions."""
    return scheduled(wl, target, config, g, shares, schedule=softmax_schedule)

