"""The element-wise family: ops that are chains of the steps in `opcompiler.ops.steps` (relu, add,
bias_add, batch_norm, bn_relu, add_relu, ew_chain, hardswish). Each declares its `chain`, which the
simulators' element-wise templates read (ascend-sim, dsp-sim); see docs/adding_an_operator.md."""
from __future__ import annotations

import numpy as np

from ... import dsl
from ..fusion import fusion_manager
from ...workload import Workload
from ..registry import OpDef, Step, register_op
from ..steps import STEPS, Chain, apply_np, apply_te, chain_flops, parse_chain
from .common import EW_DEFAULTS, EW_DTYPES, bcast_c, chan_axis, ew_shape, placeholders, reshape_c, validate_ew


def _ew_op(name: str, summary: str, n_in: int, compute, reference, flops_per: int, extra_inputs=None,
           defaults=EW_DEFAULTS, fusion: str = "", unfused=None, chain="") -> None:
    def inputs(wl: Workload) -> list:
        return [(f"x{i}" if i else "x", ew_shape(wl), wl.dtype) for i in range(n_in)] + (
            extra_inputs(wl) if extra_inputs else [])

    def comp(wl: Workload):
        ins = placeholders(inputs(wl))
        return ins, compute(wl, ins)

    register_op(OpDef(
        name=name, summary=summary, family="elemwise", defaults=defaults, dtypes=EW_DTYPES,
        compute_fn=comp, reference_fn=reference, input_specs=inputs,
        flops_fn=lambda wl: flops_per * int(np.prod(ew_shape(wl))), validate_fn=validate_ew, fusion=fusion,
        unfused_fn=unfused, chain=chain,
    ))


def _chan_inputs(*names):
    return lambda wl: [(n, (wl["c"],), wl.dtype) for n in names]


_ew_op("relu", "ReLU (vrelu)", 1, lambda wl, ins: dsl.vrelu(ins[0]),
       lambda wl, ins: np.maximum(ins[0], 0), 1, chain="relu")
_ew_op("add", "element-wise add (vadd)", 2, lambda wl, ins: dsl.vadd(ins[0], ins[1]),
       lambda wl, ins: (ins[0] + ins[1]).astype(wl.dtype), 1, chain="add")
_ew_op("bias_add", "add a per-channel bias", 1,
       lambda wl, ins: dsl.vadd(ins[0], dsl.broadcast(
           reshape_c(ins[1], wl), ew_shape(wl))),
       lambda wl, ins: (ins[0] + bcast_c(ins[1], wl)).astype(wl.dtype), 1, extra_inputs=_chan_inputs("bias"),
       chain="bias")
_ew_op("batch_norm", "inference batch norm: x * scale[c] + shift[c]", 1,
       lambda wl, ins: dsl.batch_norm(ins[0], ins[1], ins[2], wl.layout),
       lambda wl, ins: (ins[0] * bcast_c(ins[1], wl) + bcast_c(ins[2], wl)).astype(wl.dtype), 2,
       extra_inputs=_chan_inputs("scale", "shift"), chain="bn")


def _bn_relu_compute(wl, ins):
    return fusion_manager.get("fuse_bn_relu").compute(ins[0], ins[1], ins[2], wl.layout)


_ew_op("bn_relu", "fused batch norm + ReLU (one kernel)", 1, _bn_relu_compute,
       lambda wl, ins: np.maximum(ins[0] * bcast_c(ins[1], wl) + bcast_c(ins[2], wl), 0).astype(wl.dtype), 3,
       extra_inputs=_chan_inputs("scale", "shift"), fusion="fuse_bn_relu", chain="bn;relu",
       unfused=lambda wl: [Step(op="batch_norm", params=dict(wl.params), inputs=("in0", "in1", "in2")),
                           Step(op="relu", params=dict(wl.params), inputs=("s0",))])


ADD_RELU_DEFAULTS = {**EW_DEFAULTS, "bcast": 0}


def _add_relu_inputs(wl: Workload) -> list:
    shape = ew_shape(wl)
    yshape = shape
    if wl.p.get("bcast"):
        yl = [1, 1, 1, 1]
        yl[chan_axis(wl)] = wl["c"]
        yshape = tuple(yl)
    return [("input_x", shape, wl.dtype), ("input_y", yshape, wl.dtype)]


def _add_relu_compute(wl: Workload):
    ins = placeholders(_add_relu_inputs(wl))
    return ins, fusion_manager.get("fuse_add_relu").compute(ins[0], ins[1], None)


