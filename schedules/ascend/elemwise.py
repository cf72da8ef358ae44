"""Element-wise and broadcast ops on the vector unit, tiled through UB with double buffering.

    FOR UB tile of this core's share:   GM -> UB (MTE2), vector ops in UB (V), UB -> GM (MTE3)

Every op is a chain of vector steps (relu, sigmoid, clip, add/mul with a same-shape operand,
bias/scale/bn with per-channel operands; ew_chain spells the chain out). Chains without
per-channel steps (relu, add, add_relu) stream the flat tensor in its own layout; chains with
them (bias_add, batch_norm, bn_relu, add_relu with a per-channel y) work on NC1HWC0, so one
256 B repeat covers 8 pixels x 16 channels and the channel parameters are read with block
stride 0 (fp16) or as two half-row instructions (fp32): fp32 moves twice the bytes and gets
half the lanes per repeat (seed 000 §6.3.2, Table 6). The NCHW <-> NC1HWC0 change is
host-side preprocessing (activations live in NC1HWC0 between Ascend kernels). concat copies
each input's contiguous channel block per image through UB (MTE2 -> UB -> MTE3, no vector work).

Flat chains (relu, add, add_relu without broadcast, ew_chain without per-channel steps) take the
TVM route: `flat_schedule` schedules the op's own TE compute (UB tiles, cache_read /
cache_write, stages computed at the tile loop, emit_insn pragmas, the knobs as split factor and
loop annotations) and the backend's `lower.vector` lowering turns the scheduled module into each
core's program. Per-channel chains take it too: `channel_schedule` schedules the
chain on the NC1HWC0 view (parameters resident in UB, a per-channel step lowered to block
stride 0 / half-row instructions). slice, pad and transpose take it too: `move.move_schedule`
views the tensors as the runs the op moves and writes the op's block through a UB tile (MTE2 in,
MTE3 out, a vector dup for padding), lowered by the backend's `lower.move`; concat too
(`move.concat_schedule`). `apply` returns the schedule as a `Scheduled` whose lowering
("vector" or "move") the backend's `lower.py` runs.

The flat schedule (`flat_schedule`). TBE schedules a vector op by tiling the output into UB-sized
pieces, reading the inputs into UB (`cache_read`), keeping every intermediate stage in UB and computing it at the tile loop, and
marking each loop nest with an `lower.vector` pragma; the backend's `lower.vector` lowering turns each
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

The backend's `lower.vector` lowers the module; nothing here emits instructions.

The per-channel schedule (`channel_schedule`): an `s_tir.Schedule` over NC1HWC0, lowered by the
backend's `lower.vector` (TBE style: UB tiles, pragma'd nests; nothing here emits instructions).
Chains with per-channel steps (bias_add, batch_norm, bn_relu, add_relu with bcast=1, ew_chain
with bias / scale / bn steps) work on NC1HWC0 so that one 256 B repeat covers 8 pixels x 16
channels. As for pooling (`pool.py`), the compute is written on the NC1HWC0 view directly: the
activations are (N*C1, H*W, 16) tensors (the NCHW / NHWC <-> NC1HWC0 change is host-side
preprocessing, as for every Ascend vector kernel), each per-channel operand a (C1, 16) tensor
(channels zero-padded) read through a view `p[plane % C1, c0]`, and the chain is the op's own
vector steps (the DSL's vrelu, vadd, vmul, vmuls, vadds, vexp, vlog, vrec, vmin / vmax with
scalar bounds: the same stages the op's TE compute has, one per vector instruction).

    views, scalar broadcasts                compute_inline (instruction operands / immediates)
    output copy (cache_write, local.UB -> GM)
                                            pixels split by ub_tile / 16 rows; (plane, row tile)
                                            fused into the tile loop: opc.ascend.block_dim,
                                            opc.ascend.double_buffer; dma_copy
    per-channel parameters                  cache_read into local.UB at the root: before the tile
                                            loop, loaded once per core (the lowering's prologue,
                                            resident buffers); dma_copy
    activations (x and same-shape operands) cache_read into local.UB, computed at the tile loop
                                            (first, in input order); dma_copy
    stages                                  set_scope local.UB, computed at the tile loop;
                                            vector_auto. A stage reading a parameter row lowers
                                            to a per-channel instruction (block stride 0 for fp16,
                                            two half-row instructions for fp32, whole repeats of
                                            8 rows), every other stage to one contiguous run.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.steps import (
    CHAN,
    FULL,
    STEPS,
    apply_te,
    chain_temp_bytes,
    chain_temps,
    chain_text,
    operand_kinds,
    parse_chain,
)
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, from_5hd, machine, on_cores, per_channel, to_5hd

MOVE_TIR = ("slice", "pad", "transpose", "concat")  # the data-movement ops on the TVM route
UB_TILES = (1024, 2048, 4096, 8192, 16384, 32768)
C0 = 16


def _steps(wl: Workload) -> list[tuple[str, tuple[float, ...]]]:
    """The op as a chain of vector steps over x, as the catalogue declares it (`OpDef.chain`; the
    steps and the operands each reads: `opcompiler.ops.steps.STEPS`)."""
    steps = get_op(wl.op).steps(wl)
    if steps is None:
        raise OpcError(f"no ascend vector template for {wl.op}", arg="op", value=wl.op,
                       expected="an op with a chain in the catalogue (relu, bn_relu, ew_chain, ...), "
                                "concat, pad, slice or transpose")
    return steps


def _kind(wl: Workload) -> str:
    if wl.op in ("concat", "pad", "transpose", "slice"):
        return wl.op
    steps = _steps(wl)
    return "channel" if any("chan" in STEPS[n].operands for n, _ in steps) else "flat"


def _n_full(wl: Workload) -> int:
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else sum(STEPS[n].operands.count("full") for n, _ in _steps(wl))


def _n_chan(wl: Workload) -> int:
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else sum(STEPS[n].operands.count("chan") for n, _ in _steps(wl))


def _n_temps(wl: Workload) -> int:
    """Tiles a step holds beside x's (hardswish keeps x until its last multiply)."""
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else chain_temps(_steps(wl))


