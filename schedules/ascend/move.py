"""The data-movement ops' schedules (slice, pad, transpose, concat): an `s_tir.Schedule` over
the op's own TE compute (concat's written per input), lowered by the backend's `lower.move`
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
    transpose   x and y as the permutation with its size-1 axes dropped and the axes that stay
                adjacent merged. Keeping the innermost axis (x's last group stays last, a run of
                `run` elements): the op's block writes a UB tile laid out as y (a box of y's
                leading axes x the run, at most ub_tile elements, `runs_tile`) and the tile leaves
                in one move (MTE3). The block is the move in (MTE2), by strided DMAs: y's leading
                axes whose x axes come in the same order (a chain) and the run are one DMA that
                gathers those runs from x into the tile (both boxes in one C order; a burst per
                run on the side where they are apart), the tile's other axes an instruction loop
                around it (one DMA each). A run longer than the tile: y as (blocks, run), each
                run in chunks of the tile, one move in and one out (a plain copy, when only size-1
                axes move: tiles of the one run). Moving it (the real chip's way, TBE's
                vnchwconv transposes): a tile is a box of x (rows of the axis that becomes y's
                innermost x columns of x's innermost, whole where they fit, and a range of one
                batch axis when a whole slice fits) read into UB (cache_read: MTE2, runs of whole
                rows), the op's block is the transpose UB -> UB (`vector_transpose`: vnchwconv on
                16 x 32 B blocks, the lowering pads the rows to 16 and the columns to 32 B) and
                the transposed tile is copied out (MTE3); the tile read in and its transposed
                copy share the ub_tile elements of a slot (half each, padding included)
    concat      a block per input (x, x1 copied into their channel ranges of the output) under
                the image loop, all as (image, run); each input's run in tiles of ub_tile (a
                tile loop per input, `opc.ascend.item_tiles`), the tile read into UB
                (cache_read) and copied out; the image loop carries the cores and buffering,
                its tile loops' iterations in order are the items (`lower.move`)

The tile loop carries opc.ascend.block_dim and opc.ascend.double_buffer; the tiled module
depends on the workload and ub_tile only (cached), cores and buffering are annotations added
per config.
"""
from __future__ import annotations

from functools import lru_cache
from math import isqrt
from typing import Mapping, NamedTuple

import numpy as np

from opcompiler.ops.concat_blocks import concat_per_input
from opcompiler.backend.ascend.intrin import DMA_COPY, ITEM_TILES, PRAGMA, UB_SCOPE, VEC_TRANSPOSE
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.ops.catalogue import slice_geometry, transpose_dims
from opcompiler.workload import Workload

from .common import on_cores

_WL: dict[str, Workload] = {}
MAX_SINGLE_RUNS = 65536  # a transpose keeping a run under 8 elements in place: at most this many runs
TRANS_ROWS = 16  # vnchwconv's block: 16 rows of one 32 B block; its tile's rows pad to this
LONG_RUN = 128  # a tile keeps whole rows (of either side) when at least this many of the others fit


def _fused(shape, groups):
    """IndexMap of `shape` onto one axis per group of axes (empty groups dropped; a size-1 axis
    may join any group: its index is always 0)."""
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


class TransposeGeometry(NamedTuple):
    """How a transpose moves: the views of x and y (`x_groups`, `y_groups`: the axes fused into
    each view axis; `sizes` the x view's axes, `order` the x view axis at each y view position)
    and either runs kept in place (`vector` False: `blocks` runs of `run` elements, x's last view
    axis stays last) or a vector transpose (`vector` True: x's last axis moves)."""

    x_groups: list
    y_groups: list
    vector: bool
    blocks: int
    run: int
    sizes: tuple[int, ...] = ()
    order: tuple[int, ...] = ()


