"""Layer normalisation (layer_norm, add_layer_norm) on the vector unit, in fp32 whatever the dtype.

    once per core:  gamma, beta GM -> UB (MTE2), fp16: vconv to fp32
    FOR row tile (split over `block_dim` cores; ping-pong UB tiles with `double_buffer`):
      x [, r] GM -> UB (MTE2, rows padded to 32 B); fp16: vconv to fp32 [; s = x + r]
      per row: vcadd folds of s                                   -> the row sums
      the tile's rows: mean = sum * 1/n
      per row: vector_dup of the mean, d = s - mean (kept), d * d, vcadd folds -> sums of squares
      the tile's rows: var = sum * 1/n, + eps, vsqrt, vrec          -> rstd
      per row: vector_dup of rstd, d * rstd, * gamma, + beta
      fp16: vconv back; y UB -> GM (MTE3)

The statistics (mean, var, + eps, sqrt, 1 / x) are vector instructions over the tile's column of
per-row values, once per tile rather than once per row. `norm_schedule` schedules the op's own TE
compute (what `reduce.py` does for softmax: row tiles, cache_read / cache_write into UB, emit_insn
pragmas; here three row loops); the backend's "reduce" lowering (`lower.reduce`) turns it into each
core's program.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, REDUCE, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.catalogue.norm import norm_blocks
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, on_cores, tile_knobs
from .reduce import KEEP, ROW_ALIGN, ROWS

ROW_TILES = (1, 2, 4, 8, 16, 32, 64)
_WL: dict[str, Workload] = {}


@lru_cache(maxsize=128)
def _tiled(key: str, rows_tile: int):
    """(module, name of the copy-out block) for one workload and row tile."""
    from tvm.s_tir import Schedule

    wl = _WL[key]
    sch = Schedule(op_prim_func(wl))
    r = norm_blocks(sch)
    blk = sch.get_sblock
    n1 = wl["cols"] == 1
    for nm in r["pbcast"]:
        sch.compute_inline(blk(nm))
    last = r["last"]
    copy_out = sch.cache_write(blk(last), 0, UB_SCOPE)
    tiles, inner = sch.split(sch.get_loops(copy_out)[0], [None, min(rows_tile, wl["rows"])])
    sch.annotate(inner, PRAGMA, DMA_COPY)

    def at_tiles(nm: str) -> list:
        if nm != last:
            sch.set_scope(blk(nm), 0, UB_SCOPE)
        sch.compute_at(blk(nm), tiles, preserve_unit_loops=True)
        return sch.get_loops(blk(nm))

    def tile_rows(nm: str) -> None:  # one nest over the tile's aligned rows (casts, the add)
        loops = at_tiles(nm)
        sch.annotate(loops[-2], PRAGMA, VECTOR_AUTO)
        if n1:  # keep the unit column loop: the nest still walks whole aligned rows
            sch.annotate(loops[-1], KEEP, 1)
        sch.storage_align(blk(nm), 0, 0, ROW_ALIGN, 0)

    def stats(names: list) -> None:  # (rows, 1) blocks: one nest over the tile's rows
        for nm in reversed(names):
            sch.annotate(at_tiles(nm)[-2], PRAGMA, VECTOR_AUTO)

    def in_row(nm: str, loop, reverse: bool = False) -> None:
        if not reverse:
            sch.set_scope(blk(nm), 0, UB_SCOPE)
        (sch.reverse_compute_at if reverse else sch.compute_at)(blk(nm), loop, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(blk(nm))[-1], PRAGMA, REDUCE if nm in r["sums"] else VECTOR_AUTO)

    def anchor(nm: str):  # a row loop's (rows, cols) block at the tile loop: its row loop
        loops = at_tiles(nm)
        sch.annotate(loops[1], ROWS, 1)
        sch.annotate(loops[-1], PRAGMA, VECTOR_AUTO)
        sch.storage_align(blk(nm), 0, 0, ROW_ALIGN, 0)
        return sch.get_loops(blk(nm))[1]

    if r["out"]:
        tile_rows(r["out"])
    y = r["rows_c"][-1]
    ly = anchor(y)
    for nm in reversed(r["rows_c"][:-1]):
        in_row(nm, ly)
    stats(r["stats_b"])
    # the second row loop: d (kept for the third) at the tile loop, the mean's broadcast before
    # it, the squares and their sums after it, per row
    for nm in (r["sums"][1], r["sq"]):
        at_tiles(nm)
    ld = anchor(r["d"])
    for nm in reversed(r["rows_b"]):
        in_row(nm, ld)
    in_row(r["sq"], ld, reverse=True)
    in_row(r["sums"][1], ld, reverse=True)
    stats(r["stats_a"])
    loops = at_tiles(r["sums"][0])
    sch.annotate(loops[1], ROWS, 1)
    sch.annotate(loops[-1], PRAGMA, REDUCE)
    for nm in reversed(r["pre"]):
        tile_rows(nm)
    cached: set[str] = set()  # the inputs x [, r]: into UB at the tile loop, first
    for nm in r["pre"] + r["sums"][:1]:
        for i, rd in enumerate(sch.get(blk(nm)).reads):
            if len(rd.source.shape) != 2 or rd.source.name not in ("x", "r") or rd.source.name in cached:
                continue
            cached.add(rd.source.name)
            cr = sch.cache_read(blk(nm), i, UB_SCOPE)
            sch.compute_at(cr, tiles, preserve_unit_loops=True, index=0)
            sch.annotate(sch.get_loops(cr)[1], PRAGMA, DMA_COPY)
            sch.storage_align(cr, 0, 0, ROW_ALIGN, 0)
    # gamma / beta: into UB once per core, before the tile loop (fp16: cast there too)
    for nm in r["params"]:
        sch.set_scope(blk(nm), 0, UB_SCOPE)
        sch.annotate(sch.get_loops(blk(nm))[0], PRAGMA, VECTOR_AUTO)
    for nm in r["params"] or r["rows_c"]:  # (fp32: the row blocks read them)
        b = blk(nm)
        for i, buf in enumerate(sch.get(b).reads):
            if buf.source.name in ("gamma", "beta"):
                rd = sch.cache_read(b, i, UB_SCOPE)
                sch.annotate(sch.get_loops(rd)[0], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


def norm_schedule(wl: Workload, cfg: Mapping):
    """The scheduled module for this config: the tiling depends on the workload and `rows_tile`
    (cached); cores and double buffering are annotations of the tile loop."""
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _tiled(key, int(cfg["rows_tile"]))
    return on_cores(mod, copy_out, cfg)


@register_template
class AscendNorm(AscendTemplate):
    """layer_norm / add_layer_norm on the vector unit: three row loops per UB tile of rows."""

    name = "ascend.layer_norm"
    op_families = ("norm",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        rows = tuple(v for v in ROW_TILES if v <= wl["rows"]) or (1,)
        return tile_knobs(target, Knob("rows_tile", rows, "rows per UB tile"), split="AI cores the rows are split over")

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Every core busy with two tiles or more (the second overlaps the first's DMA), then the
        largest tile that fits: fewer, longer instructions per row tile."""
        tiles = self.space(wl, target)[0].values
        enough = [t for t in tiles if ceil_div(wl["rows"], t) >= 2 * target.cores]
        order = sorted(enough, reverse=True) + sorted(set(tiles) - set(enough))
        return [{"rows_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in order]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        """What `lower.reduce` allocates in UB: gamma and beta (fp16: and their fp32 casts) and the
        folds' scratch once; per ping-pong slot the tile's rows (at their 32 B aligned stride): the
        inputs, fp16: their fp32 casts, add: the sum, d, the output, fp16: its cast, and seven
        (rows, 1) fp32 statistics."""
        n, isz = wl["cols"], np.dtype(wl.dtype).itemsize
        rt, rs = min(cfg["rows_tile"], wl["rows"]), ceil_div(n, ROW_ALIGN) * ROW_ALIGN
        wide = wl.dtype != "float32"
        res = get_op(wl.op).name == "add_layer_norm"
        out = [("UB", p, n * isz) for p in ("gamma", "beta")] + [("UB", f"{p}32", n * 4) for p in ("gamma", "beta")
                                                                   if wide]
        out.append(("UB", "scratch", 2 * (ceil_div(max(rs, n), 64) + 64) * 4))
        for s in range(2 if cfg["double_buffer"] else 1):
            tile = [("x", isz)] + ([("r", isz)] if res else []) + ([("x32", 4)] + ([("r32", 4)] if res else [])
                                                                   if wide else []) + \
                ([("s", 4)] if res else []) + [("d", 4), ("y", 4)] + ([("y16", isz)] if wide else [])
            out += [("UB", f"{nm}_{s}", rt * rs * b) for nm, b in tile]
            out += [("UB", f"stat{k}_{s}", rt * 4) for k in range(7)]
        return out

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        return {"gm_read_bytes": wl["rows"] * wl["cols"] * isz, **self.tile_features(wl, target, cfg, wl["rows"]),
                "alignment_waste": 1 - wl["cols"] / (ceil_div(wl["cols"], ROW_ALIGN) * ROW_ALIGN)}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """The TVM route: the scheduled module (`norm_schedule`) for the backend's "reduce"
        lowering. The tensors go to GM as they are: x [, r] (rows, cols), gamma, beta (cols,)."""
        return Scheduled(lowering="reduce", module=lambda: (norm_schedule(wl, cfg), ()),
                         host=HostLayout(out_dtype=wl.dtype), flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "ND (rows, cols)"}, "layout_change": "none"})