register_op(OpDef(
    name="add_relu", summary="fused add + ReLU with broadcasting (seed 002's fuse_add_relu)", family="elemwise",
    defaults=ADD_RELU_DEFAULTS, dtypes=EW_DTYPES, fusion="fuse_add_relu",
    chain=lambda wl: "bias;relu" if wl.p.get("bcast") else "add;relu",
    compute_fn=_add_relu_compute, reference_fn=lambda wl, ins: np.maximum(ins[0] + ins[1], 0).astype(wl.dtype),
    input_specs=_add_relu_inputs, flops_fn=lambda wl: 2 * int(np.prod(ew_shape(wl))), validate_fn=validate_ew,
    unfused_fn=lambda wl: [
        Step(op="add" if not wl.p.get("bcast") else "bias_add",
             params={k: v for k, v in wl.params if k != "bcast"}, inputs=("in0", "in1")),
        Step(op="relu", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("s0",)),
    ] if not wl.p.get("bcast") else [
        Step(op="bias_add", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("in0", "in1")),
        Step(op="relu", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("s0",)),
    ],
))

# Ops whose compute is their chain, read from the step vocabulary: the inputs (x, then each step's
# operands: full-shape, or (C,) per channel), the TE compute, the numpy reference and the FLOPs.


def _chain_inputs(steps: Chain, wl: Workload) -> list:
    out = [("x", ew_shape(wl), wl.dtype)]
    for i, (name, _) in enumerate(steps):
        for j, kind in enumerate(STEPS[name].operands):
            out.append((f"s{i}_{name}{j}", ew_shape(wl) if kind == "full" else (wl["c"],), wl.dtype))
    return out


def _chain_te(steps: Chain, wl: Workload, ins: list):
    shape, extra = ew_shape(wl), iter(ins[1:])

    def take(kind: str):  # a (C,) operand broadcast along the channel axis
        v = next(extra)
        return dsl.broadcast(reshape_c(v, wl), shape) if len(v.shape) == 1 else v
    return apply_te(dsl, steps, ins[0], take, shape, wl.dtype)


def _chain_ref(steps: Chain, wl: Workload, ins: list):
    return apply_np(steps, ins[0], [bcast_c(v, wl) if v.ndim == 1 else v for v in ins[1:]], wl.dtype)


def chain_op(name: str, summary: str, chain, defaults=EW_DEFAULTS, fusion: str = "", unfused=None) -> OpDef:
    """Register an element-wise op whose compute is a chain of steps (`chain`: its text, or a
    function of the workload giving it): everything else follows from the vocabulary."""
    def steps(wl: Workload) -> Chain:
        return parse_chain(chain(wl) if callable(chain) else chain)

    def compute(wl: Workload):
        ins = placeholders(_chain_inputs(steps(wl), wl))
        return ins, _chain_te(steps(wl), wl, ins)

    return register_op(OpDef(
        name=name, summary=summary, family="elemwise", defaults=defaults, dtypes=EW_DTYPES, fusion=fusion,
        compute_fn=compute, reference_fn=lambda wl, ins: _chain_ref(steps(wl), wl, ins),
        input_specs=lambda wl: _chain_inputs(steps(wl), wl),
        flops_fn=lambda wl: chain_flops(steps(wl)) * int(np.prod(ew_shape(wl))),
        validate_fn=lambda wl: (validate_ew(wl), steps(wl)) and None, unfused_fn=unfused, chain=chain,
    ))


# ew_chain: steps separated by ";" applied in order to x (the vocabulary: `opcompiler.ops.steps`).
# Its unfused form is one kernel per step.
EW_CHAIN_DEFAULTS = {**EW_DEFAULTS, "chain": "sigmoid"}


def _chain_unfused(wl: Workload) -> list[Step]:
    steps = parse_chain(wl["chain"])
    return [Step(op="ew_chain", params={**dict(wl.params), "chain": ":".join((n,) + tuple(map(str, a)))},
                 inputs=(("in0",) if i == 0 else (f"s{i - 1}",)) + tuple(
                     f"in{1 + sum(len(STEPS[m].operands) for m, _ in steps[:i]) + j}"
                     for j in range(len(STEPS[n].operands))))
            for i, (n, a) in enumerate(steps)]


chain_op("ew_chain", "element-wise chain in one kernel: chain='bn;relu', 'sigmoid', 'mul;clip:0:6', ...",
         lambda wl: str(wl["chain"]), defaults=EW_CHAIN_DEFAULTS, fusion="fuse_elemwise_chain",
         unfused=_chain_unfused)

chain_op("hardswish", "HardSwish: x * relu6(x + 3) / 6 (MobileNetV3), one kernel", "hardswish")
