"""Pooling (pool2d, NCHW and NHWC) as the TVM schedule the DSP simulator executes.

Built over the op's own TE compute (`pool_pad` -> `pool2d` window reduction [-> `pool2d_avg`]),
with the pooling template's knobs (`pool.py`) as schedule primitives and annotations:

    planes x rows items              transform_layout / transform_block_layout to (n*c, h, w)
                                     planes; the planes split by `planes`; split of the output rows by
                                     `rows`; the two outer loops fused: the stage loop
                                     (opc.dsp.stage, opc.dsp.cores: contiguous shares of items)
    the padded input tile            pool_pad computed at the stage in local.AM (a DMA nest,
                                     opc.dsp.op = "dma": the rows inside the image copied, the
                                     padding filled with the reduction's identity); its rows
                                     storage_align'ed to the pitch the widest vector reads
    the window reduction             the output tile (cache_write, local.AM, rows at a vector
                                     pitch) computed by one vector nest, opc.dsp.op = "vec":
                                     output columns on the lanes, the window taps unrolled
    avg's divisor                    pool2d_avg computed at the reduction's column loop (the
                                     window sum stays in a register, local.REG)
    separable                        opc.dsp.separable = 1 on the vector nest: the lowering
                                     reduces each input row over the columns first (AM scratch)
    dbuf / cores                     read by the lowering

NHWC (`pool_schedule_nhwc`): the channels are contiguous, so they go on the lanes. Items are
(block of `planes` images, block of `rows` output rows, block of `chans` channels): the three
outer loops fused into the stage loop. The padded input tile (or the cache_read of x) is
(images, rows, pixels, channels) with the pixels packed (storage_align to `chans`): with every
channel in the block a row is one contiguous run of w*c elements (one DMA run), otherwise runs of
`chans` per pixel; the padding is whole pixels at the ends of a row (the same fills as NCHW). The
output tile puts each pixel at a vector pitch (storage_align to the lanes); a tap of output pixel
(y, x) is a unit-stride vector load of input pixel (y*stride + r, x*stride + s), and the
write-back is a strided copy of the pixels' channels. avg's divisor varies with the row and the
column, not the lanes: two SM reciprocal tables (per row, per column).

The backend's vector lowering (`tir_vector`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, OP, SCOPE_AM, SCOPE_REG, STAGE, VEC, machine
from opcompiler.ops import op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from . import stream

_WL: dict[str, Workload] = {}


def _blocks(wl: Workload):
    """A fresh schedule of the op's compute and its blocks: (schedule, avg, the window reduction,
    the padding block or None (the window then reads x), the last block (avg's divide or the max))."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    avg = wl["mode"] == "avg"
    red = sch.get_sblock("pool2d")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    pad = sch.get_sblock("pool_pad") if "pool_pad" in names else None
    return sch, avg, red, pad, sch.get_sblock("pool2d_avg") if avg else red


def pool_schedule(wl: Workload, planes: int, rows: int, sep: bool, pitch: int, lanes: int):
    """The scheduled s_tir.Schedule; `pitch`: the input tile's row pitch (elements)."""
    sch, avg, red, pad, last = _blocks(wl)
    C = int(wl["c"])
    f4 = lambda b, c, y, x: [b * C + c, y, x]
    if pad is not None:
        sch.transform_layout(pad, ("read", 0), f4)
        sch.transform_layout(pad, ("write", 0), f4)
    else:
        sch.transform_layout(red, ("read", 0), f4)
    sch.transform_layout(red, ("write", 0), f4)
    if avg:
        sch.transform_layout(last, ("write", 0), f4)
        sch.transform_block_layout(last, f4)
    if pad is not None:
        sch.transform_block_layout(pad, f4)
    sch.transform_block_layout(red, lambda b, c, y, x, r, s: [b * C + c, y, x, r, s])
    p, y, x = sch.get_loops(last)[:3]
    po, pi = sch.split(p, [None, planes])
    yo, yi = sch.split(y, [None, rows])
    sch.reorder(po, yo, pi, yi)
    # tiles placed under the row-block loop before it is fused with the plane-block loop: TVM's
    # region analysis of the tiles is exact over the two loops, not over the fused one's // and %
    o, pad = _tiles(sch, red, last, pad, avg, x, yo)
    stage = sch.fuse(po, yo)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 1, pitch, 0)
    sch.storage_align(last, 0, 1, lanes, 0)
    sch.annotate(sch.get_loops(pad)[1], OP, DMA)
    vec = sch.get_loops(last)[1]
    sch.annotate(vec, OP, VEC)
    if sep:
        sch.annotate(vec, "opc.dsp.separable", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch



def _tiles(sch, red, last, pad, avg: bool, acc_at, at):
    """The AM tiles of a stage, placed at loop `at`: the output tile (cache_write of the last block)
    and the input tile (the padding block in AM, or a cache_read of the input); for avg, the window
    sum in a register at loop `acc_at`. Returns (output copy block, input tile block)."""
    if avg:
        sch.compute_at(red, acc_at)
        sch.set_scope(red, 0, SCOPE_REG)
    o = sch.cache_write(last, 0, SCOPE_AM)
    sch.reverse_compute_at(o, at, preserve_unit_loops=True)
    if pad is not None:
        sch.compute_at(pad, at, preserve_unit_loops=True)
        sch.set_scope(pad, 0, SCOPE_AM)
    else:
        pad = sch.cache_read(red, 0, SCOPE_AM)
        sch.compute_at(pad, at, preserve_unit_loops=True)
    return o, pad


def pool_schedule_nhwc(wl: Workload, planes: int, rows: int, chans: int, sep: bool, lanes: int):
    """NHWC: the scheduled s_tir.Schedule (see the module docstring); `chans`: channels per stage."""
    sch, avg, red, pad, last = _blocks(wl)
    b, y, x, c = sch.get_loops(last)[:4]
    bo, bi = sch.split(b, [None, planes])
    yo, yi = sch.split(y, [None, rows])
    co, ci = sch.split(c, [None, chans])
    sch.reorder(bo, yo, co, bi, yi, x, ci)
    # tiles placed under the channel-block loop before it is fused with the image- and row-block
    # loops (as NCHW: TVM's region analysis is exact over the loops, not over the fused one's // and %)
    o, pad = _tiles(sch, red, last, pad, avg, ci, co)
    stage = sch.fuse(bo, yo, co)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 2, min(chans, int(wl["c"])), 0)  # the input pixels packed (the lowering's `_tight`)
    sch.storage_align(last, 0, 2, lanes, 0)  # each output pixel at a vector
    sch.annotate(sch.get_loops(pad)[1], OP, DMA)
    vec = sch.get_loops(last)[1]
    sch.annotate(vec, OP, VEC)
    if sep:
        sch.annotate(vec, "opc.dsp.separable", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The pooling schedule (`lowering="vector"`: the backend's window-nest lowering; the
    constants it computes, the divisors of average pooling, are DDR tables the host fills)."""
    m = machine(target)
    if wl.layout == "NHWC":
        knobs = (g.planes, g.rows, g.chans, g.sep, g.L)
        return stream.scheduled(
            "vector", wl, config, m, ("pool", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
            lambda: pool_schedule_nhwc(wl, *knobs).mod, shares, g.key,
            {"layout_change": "none", "lane_use": round(g.lane_use, 4), "lowering": "tir"},
            args={0: "x", -1: "out"}, ddr={"x": (g.n, g.h, g.w, g.c), "out": (g.n, g.ho, g.wo, g.c)},
            tile_tags=True, tables=True)
    knobs = (g.planes, g.rows, g.sep, g.Wr, g.L)
    return stream.scheduled(
        "vector", wl, config, m, ("pool", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: pool_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lane_use": round(g.wo / g.OW, 4), "lowering": "tir"},
        args={0: "x", -1: "out"}, ddr={"x": (g.n, g.c, g.h, g.w), "out": (g.n, g.c, g.ho, g.wo)},
        tile_tags=True, tables=True)


__all__ = ["pool_schedule", "pool_schedule_nhwc", "scheduled"]
