"""fm_interaction (DeepFM's pairwise term) on the vector unit: one fused reduction chain.

    FOR tile of `rows_tile` samples (split over `block_dim` cores, ping-pong with `double_buffer`):
      e[tile] (rows, f, k) GM -> UB                      MTE2, one DMA (rows of k padded to 32 B)
      fp16: vconv to fp32                                V, the whole tile
      s = e[:, 0] + e[:, 1] + ... + e[:, f-1]            V, f - 1 adds, each over every sample of the
                                                         tile at once (a repeat per sample, the
                                                         repeat stride one sample's f x k values)
      e = e * e                                          V, the whole tile, in place
      q = the same field sum of the squares              V, f - 1 adds
      s * s - q; fp16: vconv back                        V
      (rows, k) UB -> GM                                 MTE3, one DMA

The fields never leave UB and e is read from GM once; the unfused chain (two transposes, two row
reductions, two squares, a subtraction) writes and reads every intermediate through GM.

`apply` returns the TVM schedule of the op's own compute (the sample loop split by rows_tile,
e cache_read into UB, every stage at the tile loop in UB, pragmas `dma_copy` / `vector_auto` /
`fm_field_sum`) for the backend's "fm" lowering (`lower.fm`), which reads the tile loop, the
stages' order and the shapes off the module.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, on_cores, spread_first, tile_knobs

ROWS_TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIELD_SUM = "fm_field_sum"  # the backend's `lower.fm.FIELD_SUM`


def _tiled(wl: Workload, rows_tile: int):
    from tvm.s_tir import Schedule

    sch = Schedule(op_prim_func(wl))
    blk = sch.get_sblock
    out = blk("fm_out")
    to, _ = sch.split(sch.get_loops(out)[0], [None, rows_tile])
    copy_out = sch.cache_write(out, 0, UB_SCOPE)
    sch.reverse_compute_at(copy_out, to, preserve_unit_loops=True)
    sch.annotate(sch.get_loops(copy_out)[1], PRAGMA, DMA_COPY)
    sch.annotate(sch.get_loops(out)[1], PRAGMA, VECTOR_AUTO)
    stages = ["fm_sumsq", "fm_sq", "fm_sum"] + (["fm_in"] if wl.dtype != "float32" else [])
    for name in stages:  # consumers first: each at the tile loop, in UB
        b = blk(name)
        sch.set_scope(b, 0, UB_SCOPE)
        # the field sum first in the tile (before the squares, which the lowering computes in place)
        sch.compute_at(b, to, preserve_unit_loops=True, index=-2 if name == "fm_sum" else -1)
        sch.annotate(sch.get_loops(b)[1], PRAGMA, FIELD_SUM if name in ("fm_sum", "fm_sumsq") else VECTOR_AUTO)
    first = blk(stages[-1])
    cr = sch.cache_read(first, 0, UB_SCOPE)  # e: GM -> UB at the tile loop, first
    sch.compute_at(cr, to, preserve_unit_loops=True, index=0)
    sch.annotate(sch.get_loops(cr)[1], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


def kpad(wl: Workload) -> int:
    """k padded to whole 32 B blocks of the input dtype (each field's row in UB)."""
    epb = 32 // np.dtype(wl.dtype).itemsize
    return ceil_div(wl["k"], epb) * epb


@register_template
class AscendFm(AscendTemplate):
    """The field sums of a tile of samples as strided vector adds, all in UB (fp32 inside)."""

    name = "ascend.fm"
    op_families = ("fm",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        rows = tuple(v for v in ROWS_TILES if v < 2 * wl["b"]) or (1,)
        return tile_knobs(target, Knob("rows_tile", rows, "samples per UB tile"),
                          "ping-pong tiles (the next tile's DMA under this one's vector work)")

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Every core busy first, then the largest tile that fits (fewer, longer instructions)."""
        return [{"rows_tile": t, "double_buffer": 1, "block_dim": target.cores}
                for t in spread_first(self.space(wl, target)[0].values, wl["b"], target.cores)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        rt, f, kp = cfg["rows_tile"], wl["f"], kpad(wl)
        isz = np.dtype(wl.dtype).itemsize
        out = []
        for s in range(2 if cfg["double_buffer"] else 1):
            if wl.dtype != "float32":
                out += [("UB", f"e_{s}", rt * f * kp * isz), ("UB", f"out_{s}", rt * kp * isz)]
            out += [("UB", f"e32_{s}", rt * f * kp * 4), ("UB", f"sum_{s}", rt * kp * 4),
                    ("UB", f"sumsq_{s}", rt * kp * 4)]
        return out

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        return {"gm_read_bytes": wl["b"] * wl["f"] * wl["k"] * isz, "gm_write_bytes": wl["b"] * wl["k"] * isz,
                **self.tile_features(wl, target, cfg, wl["b"])}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        pack = lambda ins: {"e": np.ascontiguousarray(ins[0], dtype=wl.dtype)}  # noqa: E731
        return Scheduled(lowering="fm", key=(wl.key_str(), tuple(sorted(cfg.items()))),
                         module=lambda: (on_cores(*_tiled(wl, int(cfg["rows_tile"])), cfg), ()),
                         params={"kpad": kpad(wl)},
                         host=HostLayout(pack=pack, out_dtype=wl.dtype),
                         buffers=self.buffers(wl, target, cfg), flops=float(get_op(wl.op).flops(wl)),
                         info={"gm_layouts": {"e": "ND (b, f, k)", "out": "ND (b, k)"}, "layout_change": "none"})
