"""The element-wise template's schedule: an `s_tir.Schedule` over the op's own TE compute.

TBE schedules a vector op by tiling the output into UB-sized pieces, reading the inputs into UB
(`cache_read`), keeping every intermediate stage in UB and computing it at the tile loop, and
marking each loop nest with an `emit_insn` pragma; the backend's `emit_insn` lowering turns each
nest into one DMA or vector instruction. This is that schedule for flat chains (relu, add,
add_relu without broadcast, ew_chain of relu / sigmoid / clip / affine / pow / add / mul):

    broadcast_scalar stages (clip bounds)   compute_inline: they become instruction immediates
    every stage                             laid out flat (transform_block_layout / transform_layout):
                                            the tensor streams in its own layout, as one run
    output                                  cache_write into local.UB; the copy-out loop is split
                                            into [tiles, ub_tile] (a `where` guards the last tile)
    intermediate stages                     set_scope local.UB, compute_at the tile loop
    inputs                                  cache_read into local.UB, compute_at the tile loop (first)
    tile loop                               annotated opc.ascend.block_dim (cores share its
                                            iterations) and opc.ascend.double_buffer (ping-pong)
    nests                                   pragma_emit_insn = dma_copy (GM <-> UB) or vector_auto

The backend's `emit_insn` lowers the module; nothing here emits instructions.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.workload import Workload

from .common import on_cores

_WL: dict[str, Workload] = {}  # workload key -> workload (the caches below are keyed by the key string)


def _folded(name: str) -> bool:
    """Stages a schedule folds into their consumers (no vector work of their own): scalar
    broadcasts (clip bounds) become instruction immediates; views and broadcasts of operands."""
    return name.startswith("broadcast") or name.endswith("_view")


def flat_schedule(wl: Workload, cfg: Mapping, inline: bool = False):
    """The scheduled module (an IRModule) of a flat chain for this config. `inline=True` folds
    every stage into the last one (one nest holding the whole expression: the lowering then
    decomposes it into vector instructions on UB temporaries). The tiled schedule depends on the
    workload and `ub_tile` only and is cached; cores and double buffering are annotations of
    its tile loop, added per config."""
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _tiled(key, int(cfg["ub_tile"]), bool(inline))
    return on_cores(mod, copy_out, cfg)


@lru_cache(maxsize=256)
def _tiled(key: str, ub_tile: int, inline: bool):
    """(module, name of the copy-out block): the schedule of one workload and UB tile size."""
    from tvm.s_tir import Schedule

    sch = Schedule(op_prim_func(_WL[key]))
    wl_op = _WL[key].op
    params = list(sch.mod["main"].params)

    def in_gm(buf) -> bool:
        # by identity, not name: a repeated step (`add;add`) gives an intermediate buffer the
        # output's name. The function's buffers are re-read: transform_layout replaces them.
        return any(buf.same_as(g) for g in sch.mod["main"].params)
    root = sch.get_sblock("root")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    for nm in names:
        if _folded(nm):
            sch.compute_inline(sch.get_sblock(nm))
    names = [nm for nm in names if not _folded(nm)]
    shape = [int(s) for s in params[-1].shape]
    total = int(np.prod(shape))
    if len(shape) != 4:
        raise OpcError(f"the flat element-wise schedule takes rank-4 tensors, not {shape}", arg="op", value=wl_op)
    _, d1, d2, d3 = shape

    def flat_map(a, b, c, d):
        return [((a * d1 + b) * d2 + c) * d3 + d]

    for nm in names:
        for r in sch.get(sch.get_sblock(nm)).reads:
            if tuple(int(s) for s in r.source.shape) != tuple(shape):
                raise OpcError(f"stage {nm} reads {r.source.name} of shape {list(r.source.shape)} (a broadcast): "
                               f"not a flat chain", arg="op", value=wl_op)
    for nm in names:
        b = sch.get_sblock(nm)
        blk = sch.get(b)
        for i, r in enumerate(blk.reads):  # parameters here; a stage's buffer goes with its producer
            if in_gm(r.source) and len(r.source.shape) == len(shape):  # not yet flat
                sch.transform_layout(b, ("read", i), flat_map)
        sch.transform_layout(b, ("write", 0), flat_map)
        sch.transform_block_layout(b, flat_map)
    if inline:
        for nm in names[:-1]:
            sch.compute_inline(sch.get_sblock(nm))
        names = names[-1:]
    last = sch.get_sblock(names[-1])
    copy_out = sch.cache_write(last, 0, UB_SCOPE)
    reads, seen = [], []
    for nm in names:
        b = sch.get_sblock(nm)
        for i, r in enumerate(sch.get(b).reads):
            if in_gm(r.source) and not any(r.source.same_as(x) for x in seen):
                seen.append(r.source)
                reads.append((r.source.name, sch.cache_read(b, i, UB_SCOPE)))
    for nm in names[:-1]:
        sch.set_scope(sch.get_sblock(nm), 0, UB_SCOPE)
    loop, = sch.get_loops(copy_out)
    tile = min(ub_tile, total)
    tiles, inner = sch.split(loop, [None, tile])
    sch.annotate(inner, PRAGMA, DMA_COPY)
    for nm in reversed(names):
        b = sch.get_sblock(nm)
        sch.compute_at(b, tiles, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(b)[-1], PRAGMA, VECTOR_AUTO)
    for _, b in reversed(reads):
        sch.compute_at(b, tiles, preserve_unit_loops=True, index=0)
        sch.annotate(sch.get_loops(b)[-1], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


__all__ = ["flat_schedule"]
