"""Grouped / depthwise convolution (groups > 1, NCHW) as the TVM schedule the DSP simulator executes.

Built over the op's own TE compute (`pad` -> `conv2d` [-> `conv2d_bias` | `batch_norm`] [-> `vrelu`]),
with the grouped template's knobs (`grouped.py`) as schedule primitives and annotations:

    items (image, channel block, row block)   the output channels split into blocks of `planes`:
                                     whole groups (kk -> (block, group in block, channel in group))
                                     when a group has at most `planes` channels, else slices of one
                                     group (kk -> (group, slice, channel in slice)); the output rows
                                     split by `rows`; the item loops fused into the stage loop
                                     (opc.dsp.stage, opc.dsp.cores: contiguous shares of items)
    the padded input tile            `pad` computed at the stage in local.AM (the block's groups'
                                     input planes, the item's rows with the halo; a DMA nest,
                                     opc.dsp.op = "dma"), rows storage_align'ed to the pitch the
                                     widest vector load reads
    the output tile                  cache_write of the last block into local.AM (rows at a vector
                                     pitch), copied AM -> DDR by a DMA nest
    weights, bias / BN vectors       cache_read into local.SM: at the root for the whole kernel
                                     (`w_path=resident`), at the stage for the block's (`stage`)
    register blocks                  the item's rows split by `rb`, the columns by the lanes;
                                     (group, channel, row block, column vector) is the loop nest
                                     opc.dsp.op = "gconv": the conv reduction computed under it into
                                     local.REG (input channels of the group outermost, then the
                                     block's rows and lanes, then the taps), the epilogue blocks
                                     after it

The backend's convolution lowering (`tir_gconv`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import (
    CORES, DMA, EPI_BLOCKS, GCONV, OP, SCOPE_AM, SCOPE_REG, SCOPE_SM, STAGE, machine,
)
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from . import stream

_WL: dict[str, Workload] = {}


def gconv_schedule(wl: Workload, planes: int, rows: int, rb: int, resident: bool, pitch: int, lanes: int):
    """The scheduled s_tir.Schedule; `pitch`: the input tile's row pitch (elements)."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    p = wl.p
    kg = p["k"] // p["groups"]
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    epi = [b for b in names if b in EPI_BLOCKS]
    conv = sch.get_sblock("conv2d")
    last = sch.get_sblock(epi[-1]) if epi else conv
    # the input as (image * channel) planes, as pooling does: the padded tile's copy is a
    # (planes, rows, columns) nest whatever the block holds
    C = int(p["c"])
    f4 = lambda b, c, y, x: [b * C + c, y, x]  # noqa: E731
    if "pad" in names:
        pad = sch.get_sblock("pad")
        sch.transform_layout(pad, ("read", 0), f4)
        sch.transform_layout(pad, ("write", 0), f4)
        sch.transform_block_layout(pad, f4)
    else:
        sch.transform_layout(conv, ("read", 0), f4)
    o = sch.cache_write(last, 0, SCOPE_AM)  # the output tile; `o` is its AM -> DDR copy
    n, k, y, x, rc, ry, rx = sch.get_loops(conv)
    if kg <= planes:  # whole groups per block
        kb, kin = sch.split(k, [None, max(1, planes // kg) * kg])
        gi, ci = sch.split(kin, [None, kg])
        items = [n, kb]
    else:  # slices of one group
        g, q = sch.split(k, [None, kg])
        qb, ci = sch.split(q, [None, planes])
        gi = sch.add_unit_loop(ci)
        items = [n, g, qb]
    yo, yi = sch.split(y, [None, rows])
    xv, xl = sch.split(x, [None, lanes])
    sch.reorder(*items, yo, gi, ci, yi, xv, rc, xl, ry, rx)
    # tiles placed at the row-block loop before it is fused and before the register-block split:
    # TVM's region analysis of the tiles is exact over these loops
    if "pad" in names:
        sch.compute_at(pad, yo, preserve_unit_loops=True)
        sch.set_scope(pad, 0, SCOPE_AM)
    else:
        pad = sch.cache_read(conv, 0, SCOPE_AM)
        sch.compute_at(pad, yo, preserve_unit_loops=True)
    for b in epi:
        sch.reverse_compute_at(sch.get_sblock(b), yo)
    sch.reverse_compute_at(o, yo, preserve_unit_loops=True)
    yb, yr = sch.split(yi, [None, rb])
    sch.reorder(yb, xv, rc, yr, xl)
    if not epi:  # plain conv: accumulate in registers, then store the block to the AM tile
        blocks = [sch.cache_write(conv, 0, SCOPE_REG)]
    else:
        for b in ["conv2d"] + epi[:-1]:
            sch.set_scope(sch.get_sblock(b), 0, SCOPE_REG)
        blocks = [sch.get_sblock(b) for b in epi]
    for b in blocks:
        sch.reverse_compute_at(b, xv)
    # created last to first: TVM puts each new copy at the root's front, so the weights are
    # fetched first, then the parameters in their order (as the stage copies are)
    reads = [("conv2d", 1)] + [(b, i) for b in epi for i in range(1, len(sch.get(sch.get_sblock(b)).reads))]
    wt = [sch.cache_read(sch.get_sblock(b), i, SCOPE_SM) for b, i in reversed(reads)][::-1]
    if not resident:
        for c in wt:
            sch.compute_at(c, yo, preserve_unit_loops=True)
    stage = sch.fuse(*items, yo)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 1, pitch, 0)
    sch.storage_align(blocks[-1], 0, 2, lanes, 0)  # the block storing the AM tile: rows at a vector pitch
    for c in [pad, o] + ([] if resident else wt):
        sch.annotate(sch.get_loops(c)[1], OP, DMA)
    if resident:
        for c in wt:
            sch.annotate(sch.get_loops(c)[0], OP, DMA)
    sch.annotate(gi, OP, GCONV)
    return sch


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The grouped convolution's schedule for the backend's register-blocked convolution lowering
    (`lowering="gconv"`)."""
    m = machine(target)
    op = get_op(wl.op)
    planes = g.KP if g.kg <= g.KP else g.kpg
    knobs = (planes, g.rows, g.rb, g.resident, g.Wr, g.L)
    ddr = {nm: tuple(s) for nm, s, _ in op.inputs(wl)}
    ddr["out"] = (g.n, g.k, g.ho, g.wo)
    return stream.scheduled(
        "gconv", wl, config, m, ("gconv", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: gconv_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lane_use": round(g.wo / g.OW, 4), "groups": g.groups, "params": len(g.pnames),
         "lowering": "tir"}, ddr=ddr)


__all__ = ["gconv_schedule", "scheduled"]
