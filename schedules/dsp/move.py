"""Data movement (slice, pad, transpose, concat) as the TVM schedules the DSP simulator executes.

Built over the op's own TE compute, with the templates' knobs as schedule primitives and
annotations:

    slice       transform_layout / transform_block_layout to (outer blocks, run): each block's
                range is one contiguous run of x and of the output; the run split by `tile`; the
                block loop and the tile loop fused: the stage loop (opc.dsp.stage, opc.dsp.cores:
                contiguous shares of items)
    transpose   x and the output reshaped to the permutation's canonical form (unit axes dropped,
                neighbours merged: `transpose.canonical`); the output axis the tile splits split
                by its count, it and the axes before it fused into the stage loop: a tile is a box
                of the output, one strided view of x
    path=ddr    the copy nest under the stage (opc.dsp.op = "dma"): one DDR -> DDR descriptor
    path=am     the copy computed into a local.AM tile at the stage (cache_write: the DMA-in,
                gathering for transpose), the tile's write-back the DMA-out; `dbuf`: two slots
    pad         (planes, rows, columns): NCHW (n*c, h, w), NHWC (n, h, w*c); planes split by
                `planes`, output rows by `rows`, the outer loops fused into the stage loop; the
                pad block (its if_then_else: the input or the fill value) computed into the AM
                tile of whole output rows (a dma nest: the input box copied, the padding filled
                by vector stores), written back whole
    concat      the compute per input (a block copying x, one copying x1 into its channel range,
                under one image loop), each input's run split by `tile`: two stage loops in
                sequence per image; the image loop (opc.dsp.items) shared over the cores as
                one list of stages; path=am reads the tile into AM (cache_read)

The backend's data-movement lowering (`tir_move`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, ITEMS, OP, SCOPE_AM, STAGE, machine
from opcompiler.ops import op_prim_func
from opcompiler.ops.catalogue import slice_geometry, transpose_dims
from opcompiler.ops.concat_blocks import concat_per_input
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from . import stream

_WL: dict[str, Workload] = {}


def _schedule(wl: Workload):
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    return tvm.s_tir.Schedule(op_prim_func(_WL[key]))


def _flat(ix, dims):
    if not ix:
        return 0
    e = ix[0]
    for i, d in zip(ix[1:], dims[1:]):
        e = e * d + i
    return e


def _imap(fn, ndim: int):
    """`fn(*indices)` as a function of exactly `ndim` named arguments (what transform_layout reads)."""
    args = ", ".join(f"i{d}" for d in range(ndim))
    return eval(f"lambda {args}: fn({args})", {"fn": fn})  # our own generated source


def _stage_nests(sch, blk, stage, staged: bool, depth: int):
    """The stage loop annotated; with `staged` the block computed into an AM tile at the stage
    (cache_write: the block is the DMA-in, the tile's write-back the DMA-out); every copy nest
    under the stage annotated dma (`depth`: loops down to the stage)."""
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    if staged:
        wb = sch.cache_write(blk, 0, SCOPE_AM)
        sch.reverse_compute_at(wb, stage, preserve_unit_loops=True)
        sch.annotate(sch.get_loops(wb)[depth], OP, DMA)
    sch.annotate(sch.get_loops(blk)[depth], OP, DMA)
    return sch


def slice_schedule(wl: Workload, tile: int, staged: bool):
    dims, outer, _, run = slice_geometry(wl)
    a = int(wl["axis"])
    odims = list(dims)
    odims[a] = int(wl["end"]) - int(wl["start"])
    sch = _schedule(wl)
    blk = sch.get_sblock("slice")
    nd = len(dims)
    if a:  # (outer blocks, run)
        mo = _imap(lambda *i: [_flat(i[:a], odims[:a]), _flat(i[a:], odims[a:])], nd)
        mx = _imap(lambda *i: [_flat(i[:a], dims[:a]), _flat(i[a:], dims[a:])], nd)
    else:  # one block
        mo = _imap(lambda *i: [_flat(i, odims)], nd)
        mx = _imap(lambda *i: [_flat(i, dims)], nd)
    sch.transform_layout(blk, ("read", 0), mx)
    sch.transform_layout(blk, ("write", 0), mo)
    sch.transform_block_layout(blk, mo)
    loops = sch.get_loops(blk)
    so, _ = sch.split(loops[-1], [None, min(tile, run)])
    stage = sch.fuse(loops[0], so) if a else so
    return _stage_nests(sch, blk, stage, staged, 1)


def pad_schedule(wl: Workload, planes: int, rows: int):
    """(planes, rows, columns): the output tile of `planes` x `rows` output rows computed in AM (the
    pad block: its copy of the input and its fills), written back whole; planes and rows split,
    their outer loops fused into the stage loop. NCHW is viewed as (n*c, h, w), NHWC as
    (n, h, w*c): the compute's axes in their own order, the planes and the columns each one
    contiguous run of fused axes (`pad._Geo` counts items in the same view)."""
    C = int(wl["c"])
    sch = _schedule(wl)
    blk = sch.get_sblock("pad_out")
    if wl.layout == "NCHW":
        f4 = lambda b, c, y, x: [b * C + c, y, x]  # noqa: E731
    else:
        f4 = lambda b, y, x, c: [b, y, x * C + c]  # noqa: E731
    sch.transform_layout(blk, ("read", 0), f4)
    sch.transform_layout(blk, ("write", 0), f4)
    sch.transform_block_layout(blk, f4)
    p, y, _ = sch.get_loops(blk)
    po, pi = sch.split(p, [None, planes])
    yo, yi = sch.split(y, [None, rows])
    sch.reorder(po, yo, pi, yi)
    # the tile placed under the row-block loop before it is fused with the plane-block loop: TVM's
    # region analysis of the tile is exact over the two loops, not over the fused one's // and %
    wb = sch.cache_write(blk, 0, SCOPE_AM)
    sch.reverse_compute_at(wb, yo, preserve_unit_loops=True)
    stage = sch.fuse(po, yo)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.annotate(sch.get_loops(blk)[1], OP, DMA)
    sch.annotate(sch.get_loops(wb)[1], OP, DMA)
    return sch


def _groups(dims: tuple[int, ...], perm: tuple[int, ...]) -> list[list[int]]:
    """The canonical form's axes (`transpose.canonical`) as lists of original input axes, in
    output order: unit axes dropped, axes adjacent in input and output in the same order merged."""
    keep = [a for a in range(len(dims)) if dims[a] > 1] or [0]
    groups: list[list[int]] = []
    for a in (a for a in perm if a in keep):
        if groups and keep.index(groups[-1][-1]) + 1 == keep.index(a):
            groups[-1].append(a)
        else:
            groups.append([a])
    return groups


def transpose_schedule(wl: Workload, j: int, cnt: int, staged: bool):
    """The canonical form's axes (x and the output reshaped to them); output axis `j` split by
    `cnt`, the axes before it and the outer part fused into the stage loop: a tile is a box of
    the output, one strided view of x."""
    dims, perm = transpose_dims(wl)
    groups = _groups(dims, perm)
    pos = {a: k for k, a in enumerate(perm)}  # input axis -> output position
    in_order = sorted(groups, key=lambda g: g[0])
    nd = len(dims)
    mx = _imap(lambda *i: [_flat([i[a] for a in g], [dims[a] for a in g]) for g in in_order], nd)
    mo = _imap(lambda *o: [_flat([o[pos[a]] for a in g], [dims[a] for a in g]) for g in groups], nd)
    sch = _schedule(wl)
    blk = sch.get_sblock("transpose")
    sch.transform_layout(blk, ("read", 0), mx)
    sch.transform_layout(blk, ("write", 0), mo)
    sch.transform_block_layout(blk, mo)
    loops = sch.get_loops(blk)
    jo, _ = sch.split(loops[j], [None, cnt])
    stage = sch.fuse(*loops[:j], jo) if j else jo
    return _stage_nests(sch, blk, stage, staged, 1)




def concat_func(wl: Workload):
    """concat's compute per input, the PrimFunc `concat_schedule` schedules."""
    return concat_per_input(int(wl["n"]), int(wl["c"]), int(wl["c1"]), int(wl["h"]), int(wl["w"]), wl.dtype)


def concat_schedule(wl: Workload, tile: int, staged: bool):
    """Per image, each input's block of c_i*h*w elements split by `tile`: a stage loop per input
    (in image order, x's tiles then x1's, as the retired emitter listed its transfers), the image
    loop over both marked `opc.dsp.items` (the cores take contiguous shares of all the stages it
    holds). path=am: the input's tile read into AM at the stage (cache_read: the DMA-in), the
    block's copy to the output the DMA-out."""
    import tvm

    sch = tvm.s_tir.Schedule(concat_func(wl))
    H, W = int(wl["h"]), int(wl["w"])
    hw = H * W
    flat = lambda b, c, y, x: [b, (c * H + y) * W + x]  # noqa: E731  x, x1, the output as (image, run)
    for nm, io in (("x", ("read", 0)), ("x", ("write", 0)), ("x1", ("read", 0))):
        sch.transform_layout(sch.get_sblock(nm), io, flat)
    for nm, c in (("x", int(wl["c"])), ("x1", int(wl["c1"]))):
        blk = sch.get_sblock(nm)
        loops = sch.get_loops(blk)
        stage, _ = sch.split(loops[1], [None, min(tile, c * hw)])
        sch.annotate(stage, STAGE, 1)
        if staged:
            rb = sch.cache_read(blk, 0, SCOPE_AM)
            sch.compute_at(rb, stage, preserve_unit_loops=True)
            sch.annotate(sch.get_loops(rb)[2], OP, DMA)
        sch.annotate(sch.get_loops(blk)[2], OP, DMA)
    sch.annotate(sch.get_loops(sch.get_sblock("x"))[0], ITEMS, 1)
    return sch


SCHEDULES: dict[str, Callable] = {"slice": slice_schedule, "pad": pad_schedule, "transpose": transpose_schedule,
                                  "concat": concat_schedule}
def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], knobs: tuple, dbuf: bool, shares: list,
              item_key, info: dict) -> Scheduled:
    """A move kernel's schedule (`SCHEDULES[op](wl, *knobs)`) for the backend's data-movement
    lowering (`lowering="move"`); dbuf and cores do not change the module."""
    m = machine(target)
    return stream.scheduled(
        "move", wl, {**config, "dbuf": dbuf}, m, ("move", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: SCHEDULES[wl.op](wl, *knobs).mod, shares, item_key, {"layout_change": "none", **info, "lowering": "tir"})


__all__ = ["concat_func", "concat_schedule", "pad_schedule", "scheduled", "slice_schedule", "transpose_schedule"]

