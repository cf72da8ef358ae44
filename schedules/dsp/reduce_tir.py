"""Row reductions (reduce_sum, reduce_max, reduce_mean over the last axis of (m, n)) as the TVM
schedule the DSP simulator executes: the op's own TE compute with the reduce template's knobs as
primitives.

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

The backend's vector lowering (`tir_vector`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, OP, SCOPE_AM, STAGE, VEC, machine
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from . import stream

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
    """A row schedule (this module's, or softmax_tir's) for the backend's vector lowering
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


__all__ = ["reduce_schedule", "scheduled"]
