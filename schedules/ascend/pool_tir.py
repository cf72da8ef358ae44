"""The pooling template's schedule: an `s_tir.Schedule` of pool2d over NC1HWC0, lowered by the
backend's `emit_insn` (TBE style: UB tiles, pragma'd nests; nothing here emits instructions).

The compute is the catalogue op's own definition (`dsl.pool2d`: the padded input, the window
reduction, for avg the division by the number of in-image taps) applied to the NC1HWC0 view
of the input: N*C1 images of H x W pixels of 16 channels, i.e. `dsl.pool2d(x5, ..., "NHWC")`
on a (N*C1, H, W, 16) tensor. The NCHW <-> NC1HWC0 change is host-side preprocessing (as for
every Ascend vector kernel), so scheduling the 5-D compute avoids `transform_layout` (whose
padding `T.assume` blocks break `cache_read`). One change for avg: the divisor, an index
expression of the output pixel in the op, is read from a table (Ho, Wo, 16) the host derives
from the shape like a weight (`count_table`), so the kernel divides by a UB tile of it.

    output copy (cache_write, local.UB -> GM)   rows split by `oh_tile`; (plane, row tile) fused
                                                into the tile loop: opc.ascend.block_dim,
                                                opc.ascend.double_buffer; dma_copy
    padded input (pool_pad, or a cache_read of x when pad = 0)
                                                local.UB, computed at the tile loop: the rows and
                                                columns the tile's windows read; dma_copy (with
                                                pad: a fill of the tile, then the in-image box)
    window reduction                            local.UB at the tile loop; loops reordered to
                                                (row, ky, kx, pixel, channel) and the init
                                                decomposed at ky: per output row and tap one
                                                vector instruction group over the row's pixels
                                                (window stride = block stride); vector_auto
    avg: count tile (cache_read), division      local.UB at the tile loop; dma_copy / vector_auto
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops.catalogue import pool_out_hw
from opcompiler.workload import Workload

from .common import on_cores

C0 = 16
_WL: dict[str, Workload] = {}


def count_table(wl: Workload) -> np.ndarray:
    """(Ho, Wo, 16): the number of in-image taps of each output pixel's window (avg's divisor,
    padding excluded, as the op defines it)."""
    ho, wo = pool_out_hw(wl)
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    oy, ox = np.arange(ho) * s - p, np.arange(wo) * s - p
    cy = np.minimum(oy + k, wl["h"]) - np.maximum(oy, 0)
    cx = np.minimum(ox + k, wl["w"]) - np.maximum(ox, 0)
    return np.repeat((cy[:, None] * cx[None, :])[:, :, None], C0, axis=2).astype(wl.dtype)


@lru_cache(maxsize=64)
def _prim_func(key: str):
    """pool2d of the workload on its NC1HWC0 view (see the module docstring)."""
    from tvm import te

    from opcompiler import dsl

    wl = _WL[key]
    c1 = -(-wl["c"] // C0)
    x = te.placeholder((wl["n"] * c1, wl["h"], wl["w"], C0), wl.dtype, name="x")
    y = dsl.pool2d(x, wl["kernel"], wl["stride"], wl["pad"], wl["mode"], "NHWC")
    if wl["mode"] != "avg":
        return te.create_prim_func([x, y])
    total = y.op.input_tensors[0]  # the window sum; the op divides it by the in-image tap count
    ho, wo = pool_out_hw(wl)
    cnt = te.placeholder((ho, wo, C0), wl.dtype, name="count")
    y = te.compute(total.shape, lambda b, i, j, c: total[b, i, j, c] / cnt[i, j, c], name="pool2d_avg")
    return te.create_prim_func([x, cnt, y])


@lru_cache(maxsize=256)
def _tiled(key: str, oh_tile: int):
    from tvm.s_tir import Schedule

    wl = _WL[key]
    avg = wl["mode"] == "avg"
    sch = Schedule(_prim_func(key))
    pool = sch.get_sblock("pool2d")
    last = sch.get_sblock("pool2d_avg") if avg else pool
    copy_out = sch.cache_write(last, 0, UB_SCOPE)
    b, y, _, _ = sch.get_loops(copy_out)
    yo, yi = sch.split(y, [None, oh_tile])
    tiles = sch.fuse(b, yo)
    sch.annotate(yi, PRAGMA, DMA_COPY)
    if avg:
        sch.compute_at(last, tiles, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(last)[1], PRAGMA, VECTOR_AUTO)
        sch.set_scope(pool, 0, UB_SCOPE)
    sch.compute_at(pool, tiles, preserve_unit_loops=True)
    px, ch, ky, kx = sch.get_loops(pool)[-4:]
    sch.reorder(ky, kx, px, ch)
    init = sch.decompose_reduction(pool, ky)
    sch.annotate(sch.get_loops(init)[-2], PRAGMA, VECTOR_AUTO)
    sch.annotate(px, PRAGMA, VECTOR_AUTO)
    if avg:
        cnt = sch.cache_read(last, 1, UB_SCOPE)
        sch.compute_at(cnt, tiles, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(cnt)[1], PRAGMA, DMA_COPY)
    if wl["pad"] > 0:
        src = sch.get_sblock("pool_pad")
        sch.set_scope(src, 0, UB_SCOPE)
    else:
        src = sch.cache_read(pool, 1, UB_SCOPE)
    sch.compute_at(src, tiles, preserve_unit_loops=True, index=0)
    sch.annotate(sch.get_loops(src)[1], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


def pool_schedule(wl: Workload, cfg):
    """The scheduled module (IRModule) of pool2d for this config; the tiling depends on the
    workload and `oh_tile` (cached), cores and double buffering are tile-loop annotations."""
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _tiled(key, int(cfg["oh_tile"]))
    return on_cores(mod, copy_out, cfg)


__all__ = ["pool_schedule", "count_table"]
