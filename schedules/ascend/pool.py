"""pool2d (max / average) on the vector unit over NC1HWC0, tiled by output rows in UB.

The kernel is a TVM schedule (`pool_schedule`, below: pool2d's own compute on the NC1HWC0
view, the knobs as split factor and tile-loop annotations), returned as a `Scheduled` for the
backend's "vector" lowering (its `lower.vector`); what it issues:

    FOR plane (n, c1), output-row tile (split over `block_dim` cores):
      fill the padded input tile with the pad value (V, only when pad > 0)
      input rows GM -> UB interior (MTE2): the rows and columns the tile's windows read
      FOR output row, window tap (ky, kx): out row (op)= input row ky, columns kx + stride*j
        one instruction covers 8 output pixels per repeat: block stride = stride pixels (V)
      average: divide by the per-pixel window count (padding excluded), loaded from GM (MTE2)
      UB -> GM (MTE3)

GM layouts (host-side preprocessing): x and y as NC1HWC0 (N*C1, H, W, 16); the average's
count table (Ho, Wo, 16) is derived from the shape on the host (like a weight).

Global pooling (one window covering the whole unpadded input, of at least `ROW_TAPS` taps) is a
reduction, not a window: one instruction per tap per output row would cover a single output
pixel (16 of 128 lanes) for each of H*W taps. Such a workload is scheduled as the row reduction
it is (v2): the reduce template's TVM schedule of `reduce_mean` / `reduce_max` over the (N*C,
H*W) rows (x read ND, relaid on the host like every layout change here), lowered by
`lower.reduce` (per row a vcadd / vcmax fold, the mean's 1/(H*W) one vmuls); its knobs are the
reduce template's (`rows_tile`, `double_buffer`, `block_dim`).

The schedule (`pool_schedule`): an `s_tir.Schedule` of pool2d over NC1HWC0, lowered by the
backend's `lower.vector` (TBE style: UB tiles, pragma'd nests; nothing here emits instructions).

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

from dataclasses import replace
from functools import lru_cache
from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import pool_out_hw
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, from_5hd, machine, on_cores, to_5hd

C0 = 16
ROW_TILES = (1, 2, 4, 8, 16, 32, 64)
ROW_TAPS = 64  # a global window of this many taps or more runs as a row reduction


def row_workload(wl: Workload) -> Workload | None:
    """The row reduction a global pool is ((N*C, H*W) rows, reduce_mean / reduce_max), or None."""
    if wl["pad"] or wl["kernel"] != wl["h"] or wl["kernel"] != wl["w"] or wl["h"] * wl["w"] < ROW_TAPS:
        return None
    from opcompiler.ops import workload
    return workload("reduce_mean" if wl["mode"] == "avg" else "reduce_max",
                    {"m": wl["n"] * wl["c"], "n": wl["h"] * wl["w"]}, dtype=wl.dtype)


def _rows():
    from .reduce import AscendReduce
    return AscendReduce()


def _geo(wl: Workload):
    ho, wo = pool_out_hw(wl)
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    wp = max(wl["w"] + 2 * p, (wo - 1) * s + k)
    return ho, wo, k, s, p, wp


@register_template
class AscendPool(AscendTemplate):
    """Max / average pooling with the window taps as strided vector instructions."""

    name = "ascend.pool2d"
    op_families = ("pool",)
    version = 2  # v2: global windows of ROW_TAPS taps or more run as a row reduction

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        if (rw := row_workload(wl)) is not None:
            return _rows().space(rw, target)
        ho = pool_out_hw(wl)[0]
        rows = tuple(v for v in ROW_TILES if v < ho) + (min(v for v in ROW_TILES if v >= ho) if ho <= 64 else 64,)
        return [Knob("oh_tile", tuple(dict.fromkeys(rows)), "output rows per UB tile"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        if (rw := row_workload(wl)) is not None:
            return _rows().preferred(rw, target)
        sp = self.space(wl, target)[0].values
        return [{"oh_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(sp)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        """What the scheduled module holds in UB per slot: the tile's padded input rows and the
        columns its windows read, the output rows (and for avg the count rows)."""
        if (rw := row_workload(wl)) is not None:
            return _rows().buffers(rw, target, cfg)
        ho, wo, k, s, p, _ = _geo(wl)
        isz = np.dtype(wl.dtype).itemsize
        rt = min(cfg["oh_tile"], ho)
        rin = min((cfg["oh_tile"] - 1) * s + k, wl["h"] + 2 * p)
        wp = (wo - 1) * s + k
        out = []
        for sl in range(2 if cfg["double_buffer"] else 1):
            out += [("UB", f"in_{sl}", rin * wp * C0 * isz), ("UB", f"out_{sl}", rt * wo * C0 * isz)]
            if wl["mode"] == "avg":
                out.append(("UB", f"cnt_{sl}", rt * wo * C0 * isz))
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """pool2d through TVM: `pool_schedule` schedules the op's compute on the
        NC1HWC0 view, for the backend's "vector" lowering (`lower.vector`)."""
        if (rw := row_workload(wl)) is not None:  # a global window: the row reduction it is
            rs = _rows().apply(rw, target, cfg)
            n, c, layout = wl["n"], wl["c"], wl.layout

            def rows(inputs: list[np.ndarray]) -> list[np.ndarray]:
                x = inputs[0].transpose(0, 3, 1, 2) if layout == "NHWC" else inputs[0]
                return [np.ascontiguousarray(x.reshape(n * c, -1))]

            shape = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
            return replace(rs, host=replace(rs.host, pack=lambda inputs: rs.host.pack(rows(inputs)),
                                            unpack=lambda y: np.ascontiguousarray(y.reshape(shape))),
                           flops=get_op(wl.op).flops(wl),
                           info={**rs.info, "global_pool": f"a row reduction ({rw.op} over {n * c} rows of "
                                                            f"{wl['h'] * wl['w']})",
                                 "layout_change": "NCHW/NHWC -> (N*C, H*W) rows on the host"})
        n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
        ho, wo = pool_out_hw(wl)
        c1 = ceil_div(c, C0)
        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            gm = {"x": to_5hd(inputs[0], layout, C0).reshape(n * c1, h, w, C0)}
            if wl["mode"] == "avg":  # the average's divisor, an input of its module
                gm["count"] = count_table(wl)
            return gm

        def unpack(y: np.ndarray) -> np.ndarray:
            return from_5hd(y.reshape(n, c1, ho * wo, C0), c, ho, wo, layout)

        return Scheduled(lowering="vector", module=lambda: (pool_schedule(wl, cfg), ()),
                         host=HostLayout(pack=pack, unpack=unpack, out_dtype=wl.dtype), flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "NC1HWC0 (N*C1, H, W, 16)", "y": "NC1HWC0"},
                               "layout_change": "NCHW/NHWC <-> NC1HWC0 on the host",
                               "channel_padding_waste": round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        if (rw := row_workload(wl)) is not None:
            return _rows().features(rw, target, config)
        cfg = self.config(wl, target, config)
        ho, wo, k, s, p, wp = _geo(wl)
        isz = np.dtype(wl.dtype).itemsize
        c1 = ceil_div(wl["c"], C0)
        tiles = wl["n"] * c1 * ceil_div(ho, cfg["oh_tile"])
        rin = (cfg["oh_tile"] - 1) * s + k
        gm_read = tiles * rin * wl["w"] * C0 * isz
        gm_write = wl["n"] * c1 * ho * wo * C0 * isz
        cores = min(cfg["block_dim"], tiles)
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_read_bytes": gm_read, "gm_write_bytes": gm_write, "halo_ratio": rin / (cfg["oh_tile"] * s),
                "tiles": tiles, "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores),
                "occupancy_UB": occ, "vector_instr_per_row": k * k * (2 if isz == 4 else 1),
                "alignment_waste": 1 - wl["c"] / (c1 * C0)}


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

