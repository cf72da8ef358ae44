"""Row softmax over the last axis of (m, n) as the TVM schedule the DSP simulator executes: the
op's own TE compute (max, subtract, exp, sum, divide) with the softmax template's knobs as
primitives, staged as the reductions of `reduce_tir.py`.

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

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, OP, SCOPE_AM, STAGE, VEC
from opcompiler.ops import op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from .reduce_tir import _WL


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


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The softmax schedule for the backend's vector lowering, framed as the row reductions."""
    from .reduce_tir import scheduled as row_scheduled

    return row_scheduled(wl, target, config, g, shares, schedule=softmax_schedule)


__all__ = ["scheduled", "softmax_schedule"]
