"""The data-movement ops' schedules (slice, pad, transpose, concat): an `s_tir.Schedule` over
the op's own TE compute (concat's written per input), lowered by the backend's `emit_move`
(DMA boxes, TBE style: nothing here emits instructions).

Each op is a copy: the schedule views the tensors as the runs the op moves (`transform_layout`
of both sides, `transform_block_layout` of the op's block), writes the op's block into a UB
tile (`cache_write`: the block itself becomes the GM -> UB move, MTE2) and copies the tile out
(UB -> GM, MTE3); no vector work except the fill of padding.

    slice       x (outer, in-run), y (outer, run): whole rows per tile (ub_tile // run rows),
                or a row in chunks of ub_tile when a row is longer
    pad         x (n*c, h, w), y (n*c, hp, wp): tiles of whole padded rows of one plane; the
                block's `if_then_else(in image, x, fill)` is a fill of the tile (vector dup)
                then the move of the in-image box
    transpose   x (its leading axes, the run the permutation keeps in place), y (blocks, run):
                tiles of ub_tile // run output blocks, one move per block in (an instruction
                loop), one move out; a run longer than the tile goes in chunks
    concat      a block per input (x, x1 copied into their channel ranges of the output) under
                the image loop, all as (image, run); each input's run in tiles of ub_tile (a
                tile loop per input, `opc.ascend.item_tiles`), the tile read into UB
                (cache_read) and copied out; the image loop carries the cores and buffering,
                its tile loops' iterations in order are the items (`emit_move`)

The tile loop carries opc.ascend.block_dim and opc.ascend.double_buffer; the tiled module
depends on the workload and ub_tile only (cached), cores and buffering are annotations added
per config.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from opcompiler.ops.concat_blocks import concat_per_input
from opcompiler.backend.ascend.intrin import DMA_COPY, ITEM_TILES, PRAGMA, UB_SCOPE
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.ops.catalogue import slice_geometry, transpose_dims
from opcompiler.workload import Workload

from .common import on_cores

_WL: dict[str, Workload] = {}
MAX_SINGLE_RUNS = 65536  # a transpose moving the innermost axis: at most this many one-element moves


def _fused(shape, groups):
    """IndexMap of `shape` onto one axis per group of consecutive axes (empty groups dropped)."""
    from tvm.tirx import IndexMap

    groups = [list(g) for g in groups if len(g)]

    def m(*i):
        out = []
        for g in groups:
            v = i[g[0]]
            for k in g[1:]:
                v = v * int(shape[k]) + i[k]
            out.append(v)
        return out

    return IndexMap.from_func(m, ndim=len(shape), index_dtype="int32")


def transpose_geometry(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...], int, int, int]:
    """(dims, perm, t, blocks, run): the last t axes stay in place and form runs of `run`
    contiguous elements; `blocks` runs in all. Refuses a permutation that moves the innermost
    axis when that means more than MAX_SINGLE_RUNS single-element moves."""
    dims, perm = transpose_dims(wl)
    rank = len(dims)
    t = 0
    while t < rank and perm[rank - 1 - t] == rank - 1 - t:
        t += 1
    run = int(np.prod(dims[rank - t:], dtype=np.int64))
    blocks = int(np.prod(dims[:rank - t], dtype=np.int64))
    if run < 8 and blocks > MAX_SINGLE_RUNS:
        raise OpcError(f"this transpose moves the innermost axis: {blocks} runs of {run} element(s)", arg="perm",
                       value=wl["perm"], expected="a permutation that keeps the last axis (or --fallback cpu)")
    return dims, perm, t, blocks, run


def check(wl: Workload, cfg: Mapping) -> None:
    """The bad-input refusals of the data-movement kernels (clear OpcErrors)."""
    if wl.op == "transpose":
        transpose_geometry(wl)
    elif wl.op == "pad":
        wp = (wl["w"] + wl["pl"] + wl["pr"]) * (wl["c"] if wl.layout == "NHWC" else 1)
        if wp > cfg["ub_tile"]:
            raise OpcError(f"one padded row ({wp} elements) does not fit the UB tile", arg="ub_tile",
                           value=cfg["ub_tile"], expected=f">= {wp}")


def logical_out_shape(wl: Workload) -> tuple[int, ...]:
    """The op's output shape (what the host unpacks the GM view into)."""
    if wl.op == "slice":
        dims = list(slice_geometry(wl)[0])
        dims[wl["axis"]] = wl["end"] - wl["start"]
        return tuple(dims)
    if wl.op == "transpose":
        dims, perm = transpose_dims(wl)
        return tuple(dims[p] for p in perm)
    n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
    if wl.op == "concat":
        return n, c + wl["c1"], h, w
    hp, wp = h + wl["pt"] + wl["pb"], w + wl["pl"] + wl["pr"]
    return (n, hp, wp, c) if wl.layout == "NHWC" else (n, c, hp, wp)


def move_schedule(wl: Workload, cfg: Mapping):
    """The scheduled module (IRModule) of a data-movement op for this config."""
    if wl.op == "concat":
        return concat_schedule(wl, cfg)
    check(wl, cfg)
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _tiled(key, int(cfg["ub_tile"]))
    return on_cores(mod, copy_out, cfg)


