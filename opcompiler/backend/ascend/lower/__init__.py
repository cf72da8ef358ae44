"""The ascend lowerings: a template's `Scheduled` -> the `Plan` the ascend-sim backend runs.

An ascend template's `apply` returns `opcompiler.template_base.Scheduled`: a lazily built
scheduled TVM module, the name of the lowering that reads it, the tiling facts the module does
not state (`params`), the host layout and the buffers the lowering will allocate. `lower` picks
the lowering by `sched.lowering` and assembles the plan:

    gemm, conv   the capacity dry-run (the builder's own CapacityError names buffer, level and
                 bytes before TVM is paid for), the module traced once per key (`trace`), the
                 event stream turned into each core's program (`cube.GemmLowering` /
                 `ConvLowering`)
    vector       `vector` (pragma'd nests, the TBE emit_insn way: DMA and vector instructions)
    move         `move` (MTE2 / MTE3 boxes, a vector dup for padding)
    reduce       `reduce` (per row vcadd / vcmax folds; softmax's stages per row)
    gather       `gather` (indices into UB, an indirect DMA per row, row tiles out)
    fm           `fm_interaction` (a tile of samples into UB, field sums as strided vector adds)
    attention    the capacity dry-run, the flash-attention nest traced once per key, each stage
                 turned into its instructions (`attention.AttentionLowering`)
    recurrent    the same for the LSTM / GRU nest (`recurrent.RecurrentLowering`)

The vector lowerings read the GM tensors' names and shapes from the module: a host layout
without `pack` sends the op's inputs in the module's argument order, each reshaped to its GM
tensor; without `out_name` / `out_shape` / `out_dtype` the module's output is read as it is
(and "move" names the GM views it moves in `gm_layouts` when the template does not).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ....errors import OpcFailure
from ....template_base import Scheduled
from . import cube as tl
from .builder import KernelBuilder
from ..program import ConvGeom, Plan
from ..machine import Machine

TIR_GEMM = "TVM s_tir schedule, tensorized blocks -> AI Core instructions"
TIR_CONV = "TVM s_tir schedule (implicit GEMM), blocks -> AI Core instructions"


def fit(sched: Scheduled, m: Machine) -> None:
    """The capacity dry-run: the buffers the lowering will allocate, allocated in order by the
    builder, whose CapacityError names buffer, level and bytes (a config `check` rejects)."""
    dry = KernelBuilder(m)
    for level, name, nbytes in sched.buffers:
        dry.alloc(level, name, (nbytes,), "int8")


def _cube_plan(sched: Scheduled, m: Machine, low: Any, describe: str) -> Plan:
    active = min(sched.params["block_dim"], len(low.groups))
    h = sched.host
    return Plan(active_cores=active, make_program=lambda core: low.program(core, active), pack=h.pack,
                out_name=h.out_name, out_shape=h.out_shape, out_dtype=h.out_dtype, unpack=h.unpack,
                flops=sched.flops, unit="cube",
                info={"lowering": describe, "tir_tiles": len(low.groups), **sched.info})


def _gemm(sched: Scheduled, m: Machine) -> Plan:
    p = sched.params
    fit(sched, m)
    low = tl.GemmLowering(m, tl.trace(sched.key, sched.module), p["dims"], p["tiles"], p["chunks"], p["slots"],
                          p["bias"], p["a_nd"], group=p["group"], dtype=p["dtype"], batch=p.get("batch", 0),
                          bcast_b=p.get("bcast_b", False))
    return _cube_plan(sched, m, low, TIR_GEMM)


def _conv(sched: Scheduled, m: Machine) -> Plan:
    p = sched.params
    fit(sched, m)
    geom = ConvGeom(**p["geom"])
    low = tl.ConvLowering(m, tl.trace(sched.key, sched.module), geom, p["n"], p["c1"], p["n1"], p["tiles"],
                          p["chunks"], p["slots"], bias=p["bias"], bn=p["bn"], resident=p["resident"],
                          group=p["group"], dtype=p["dtype"], conv_groups=p["conv_groups"], res=p["res"],
                          hswish=p.get("hswish", False))
    return _cube_plan(sched, m, low, TIR_CONV)


def _vector_plan(sched: Scheduled, m: Machine, vk: Any, describe: str, nests: int) -> Plan:
    h = sched.host
    names, out = vk.inputs, h.out_name or vk.output

    def as_given(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        return {nm: np.ascontiguousarray(a).reshape(vk.gm[nm][0]) for nm, a in zip(names, inputs)}

    return Plan(active_cores=vk.active_cores, make_program=lambda core: vk.program(m, core),
                pack=h.pack or as_given, out_name=out, out_shape=tuple(h.out_shape) or vk.gm[out][0],
                out_dtype=h.out_dtype or vk.gm[out][1], unpack=h.unpack or (lambda y: y), flops=sched.flops,
                unit="vector", info={**sched.info, "lowering": describe, "tir_nests": nests})


def _attention(sched: Scheduled, m: Machine) -> Plan:
    from .attention import AttentionLowering

    fit(sched, m)
    low = AttentionLowering(m, tl.trace(sched.key, sched.module), dict(sched.params))
    return _cube_plan(sched, m, low,
                      "TIR flash-attention nest -> AI Core instructions (backend/ascend/lower/attention.py)")


def _recurrent(sched: Scheduled, m: Machine) -> Plan:
    from .recurrent import RecurrentLowering

    fit(sched, m)
    low = RecurrentLowering(m, tl.trace(sched.key, sched.module), dict(sched.params))
    active = low.active(sched.params["block_dim"])
    h = sched.host
    return Plan(active_cores=active, make_program=lambda core: low.program(core, active), pack=h.pack,
                out_name=h.out_name, out_shape=h.out_shape, out_dtype=h.out_dtype, unpack=h.unpack,
                flops=sched.flops, unit="cube",
                info={"lowering": "TIR recurrent nest (persistent cell) -> AI Core instructions "
                                  "(backend/ascend/lower/recurrent.py)", "tir_tiles": len(low.groups), **sched.info})


def _module(sched: Scheduled):
    built = sched.module()
    return built[0] if isinstance(built, tuple) else built


def _vector(sched: Scheduled, m: Machine) -> Plan:
    from . import vector

    vk = vector.lower(_module(sched))
    return _vector_plan(sched, m, vk, "TVM s_tir schedule -> emit_insn (backend/ascend/lower/vector.py)", len(vk.nests))


def _move(sched: Scheduled, m: Machine) -> Plan:
    from . import move

    vk = move.lower(_module(sched))
    if "gm_layouts" not in sched.info:  # the views of the runs the op moves, as the module states them
        views = {nm: f"{vk.gm[nm][0]} (the runs the op moves)" for nm in (*vk.inputs, vk.output)}
        sched = replace(sched, info={"gm_layouts": views, **sched.info})
    return _vector_plan(sched, m, vk, "TVM s_tir schedule -> emit_move (backend/ascend/lower/move.py)", len(vk.nests))


def _reduce(sched: Scheduled, m: Machine) -> Plan:
    from . import reduce

    rk = reduce.lower(_module(sched))
    return _vector_plan(sched, m, rk, "TVM s_tir schedule -> emit_reduce (backend/ascend/lower/reduce.py)", rk.nests)


def _gather(sched: Scheduled, m: Machine) -> Plan:
    from . import gather

    fit(sched, m)
    gk = gather.lower(_module(sched), sched.params)
    h = sched.host
    return Plan(active_cores=gk.active_cores, make_program=lambda core: gk.program(m, core), pack=h.pack,
                out_name=gk.oname, out_shape=(gk.n // gk.bag, gk.cols), out_dtype=gk.dtype,
                unpack=h.unpack or (lambda y: y), flops=sched.flops, unit="vector",
                info={**sched.info, "lowering": "TVM s_tir schedule -> emit_gather (backend/ascend/lower/gather.py)"})


def _fm(sched: Scheduled, m: Machine) -> Plan:
    from . import fm

    fit(sched, m)
    fk = fm.lower(_module(sched), sched.params)
    h = sched.host
    return Plan(active_cores=fk.active_cores, make_program=lambda core: fk.program(m, core), pack=h.pack,
                out_name=fk.oname, out_shape=(fk.b, fk.k), out_dtype=fk.dtype, unpack=h.unpack or (lambda y: y),
                flops=sched.flops, unit="vector",
                info={**sched.info, "lowering": "TVM s_tir schedule -> emit_fm (backend/ascend/lower/fm.py)"})


LOWERINGS: dict[str, Callable[[Scheduled, Machine], Plan]] = {
    "gemm": _gemm, "conv": _conv, "vector": _vector, "move": _move, "reduce": _reduce, "attention": _attention,
    "gather": _gather, "recurrent": _recurrent, "fm": _fm}


def lower(sched: Scheduled, m: Machine) -> Plan:
    """The plan of a scheduled template config (see the module docstring)."""
    if not isinstance(sched, Scheduled):
        raise OpcFailure(f"an ascend template's apply returns a Scheduled, not {type(sched).__name__}")
    fn = LOWERINGS.get(sched.lowering)
    if fn is None:
        raise OpcFailure(f"no ascend lowering named {sched.lowering!r}; known: {', '.join(LOWERINGS)}")
    return fn(sched, m)


__all__ = ["LOWERINGS", "fit", "lower"]