def _shape(wl: Workload) -> tuple[int, int, int, int]:
    return wl["n"], wl["c"], wl["h"], wl["w"]


@register_template
class AscendElemwise(AscendTemplate):
    """Vector-unit streaming kernel: UB tiles, ping-pong buffers, work split over cores."""

    name = "ascend.elemwise"
    op_families = ("elemwise",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _kind(wl)  # rejects ops without a vector template
        return [Knob("ub_tile", UB_TILES, "elements per UB tile (per operand)"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles so MTE2, V and MTE3 overlap"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        return [{"ub_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(UB_TILES)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        slots = 2 if cfg["double_buffer"] else 1
        c1 = ceil_div(wl.p.get("c", 1), C0)
        out = [("UB", f"param{i}", c1 * C0 * isz) for i in range(_n_chan(wl))]
        for s in range(slots):
            out += [("UB", f"x{i}_{s}", cfg["ub_tile"] * isz) for i in range(1 + _n_full(wl))]
            if _n_temps(wl):
                out.append(("UB", f"temps_{s}", cfg["ub_tile"] * chain_temp_bytes(_steps(wl), wl.dtype)))
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        kind = _kind(wl)
        if kind in MOVE_TIR:
            return self._apply_move_tir(wl, target, cfg)
        if kind == "flat":
            return self._apply_flat_tir(wl, target, cfg)
        if kind == "channel":
            return self._apply_channel_tir(wl, target, cfg)
        raise OpcError(f"no ascend element-wise lowering for {wl.op}", arg="op", value=wl.op)

    def _apply_move_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Data movement through TVM: `move.move_schedule` schedules the op's TE compute
        (views of the runs it moves, the op's block cache_written into a UB tile, tiles of
        ub_tile elements, dma_copy pragmas) for the backend's "move" lowering (`lower.move`:
        MTE2 / MTE3 boxes, a vector dup for padding). The inputs go to GM as the views of the
        runs the module moves."""
        from .move import logical_out_shape, move_schedule

        out_shape = logical_out_shape(wl)
        return Scheduled(lowering="move", module=lambda: (move_schedule(wl, cfg), ()),
                         host=HostLayout(unpack=lambda y: y.reshape(out_shape), out_dtype=wl.dtype), flops=0,
                         info={"steps": wl.op, "layout_change": "none", "channel_padding_waste": 0.0})

    def _apply_flat_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Flat chains through TVM: `flat_schedule` schedules the op's TE compute
        (UB tiles, cache_read / cache_write, stages computed at the tile loop, emit_insn pragmas)
        for the backend's "vector" lowering (`lower.vector`). The tensors stream flat."""
        n, c, h, w = _shape(wl)
        out_shape = (n, c, h, w) if wl.layout == "NCHW" else (n, h, w, c)
        return Scheduled(lowering="vector", module=lambda: (flat_schedule(wl, cfg), ()),
                         host=HostLayout(unpack=lambda y: y.reshape(out_shape), out_dtype=wl.dtype),
                         flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "flat"}, "steps": ";".join(nm for nm, _ in _steps(wl)),
                               "layout_change": "none (streams the tensor in its own layout)",
                               "channel_padding_waste": 0.0})

    def _apply_channel_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Per-channel chains through TVM: `channel_schedule` schedules the chain on
        the NC1HWC0 view (UB tiles of ub_tile / 16 pixels of one channel block, parameters
        resident in UB, emit_insn pragmas) for the backend's "vector" lowering (`lower.vector`;
        per-channel steps: block stride 0 for fp16, two half-row instructions for fp32)."""
        steps = _steps(wl)
        chain = chain_text(steps)
        n, c, h, w = _shape(wl)
        c1, hw = ceil_div(c, C0), h * w
        gm_shape = (n * c1, hw, C0)
        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            fulls, chans, rest = [], [], iter(inputs[1:])
            for name, _ in steps:  # operands come in step order
                for what in STEPS[name].operands:
                    (fulls if what == "full" else chans).append(next(rest))
            gm = {f"x{i}": to_5hd(a, layout, C0).reshape(gm_shape) for i, a in enumerate([inputs[0], *fulls])}
            for i, a in enumerate(chans):
                gm[f"p{i}"] = per_channel(a.reshape(-1), c1, C0)
            return gm

        return Scheduled(lowering="vector", module=lambda: (channel_schedule(wl, chain, cfg), ()),
                         host=HostLayout(pack=pack, unpack=lambda y: from_5hd(y.reshape(n, c1, hw, C0), c, h, w, layout),
                                         out_shape=gm_shape, out_dtype=wl.dtype),
                         flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "NC1HWC0 (N*C1, H*W, 16)"}, "steps": ";".join(nm for nm, _ in steps),
                               "layout_change": "NCHW/NHWC <-> NC1HWC0 on the host",
                               "channel_padding_waste": round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        kind = _kind(wl)
        if kind in ("transpose", "slice"):
            n, c, h, w = 1, 1, 1, int(np.prod([int(d) for d in str(wl["dims"]).split("x")]))
        else:
            n, c, h, w = _shape(wl)
        elems = {"flat": n * c * h * w, "channel": n * ceil_div(c, C0) * C0 * h * w}.get(
            kind, n * (c + wl.p.get("c1", 0)) * h * w)
        tiles = ceil_div(elems, cfg["ub_tile"])
        cores = min(cfg["block_dim"], tiles)
        gm = elems * isz * (_n_full(wl) + 2)
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_bytes": gm, "arith_intensity": get_op(wl.op).flops(wl) / gm, "tiles": tiles,
                "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ,
                "alignment_waste": 1 - n * c * h * w / elems if kind == "channel" else 0.0,
                "lanes": machine(target).lanes(isz)}


# -- the flat chains' schedule

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
    mod, copy_out = _flat_tiled(key, int(cfg["ub_tile"]), bool(inline))
    return on_cores(mod, copy_out, cfg)


@lru_cache(maxsize=256)
def _flat_tiled(key: str, ub_tile: int, inline: bool):
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


# -- the per-channel chains' schedule (NC1HWC0)

def geometry(wl: Workload) -> tuple[int, int, int]:
    """(N*C1, H*W, C1): planes and pixels of the NC1HWC0 view."""
    c1 = -(-wl["c"] // C0)
    return wl["n"] * c1, wl["h"] * wl["w"], c1


@lru_cache(maxsize=64)
def _prim_func(key: str, chain: str):
    """The chain on the NC1HWC0 view: x0 (and same-shape operands x1, ...) of (N*C1, H*W, 16),
    per-channel operands p0, ... of (C1, 16); inputs in that order, then the output."""
    from tvm import te

    from opcompiler import dsl

    wl = _WL[key]
    dt = wl.dtype
    planes, hw, c1 = geometry(wl)
    shape = (planes, hw, C0)
    steps = parse_chain(chain)
    kinds = operand_kinds(steps)
    n_full, n_chan = kinds.count(FULL), kinds.count(CHAN)  # same-shape, per-channel operands
    xs = [te.placeholder(shape, dt, name=f"x{i}") for i in range(1 + n_full)]
    ps = [te.placeholder((c1, C0), dt, name=f"p{i}") for i in range(n_chan)]
    fulls, chans = iter(xs[1:]), iter(ps)

    def row(p):  # the parameter row of each pixel's channel block
        return te.compute(shape, lambda b, r, c: p[b % c1, c], name=f"{p.op.name}_view")

    def take(kind: str):  # a per-channel operand's row view is made when its step reads it
        return next(fulls) if kind == FULL else row(next(chans))

    x = apply_te(dsl, steps, xs[0], take, shape, dt, eager=False)  # the steps: opcompiler.ops.steps
    return te.create_prim_func([*xs, *ps, x])


@lru_cache(maxsize=256)
def _channel_tiled(key: str, chain: str, rows: int):
    """(module, name of the copy-out block): the schedule of one workload and tile of `rows` pixels."""
    from tvm.s_tir import Schedule

    sch = Schedule(_prim_func(key, chain))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    for nm in names:
        if _folded(nm):
            sch.compute_inline(sch.get_sblock(nm))
    names = [nm for nm in names if not _folded(nm)]
    copy_out = sch.cache_write(sch.get_sblock(names[-1]), 0, UB_SCOPE)
    fn = sch.mod["main"]
    inputs = list(fn.params[:-1])  # GM inputs, by identity: a stage may share the output's name

    def gm_input(buf):
        return next((b for b in inputs if b.same_as(buf)), None)

    acts, params, chan_reads = {}, {}, []
    for nm in names:
        b = sch.get_sblock(nm)
        for i, r in enumerate(sch.get(b).reads):
            g = gm_input(r.source)
            if g is None:
                continue
            if len(g.shape) == 3 and g.name not in acts:
                acts[g.name] = sch.cache_read(b, i, UB_SCOPE)
            elif len(g.shape) == 2:
                chan_reads.append((g.name, nm, i))
    for src, nm, i in reversed(chan_reads):  # each inserted before the root's first block: p0 ends up first
        params[src] = sch.cache_read(sch.get_sblock(nm), i, UB_SCOPE)
    for nm in names[:-1]:
        sch.set_scope(sch.get_sblock(nm), 0, UB_SCOPE)
    p, r, _ = sch.get_loops(copy_out)
    ro, ri = sch.split(r, [None, rows])
    tiles = sch.fuse(p, ro)
    sch.annotate(ri, PRAGMA, DMA_COPY)
    for nm in reversed(names):
        b = sch.get_sblock(nm)
        sch.compute_at(b, tiles)
        sch.annotate(sch.get_loops(b)[1], PRAGMA, VECTOR_AUTO)
    for nm in sorted(acts, reverse=True):  # x0 first
        sch.compute_at(acts[nm], tiles, index=0)
        sch.annotate(sch.get_loops(acts[nm])[1], PRAGMA, DMA_COPY)
    for nm in sorted(params):
        sch.annotate(sch.get_loops(params[nm])[0], PRAGMA, DMA_COPY)
    return sch.mod, sch.get(copy_out).name_hint


def channel_schedule(wl: Workload, chain: str, cfg: Mapping):
    """The scheduled module (IRModule) of a per-channel chain (`chain`: the op's steps, e.g.
    "bn;relu") for this config; the tiling (ub_tile / 16 pixels per tile) is cached per
    workload, cores and double buffering are tile-loop annotations."""
    key = wl.key_str()
    _WL[key] = wl
    mod, copy_out = _channel_tiled(key, chain, max(1, int(cfg["ub_tile"]) // C0))
    return on_cores(mod, copy_out, cfg)
