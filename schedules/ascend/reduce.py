"""Row reductions (reduce_sum, reduce_max) and row softmax on the vector unit.

    FOR row tile (split over `block_dim` cores):   rows GM -> UB (MTE2, rows padded to 32 B)
      per row: vcadd / vcmax fold each 256 B repeat to one element, then fold the partials
               until one is left (fp16 sums and softmax work in fp32 after a vconv)
      softmax: max, x - max (vector_dup of the max), exp, sum, / sum, cast back
      results UB -> GM (MTE3)

Both templates take the TVM route: `reduce_tir.reduce_schedule` schedules the op's own TE
compute (row tiles, cache_read / cache_write into UB, the casts and softmax's stages as UB
stages, emit_insn pragmas, the reduction loop `vector_reduce`); `apply` returns it as a
`Scheduled` whose "reduce" lowering (the backend's `emit_reduce`) turns it into each core's
program.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, machine

ROW_TILES = (1, 2, 4, 8, 16, 32, 64)


class _RowTemplate(AscendTemplate):
    """Shared knobs and tiling of the (m, n) row kernels."""

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        rows = tuple(v for v in ROW_TILES if v <= max(wl["m"], 1)) or (1,)
        return [Knob("rows_tile", rows, "rows per UB tile"), Knob("double_buffer", (1, 0), "ping-pong UB tiles"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the rows are split over")]

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
        tiles = ceil_div(wl["m"], cfg["rows_tile"])
        cores = min(cfg["block_dim"], tiles)
        isz = np.dtype(wl.dtype).itemsize
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_read_bytes": wl["m"] * wl["n"] * isz, "tiles": tiles, "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ,
                "alignment_waste": 1 - wl["n"] / self._row_stride(wl), "fold_stages": max(1, int(np.ceil(
                    np.log(max(wl["n"], 2)) / np.log(machine(target).lanes(4)))))}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """The TVM route: the scheduled module (`reduce_tir.reduce_schedule`) for the backend's
        "reduce" lowering (`emit_reduce`: per row a vcadd / vcmax fold; softmax's stages per
        row). The rows go to GM as they are: x (m, n), the op's input."""
        from .reduce_tir import reduce_schedule

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
