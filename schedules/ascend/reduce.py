"""Row reductions (reduce_sum, reduce_max) and row softmax on the vector unit.

    FOR row tile (split over `block_dim` cores):   rows GM -> UB (MTE2, rows padded to 32 B)
      per row: vcadd / vcmax fold each 256 B repeat to one element, then fold the partials
               until one is left (fp16 sums and softmax work in fp32 after a vconv)
      softmax: max, x - max (vector_dup of the max), exp, sum, / sum, cast back
      results UB -> GM (MTE3)

Both templates take the TVM route: `reduce_schedule` (below) schedules the op's own TE
compute (row tiles, cache_read / cache_write into UB, the casts and softmax's stages as UB
stages, emit_insn pragmas, the reduction loop `vector_reduce`); `apply` returns it as a
`Scheduled` whose "reduce" lowering (the backend's `lower.reduce`) turns it into each core's
program.

The schedule (`reduce_schedule`): an `s_tir.Schedule` over the op's own TE compute
(reduce_sum / reduce_max / softmax over the last axis of (m, n)), lowered by the backend's
`lower.reduce` (TBE style: UB tiles of rows, pragma'd nests; nothing here emits instructions).

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

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, REDUCE, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, machine, on_cores, tile_knobs

ROW_TILES = (1, 2, 4, 8, 16, 32, 64)


class _RowTemplate(AscendTemplate):
    """Shared knobs and tiling of the (m, n) row kernels."""

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        rows = tuple(v for v in ROW_TILES if v <= max(wl["m"], 1)) or (1,)
        return tile_knobs(target, Knob("rows_tile", rows, "rows per UB tile"), split="AI cores the rows are split over")

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        return [{"rows_tile": t, "double_buffer": 1, "block_dim": target.cores}
                for t in reversed(self.space(wl, target)[0].values)]

    def _row_stride(self, wl: Workload) -> int:
        return ceil_div(wl["n"], 16) * 16

    def _work32(self, wl: Workload) -> bool:
        return wl.dtype == "float16" and (wl.op != "reduce_max")

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        rs, rt = self._row_stride(wl), cfg["rows_tile"]
        out = [("UB", "scratch", 2 * (ceil_div(rs, 64) + 64) * 4), ("UB", "scalar", 64)]
        for s in range(2 if cfg["double_buffer"] else 1):
            out.append(("UB", f"x_{s}", rt * rs * isz))
            if self._work32(wl):
                out.append(("UB", f"x32_{s}", rt * rs * 4))
            ysz = rt * rs if wl.op == "softmax" else rt + 16
            out.append(("UB", f"y_{s}", ysz * 4))
            if self._work32(wl):
                out.append(("UB", f"yo_{s}", ysz * isz))
        return out

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        return {"gm_read_bytes": wl["m"] * wl["n"] * isz, **self.tile_features(wl, target, cfg, wl["m"]),
                "alignment_waste": 1 - wl["n"] / self._row_stride(wl), "fold_stages": max(1, int(np.ceil(
                    np.log(max(wl["n"], 2)) / np.log(machine(target).lanes(4)))))}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """The TVM route: the scheduled module (`reduce_schedule`) for the backend's
        "reduce" lowering (`lower.reduce`: per row a vcadd / vcmax fold; softmax's stages per
        row). The rows go to GM as they are: x (m, n), the op's input."""
        return Scheduled(lowering="reduce", module=lambda: (reduce_schedule(wl, cfg), ()),
                         host=HostLayout(pack=lambda ins: {"x": np.ascontiguousarray(ins[0])}, out_dtype=wl.dtype),
                         flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "ND (m, n)"}, "layout_change": "none"})


@register_template
class AscendReduce(_RowTemplate):
    """reduce_sum / reduce_max over the last axis with vcadd / vcmax folds."""

    name = "ascend.reduce"
    op_families = ("reduce",)
    version = 1


@register_template
class AscendSoftmax(_RowTemplate):
    """Row softmax in fp32 on the vector unit (max, exp, sum, divide)."""

    name = "ascend.softmax"
    op_families = ("softmax",)
    version = 1


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