def _with_ones(groups: list[list[int]], ones: list[int]) -> list[list[int]]:
    """`groups` with the size-1 axes `ones` joined to the first non-empty group."""
    out = [list(g) for g in groups]
    k = next((i for i, g in enumerate(out) if g), None)
    if k is None:
        return [ones]
    out[k] = ones + out[k]
    return out


def transpose_geometry(wl: Workload) -> TransposeGeometry:
    """The permutation with its size-1 axes dropped and the source axes that stay adjacent, in
    order, in the output merged: x viewed as those groups in source order (`sizes`), y as the same
    groups in output order (`order`). When x's last group stays last it is a kept run (`vector`
    False: `blocks` runs of `run` elements, moved by strided DMAs, `runs_tile`), else the vector
    transpose's. Refuses runs under 8 elements kept in place when that means more than
    MAX_SINGLE_RUNS runs."""
    dims, perm = transpose_dims(wl)
    rank = len(dims)
    kept = [k for k in range(rank) if dims[k] > 1]
    merged: list[list[int]] = []  # in output order
    for k in (k for k in perm if dims[k] > 1):
        if merged and kept.index(k) == kept.index(merged[-1][-1]) + 1:
            merged[-1].append(k)
        else:
            merged.append([k])
    src = sorted(merged)
    order = tuple(src.index(m) for m in merged)
    sizes = tuple(int(np.prod([dims[k] for k in m])) for m in src)
    ones_x = [k for k in range(rank) if dims[k] == 1]
    ones_y = [j for j in range(rank) if dims[perm[j]] == 1]
    x_groups = _with_ones(src, ones_x)
    out_pos = [[perm.index(k) for k in m] for m in merged]
    y_groups = _with_ones(out_pos, ones_y)
    if len(src) > 1 and order[-1] != len(src) - 1:
        g = TransposeGeometry(x_groups, y_groups, True, 0, 0, sizes, order)
    else:  # x's last group stays last: a kept run (a plain copy when nothing else moves)
        g = TransposeGeometry(x_groups, y_groups, False, int(np.prod(sizes[:-1], dtype=np.int64)),
                              sizes[-1] if sizes else 1, sizes, order)
    if not g.vector and g.run < 8 and g.blocks > MAX_SINGLE_RUNS:
        raise OpcError(f"this transpose keeps runs of {g.run} element(s) in place: {g.blocks} runs, a DMA burst each",
                       arg="perm", value=wl["perm"], expected="longer kept runs (or --fallback cpu)")
    return g