def _rows_or_chunks(sch, loops, rows: int, run: int, tile: int):
    """The copy-out loop nest (rows, run) cut into tiles: whole rows (tile // run of them) when
    a row fits the tile, else each row in chunks of `tile`. Returns (tile loop, first loop of
    the tile's nest)."""
    if len(loops) == 1:  # one row
        to, ti = sch.split(loops[0], [None, min(run, tile)])
        return to, ti
    o, r = loops
    if run <= tile:
        to, ti = sch.split(o, [None, min(rows, tile // run)])
        return to, ti
    ro, ri = sch.split(r, [None, tile])
    return sch.fuse(o, ro), ri


@lru_cache(maxsize=256)
def _tiled(key: str, tile: int):
    from tvm.s_tir import Schedule

    wl = _WL[key]
    sch = Schedule(op_prim_func(_WL[key]))
    op = wl.op
    blk = sch.get_sblock({"slice": "slice", "pad": "pad_out", "transpose": "transpose"}[op])
    if op == "slice":
        dims, outer, _, run = slice_geometry(wl)
        a = wl["axis"]
        oshape = list(dims)
        oshape[a] = wl["end"] - wl["start"]
        sch.transform_layout(blk, ("read", 0), _fused(dims, [range(a), range(a, len(dims))]))
        omap = _fused(oshape, [range(a), range(a, len(dims))])
        sch.transform_layout(blk, ("write", 0), omap)
        sch.transform_block_layout(blk, omap)
        rows = outer
    elif op == "pad":
        n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
        hp, wp = h + wl["pt"] + wl["pb"], w + wl["pl"] + wl["pr"]
        if wl.layout == "NHWC":  # (n, h, w*c): a padded row is wp pixels of c channels
            groups, ishape, oshape, wp = [[0], [1], [2, 3]], (n, h, w, c), (n, hp, wp, c), wp * c
        else:  # (n*c, h, w): planes of rows
            groups, ishape, oshape = [[0, 1], [2], [3]], (n, c, h, w), (n, c, hp, wp)
        sch.transform_layout(blk, ("read", 0), _fused(ishape, groups))
        omap = _fused(oshape, groups)
        sch.transform_layout(blk, ("write", 0), omap)
        sch.transform_block_layout(blk, omap)
    else:
        dims, perm, t, blocks, run = transpose_geometry(wl)
        rank = len(dims)
        sch.transform_layout(blk, ("read", 0), _fused(dims, [[k] for k in range(rank - t)] + [range(rank - t, rank)]))
        oshape = [dims[p] for p in perm]
        omap = _fused(oshape, [range(rank - t), range(rank - t, rank)])
        sch.transform_layout(blk, ("write", 0), omap)
        sch.transform_block_layout(blk, omap)
        rows = blocks
    copy_out = sch.cache_write(blk, 0, UB_SCOPE)
    loops = sch.get_loops(copy_out)
    if op == "pad":
        p, i, _ = loops
        io, ii = sch.split(i, [None, min(hp, tile // wp)])
        tiles, first = sch.fuse(p, io), ii
    elif op == "transpose" and t == 0:  # y is (blocks,): tiles of ub_tile runs of one element
        tiles, first = sch.split(loops[0], [None, min(blocks, tile)])
    else:
        tiles, first = _rows_or_chunks(sch, loops, rows, run, tile)
    sch.annotate(first, PRAGMA, DMA_COPY)
    sch.compute_at(blk, tiles, preserve_unit_loops=True)
    inner = sch.get_loops(blk)[1:]
    if op == "transpose" and len(inner) == 2 and run <= tile:
        sch.annotate(inner[1], PRAGMA, DMA_COPY)  # one move per block: the block loop is an instruction loop
    elif op == "transpose" and len(inner) == 1 and blocks > 1 and run == 1:
        _, unit = sch.split(inner[0], [None, 1])  # runs of one element: one move each
        sch.annotate(unit, PRAGMA, DMA_COPY)
    else:
        sch.annotate(inner[0], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


concat_func = concat_per_input  # (n, C, C1, H, W, dtype): the per-input PrimFunc


@lru_cache(maxsize=256)
def _concat_tiled(key: str, tile: int):
    """x, x1 and the output as (image, run); per image each input's run in tiles of `tile`
    (a tile loop per input, in sequence: x's tiles then x1's, as the retired emitter listed its
    units), the tile read into UB (cache_read: MTE2) and the block's copy out of it (MTE3)."""
    from tvm.s_tir import Schedule

    wl = _WL[key]
    H, W = int(wl["h"]), int(wl["w"])
    sch = Schedule(concat_func(int(wl["n"]), int(wl["c"]), int(wl["c1"]), H, W, wl.dtype))
    flat = lambda b, c, y, x: [b, (c * H + y) * W + x]  # noqa: E731
    for nm, io in (("x", ("read", 0)), ("x", ("write", 0)), ("x1", ("read", 0))):
        sch.transform_layout(sch.get_sblock(nm), io, flat)
    for nm, c in (("x", int(wl["c"])), ("x1", int(wl["c1"]))):
        blk = sch.get_sblock(nm)
        tiles, inner = sch.split(sch.get_loops(blk)[1], [None, min(tile, c * H * W)])
        sch.annotate(tiles, ITEM_TILES, 1)
        sch.annotate(inner, PRAGMA, DMA_COPY)
        rb = sch.cache_read(blk, 0, UB_SCOPE)
        sch.compute_at(rb, tiles, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(rb)[2], PRAGMA, DMA_COPY)
    return sch.mod


def concat_schedule(wl: Workload, cfg: Mapping):
    """The scheduled module of concat: the image loop carries the cores and buffering (its tile
    loops' iterations, in order, are the items the cores share)."""
    key = wl.key_str()
    _WL[key] = wl
    return on_cores(_concat_tiled(key, int(cfg["ub_tile"])), "x", cfg)  # the image loop


__all__ = ["concat_func", "concat_schedule", "move_schedule", "transpose_geometry", "check", "logical_out_shape"]
