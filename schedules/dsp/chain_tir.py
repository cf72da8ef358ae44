"""The element-wise chain as the TVM schedule the DSP simulator executes.

Built over the op's own TE compute (relu, add, add_relu, bias_add, batch_norm, bn_relu, ew_chain),
with the chain template's knobs (`chain.py`) as schedule primitives and annotations:

    every stage but the last            compute_inline: one block holding the whole expression
                                        (broadcasts of per-channel operands and clip bounds fold in)
    the tensor                          transform_layout / transform_block_layout to the lanes'
                                        view: flat (elements), (image, elements) with split=batch,
                                        (image, channel, plane) for NCHW with per-channel steps,
                                        (pixel, channel) / (image, pixel, channel) for NHWC ones
    stage loop (`tile`)                 split of the flat / plane / pixel axis; annotated
                                        opc.dsp.stage, and opc.dsp.cores (split=items) or the
                                        image loop opc.dsp.cores (split=batch)
    x and full-shape operands           cache_read into local.AM at the stage loop (DMA nests,
                                        opc.dsp.op = "dma"); storage_align puts each plane / pixel
                                        at a vector boundary (the AM pitch)
    per-channel operands                cache_read into local.SM (NCHW planes: scalars broadcast
                                        to the lanes) or local.AM (NHWC pixels: channels on the
                                        lanes), once per core
    the expression                      computed in local.AM (cache_write), its nest annotated
                                        opc.dsp.op = "vec"; the result copied back (a DMA nest)

`dbuf` (two slots of every stage buffer) and `cores` (how many cores share the stage / image
loop) are read by the lowering. The backend's vector lowering (`tir_vector`) lowers the function;
nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, OP, SCOPE_AM, SCOPE_SM, STAGE, VEC, machine
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from . import stream
from .common import copy_loop

_WL: dict[str, Workload] = {}


def chain_schedule(wl: Workload, mode: str, batch: bool, per: int, chunk: int, lanes: int):
    """The scheduled s_tir.Schedule. `mode`: flat | plane | pixel (chain.py's _Geo); `per`:
    elements (flat), planes (plane with whole planes), pixels (pixel) per stage; `chunk`: the
    elements of a plane per stage when a plane exceeds the tile (0: whole planes)."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    root = sch.get_sblock("root")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    for nm in names[:-1]:
        sch.compute_inline(sch.get_sblock(nm))
    blk = sch.get_sblock(names[-1])
    func = sch.mod["main"]
    shape = tuple(int(s) for s in func.params[-1].shape)
    if len(shape) != 4:
        raise OpcError(f"the dsp chain schedule takes rank-4 tensors, not {list(shape)}", arg="op", value=wl.op)
    _, d1, d2, d3 = shape
    if mode == "flat":
        fmap = (lambda a, b, c, d: [a, (b * d2 + c) * d3 + d]) if batch else \
            (lambda a, b, c, d: [((a * d1 + b) * d2 + c) * d3 + d])
    elif mode == "plane":  # NCHW
        fmap = lambda a, b, c, d: [a, b, c * d3 + d]  # noqa: E731
    else:  # NHWC, channels last
        fmap = (lambda a, b, c, d: [a, b * d2 + c, d]) if batch else \
            (lambda a, b, c, d: [(a * d1 + b) * d2 + c, d])
    chan_ax = 3 if mode == "pixel" else 1
    for i, r in enumerate(sch.get(blk).reads):
        rs = tuple(int(s) for s in r.source.shape)
        if rs == shape:
            sch.transform_layout(blk, ("read", i), fmap)
        elif len(rs) == 4:  # a per-channel operand seen as (1, C, 1, 1) / (1, 1, 1, C)
            sch.transform_layout(blk, ("read", i), lambda *ix: [ix[chan_ax]])
    sch.transform_layout(blk, ("write", 0), fmap)
    sch.transform_block_layout(blk, fmap)
    loops = sch.get_loops(blk)
    cores_loop = None
    if mode == "flat":
        if batch:
            b, e = loops
            stage, inner = sch.split(e, [None, min(per, d1 * d2 * d3)])
            cores_loop = b
        else:
            stage, inner = sch.split(loops[0], [None, per])
    elif mode == "plane":
        b, c, s = loops
        if chunk:
            so, inner = sch.split(s, [None, chunk])
            stage = sch.fuse(c, so) if batch else sch.fuse(b, c, so)
        else:
            co, inner = sch.split(c, [None, per])
            stage = co if batch else sch.fuse(b, co)
        cores_loop = b if batch else None
    else:
        if batch:
            b, p, c = loops
            cores_loop = b
        else:
            p, c = loops
        stage, inner = sch.split(p, [None, per])
    sch.annotate(stage, STAGE, 1)
    sch.annotate(cores_loop if cores_loop is not None else stage, CORES, 1)
    depth = 2 if cores_loop is not None else 1  # loops down to the stage's own nests
    aligned = mode != "flat" and not chunk  # rows (planes, pixels) start at a vector
    o = sch.cache_write(blk, 0, SCOPE_AM)
    sch.reverse_compute_at(o, stage)
    reads = list(sch.get(blk).reads)
    staged, params = [], []
    for i, r in enumerate(reads):
        if tuple(int(s) for s in r.source.shape) == tuple(int(s) for s in sch.get(blk).writes[0].source.shape) \
                or len(r.source.shape) > 1:
            staged.append(i)
        else:
            params.append(i)
    # cache_read inserts before the consumer: the last one read comes first, so go backwards
    for i in reversed(staged):
        rd = sch.cache_read(blk, i, SCOPE_AM)
        sch.compute_at(rd, stage)
        if aligned:
            sch.storage_align(rd, 0, len(sch.get(rd).writes[0].source.shape) - 2, lanes, 0)
        sch.annotate(copy_loop(sch, rd, depth), OP, DMA)
    for i in reversed(params):
        rd = sch.cache_read(blk, i, SCOPE_SM if mode == "plane" else SCOPE_AM)
        sch.annotate(copy_loop(sch, rd, 0), OP, DMA)
    if aligned:
        sch.storage_align(blk, 0, len(sch.get(blk).writes[0].source.shape) - 2, lanes, 0)
    sch.annotate(copy_loop(sch, blk, depth), OP, VEC)  # (a one-element stage: a unit loop)
    sch.annotate(copy_loop(sch, o, depth), OP, DMA)
    return sch



def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The chain's schedule for the backend's vector lowering (`lowering="vector"`); dbuf and cores
    do not change the module. The cores with work are the ones the stage loop's split gives some."""
    m = machine(target)
    chunk = g.chunk if g.mode == "plane" and not g.pitch else 0
    knobs = (g.mode, g.batch, g.per, chunk, g.L)
    return stream.scheduled(
        "vector", wl, config, m, ("chain", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: chain_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lanes": g.mode, "lowering": "tir"}, cores_used="split")


__all__ = ["chain_schedule", "scheduled"]