def runs_tile(sizes: tuple[int, ...], order: tuple[int, ...], tile: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A kept-run transpose's tile: (the extent along each of y's leading axes, the y positions
    one strided DMA gathers). y's leading axes (output order) whose x axes come in the same
    order form a chain: a DMA moves the box of a chain x the run in one instruction (x side and
    the UB tile, laid out as y, in the same C order), the tile's other axes are an instruction
    loop. The chain taken is the one that leaves the fewest DMAs in over the tensor; the tile
    (at most tile // run runs) takes it whole where it fits, from its innermost axis out, then
    the other axes, innermost first (fewer tiles: fewer moves out)."""
    n = len(sizes) - 1
    y = [sizes[order[k]] for k in range(n)]
    budget = max(1, tile // sizes[-1])
    best = None
    for mask in range(1, 1 << n):
        chain = [k for k in range(n) if mask >> k & 1]
        if any(order[a] > order[b] for a, b in zip(chain, chain[1:])):
            continue
        ext, rem = [1] * n, budget
        for ks in (chain[::-1], [k for k in reversed(range(n)) if k not in chain]):
            for k in ks:
                ext[k] = max(1, min(y[k], rem))
                rem //= ext[k]
                if ext[k] < y[k]:
                    rem = 1
        nt = [-(-y[k] // ext[k]) for k in range(n)]
        moves_in = int(np.prod([nt[k] if k in chain else y[k] for k in range(n)], dtype=np.int64))
        key = (moves_in, int(np.prod(nt, dtype=np.int64)), -len(chain))
        if best is None or key < best[0]:
            best = (key, tuple(ext), tuple(chain))
    return best[1], best[2]


def _box_runs(shape: tuple[int, ...], ext: tuple[int, ...]) -> int:
    """Contiguous runs of a box of extents `ext` in a C-ordered array of `shape`."""
    run = 1
    for n, e in zip(reversed(shape), reversed(ext)):
        run *= e
        if e != n:
            break
    return int(np.prod(ext)) // run


def vector_tile(sizes: tuple[int, ...], order: tuple[int, ...], itemsize: int, tile: int) -> tuple[int, ...]:
    """The extent of one tile along each x view axis for a vector transpose: rows R (the axis
    that becomes y's innermost) x columns C (x's innermost), each buffer (the tile read in, its
    transposed copy) at most tile // 2 elements with R padded to 16 and C to a 32 B block. The
    whole R x C slice when it fits (and then a range of the batch axis whose box moves in the
    fewest runs); else whole rows of one side when LONG_RUN of the other fit; else a square."""
    n = len(sizes)
    rows, cols = order[-1], n - 1
    budget = tile // 2
    epb = 32 // itemsize
    pr = lambda v: -(-v // TRANS_ROWS) * TRANS_ROWS  # noqa: E731
    pc = lambda v: -(-v // epb) * epb  # noqa: E731
    nr, nc = sizes[rows], sizes[cols]
    if pr(nr) * pc(nc) <= budget:
        tr, tc = nr, nc
    elif pc(nc) * min(pr(nr), LONG_RUN) <= budget:
        tr, tc = min(nr, budget // pc(nc) // TRANS_ROWS * TRANS_ROWS), nc
    elif pr(nr) * min(pc(nc), LONG_RUN) <= budget:
        tr, tc = nr, min(nc, budget // pr(nr) // epb * epb)
    else:
        tr = min(nr, max(TRANS_ROWS, isqrt(budget) // TRANS_ROWS * TRANS_ROWS))
        tc = min(nc, budget // pr(tr) // epb * epb)
    ext = [1] * n
    ext[rows], ext[cols] = tr, tc
    if (tr, tc) == (nr, nc):
        fit = budget // (pr(nr) * pc(nc))
        best = None
        yshape = tuple(sizes[k] for k in order)
        for b in range(n):
            nb = min(sizes[b], fit)
            if b in (rows, cols) or nb < 2:
                continue
            e = list(ext)
            e[b] = nb
            cost = (_box_runs(sizes, tuple(e)) + _box_runs(yshape, tuple(e[k] for k in order))) / nb
            if best is None or cost < best[0]:
                best = (cost, e)
        if best is not None:
            ext = best[1]
    return tuple(ext)


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
        dims, perm = transpose_dims(wl)
        g = transpose_geometry(wl)
        strided = not g.vector and len(g.sizes) > 1 and g.run <= tile
        # a run longer than the tile (in chunks) or a plain copy: y as (blocks, run)
        y_groups = g.y_groups if g.vector or strided else [sum(g.y_groups[:-1], []), g.y_groups[-1]]
        sch.transform_layout(blk, ("read", 0), _fused(dims, g.x_groups))
        omap = _fused([dims[p] for p in perm], y_groups)
        sch.transform_layout(blk, ("write", 0), omap)
        sch.transform_block_layout(blk, omap)
        if g.vector:
            return _vector_transpose(sch, blk, g, np.dtype(wl.dtype).itemsize, tile)
        if strided:
            return _strided_runs(sch, blk, g, tile)
        rows, run = g.blocks, g.run
    copy_out = sch.cache_write(blk, 0, UB_SCOPE)
    loops = sch.get_loops(copy_out)
    if op == "pad":
        p, i, _ = loops
        io, ii = sch.split(i, [None, min(hp, tile // wp)])
        tiles, first = sch.fuse(p, io), ii
    else:
        tiles, first = _rows_or_chunks(sch, loops, rows, run, tile)
    sch.annotate(first, PRAGMA, DMA_COPY)
    sch.compute_at(blk, tiles, preserve_unit_loops=True)
    sch.annotate(sch.get_loops(blk)[1], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


def _tile_loops(sch, loops, exts, sizes, tail=()):
    """The copy-out's `loops` split by a tile's extents `exts` (of `sizes`): a loop the tile covers
    whole stays inside, one of extent 1 in the tile goes outside, any other is split; the outer
    loops (at least one) fused into the tile loop, the inner ones (then `tail`) under it, the
    first inner loop the copy's DMA. Returns the tile loop."""
    outer, inner = [], []
    for lp, e, n in zip(loops, exts, sizes):
        if e == n:
            inner.append(lp)
        elif e == 1:
            outer.append(lp)
        else:
            o, i = sch.split(lp, [None, e])
            outer.append(o)
            inner.append(i)
    inner += list(tail)
    if not outer:  # one tile
        o, inner[0] = sch.split(inner[0], [1, None])
        outer = [o]
    sch.reorder(*outer, *inner)
    tiles = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.annotate(inner[0], PRAGMA, DMA_COPY)
    return tiles


def _strided_runs(sch, blk, g: TransposeGeometry, tile: int):
    """A kept-run transpose: the op's block writes a UB tile laid out as y (cache_write) and the
    tile is copied out in one move; the copy-out loops (y's leading axes, the run) split by the
    tile's extents (`runs_tile`), the tiles' loops fused outermost into the tile loop. Inside a
    tile the block's loops over the chain's axes and the run are one DMA (a strided gather: x's
    box in, the tile's box, in the same C order), its other loops an instruction loop outside."""
    ext, chain = runs_tile(g.sizes, g.order, tile)
    ylead = [g.sizes[k] for k in g.order[:-1]]
    copy_out = sch.cache_write(blk, 0, UB_SCOPE)
    loops = sch.get_loops(copy_out)
    tiles = _tile_loops(sch, loops[:-1], ext, ylead, loops[-1:])
    sch.compute_at(blk, tiles, preserve_unit_loops=True)
    bl = sch.get_loops(blk)[1:]  # y's leading axes within the tile, the run
    rest = [bl[k] for k in range(len(ylead)) if k not in chain]
    nest = [bl[k] for k in chain] + [bl[-1]]
    sch.reorder(*rest, *nest)
    sch.annotate(nest[0], PRAGMA, DMA_COPY)  # the others: an instruction loop, one DMA each
    return sch.mod, sch.get(copy_out).name_hint


def _vector_transpose(sch, blk, g: TransposeGeometry, itemsize: int, tile: int):
    """x's tile read into UB (cache_read), the op's block the transpose UB -> UB (`vector_transpose`),
    the transposed tile copied out (cache_write); the copy-out loops (y's order) split by the
    tile's extents (`vector_tile`), the tiles' loops fused outermost into the tile loop."""
    ext = vector_tile(g.sizes, g.order, itemsize, tile)
    x_in = sch.cache_read(blk, 0, UB_SCOPE)
    copy_out = sch.cache_write(blk, 0, UB_SCOPE)
    tiles = _tile_loops(sch, sch.get_loops(copy_out), [ext[k] for k in g.order], [g.sizes[k] for k in g.order])
    sch.compute_at(blk, tiles, preserve_unit_loops=True)
    sch.compute_at(x_in, tiles, preserve_unit_loops=True)
    sch.annotate(sch.get_loops(blk)[1], PRAGMA, VEC_TRANSPOSE)
    sch.annotate(sch.get_loops(x_in)[1], PRAGMA, DMA_COPY)
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


__all__ = ["concat_func", "concat_schedule", "move_schedule", "transpose_geometry", "vector_tile", "runs_tile",
           "TransposeGeometry", "check", "logical_out_shape"]
