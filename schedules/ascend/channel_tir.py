"""The element-wise template's schedule for per-channel chains: an `s_tir.Schedule` over NC1HWC0,
lowered by the backend's `emit_insn` (TBE style: UB tiles, pragma'd nests; nothing here emits
instructions).

Chains with per-channel steps (bias_add, batch_norm, bn_relu, add_relu with bcast=1, ew_chain
with bias / scale / bn steps) work on NC1HWC0 so that one 256 B repeat covers 8 pixels x 16
channels. As for pooling (`pool_tir`), the compute is written on the NC1HWC0 view directly: the
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

from opcompiler.backend.ascend.intrin import DMA_COPY, PRAGMA, UB_SCOPE, VECTOR_AUTO
from opcompiler.ops.steps import CHAN, FULL, apply_te, operand_kinds, parse_chain
from opcompiler.workload import Workload

from .common import on_cores

C0 = 16
_WL: dict[str, Workload] = {}


def _folded(name: str) -> bool:
    return name.startswith("broadcast") or name.endswith("_view")


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
def _tiled(key: str, chain: str, rows: int):
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
    mod, copy_out = _tiled(key, chain, max(1, int(cfg["ub_tile"]) // C0))
    return on_cores(mod, copy_out, cfg)


__all__ = ["channel_schedule", "geometry"]
