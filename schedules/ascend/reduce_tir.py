"""The row reductions' and softmax's schedule: an `s_tir.Schedule` over the op's own TE compute
(reduce_sum / reduce_max / softmax over the last axis of (m, n)), lowered by the backend's
`emit_reduce` (TBE style: UB tiles of rows, pragma'd nests; nothing here emits instructions).

    output                      cache_write into local.UB; the copy-out's row loop split by
                                `rows_tile` into [tiles, rows]; the tile loop carries
                                opc.ascend.block_dim and opc.ascend.double_buffer; dma_copy
    input                       cache_read into local.UB at the tile loop (first); dma_copy
    fp16 -> fp32 casts          (the op's sum_in / cast_to; the output casts) local.UB stages at
                                the tile loop, one vector_auto nest over the tile's aligned rows
    reduce_sum / reduce_max     the reduction at the tile loop: its row loop is the row loop,
                                the reduction loop `vector_reduce` (a vcadd / vcmax fold per row)
    softmax                     the division (vdiv) at the tile loop; max, broadcast, sub, exp,
                                sum, broadcast at vdiv's row loop (per row: fold, dups, sub,
                                exp, fold, dups, div); vector_auto / vector_reduce
    2-D UB buffers              rows aligned to 16 elements (storage_align), as the TIK kernels
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, REDUCE, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops import op_prim_func
from opcompiler.workload import Workload

from .common import on_cores

ROW_ALIGN = 16  # elements: rows of every 2-D UB tile buffer start on a 32 B block of fp16 (64 B of fp32)
_WL: dict[str, Workload] = {}
_CASTS = ("sum_in", "sum_out", "cast_to", "cast_to_1")
_REDUCTIONS = ("sum", "reduce_max")
ROWS = "opc.ascend.row_loop"  # marks the row loop (kept when a tile has one row)
KEEP = "opc.ascend.keep"  # any annotation keeps a unit loop through LowerOpaqueBlock


@lru_cache(maxsize=256)
def _tiled(key: str, rows_tile: int):
    """(module, name of the copy-out block) for one workload and row tile."""
    from tvm.s_tir import Schedule

    wl = _WL[key]
    sch = Schedule(op_prim_func(_WL[key]))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    last = names[-1]
    copy_out = sch.cache_write(sch.get_sblock(last), 0, UB_SCOPE)
    loops = sch.get_loops(copy_out)
    tiles, inner = sch.split(loops[0], [None, min(rows_tile, wl["m"])])
    sch.annotate(inner, PRAGMA, DMA_COPY)
    softmax = wl.op == "softmax"
    for nm in reversed(names):
        b = sch.get_sblock(nm)
        if nm != last:
            sch.set_scope(b, 0, UB_SCOPE)
        if softmax and nm not in _CASTS and nm != "vdiv":  # per row, at the division's row loop
            sch.compute_at(b, sch.get_loops(sch.get_sblock("vdiv"))[1], preserve_unit_loops=True)
        else:
            sch.compute_at(b, tiles, preserve_unit_loops=True)
        two_d = len(sch.get(b).writes[0].source.shape) == 2
        if nm in _REDUCTIONS:  # the reduction loop; its row loop is the row loop
            sch.annotate(sch.get_loops(b)[-1], PRAGMA, REDUCE)
            if not softmax:
                sch.annotate(sch.get_loops(b)[-2], ROWS, 1)
        elif nm in _CASTS and two_d:  # one nest over the tile's rows
            sch.annotate(sch.get_loops(b)[-2], PRAGMA, VECTOR_AUTO)
            if wl["n"] == 1:  # keep the unit column loop: the nest still walks whole aligned rows
                sch.annotate(sch.get_loops(b)[-1], KEEP, 1)
        else:  # one row (softmax), or the tile's elements (a 1-D cast)
            sch.annotate(sch.get_loops(b)[-1], PRAGMA, VECTOR_AUTO)
        if nm == "vdiv":
            sch.annotate(sch.get_loops(b)[-2], ROWS, 1)
        if two_d and (nm in _CASTS or nm == "vdiv"):
            sch.storage_align(b, 0, 0, ROW_ALIGN, 0)
    rd = sch.cache_read(sch.get_sblock(names[0]), 0, UB_SCOPE)
    sch.compute_at(rd, tiles, preserve_unit_loops=True, index=0)
    sch.annotate(sch.get_loops(rd)[1], PRAGMA, DMA_COPY)
    sch.storage_align(rd, 0, 0, ROW_ALIGN, 0)
    return sch.mod, sch.get(copy_out).name_hint


def reduce_schedule(wl: Workload, cfg: Mapping):
    """The scheduled module (IRModule) for this config: the tiling depends on the workload and
    `rows_tile` (cached); cores and double buffering are annotations of the tile loop."""
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _tiled(key, int(cfg["rows_tile"]))
    return on_cores(mod, copy_out, cfg)


__all__ = ["reduce_schedule"]
