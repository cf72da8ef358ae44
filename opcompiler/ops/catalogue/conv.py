"""The convolution family: conv2d and its fusions (bias, batch norm, residual add, ReLU); its output geometry."""
from __future__ import annotations

import numpy as np

from ... import dsl
from ...errors import OpcError
from ..fusion import fusion_manager
from ...workload import Workload
from .. import reference as ref
from ..registry import OpDef, Step, register_op
from ..steps import apply_np, apply_te, chain_flops, parse_chain
from .common import CUBE, FLOAT, acc_out, bcast_c, placeholders

CONV_DEFAULTS = {"n": 1, "c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3, "stride": 1, "pad": 1,
                 "dilation": 1, "groups": 1, "layout": "NCHW"}


def conv_out_hw(wl: Workload) -> tuple[int, int]:
    p = wl.p
    ho = (p["h"] + 2 * p["pad"] - p["dilation"] * (p["r"] - 1) - 1) // p["stride"] + 1
    wo = (p["w"] + 2 * p["pad"] - p["dilation"] * (p["s"] - 1) - 1) // p["stride"] + 1
    return ho, wo


def conv_out_shape(wl: Workload) -> tuple[int, ...]:
    p = wl.p
    ho, wo = conv_out_hw(wl)
    return (p["n"], p["k"], ho, wo) if p["layout"] == "NCHW" else (p["n"], ho, wo, p["k"])


def _validate_conv(wl: Workload) -> None:
    p = wl.p
    for key in ("n", "c", "h", "w", "k", "r", "s", "stride", "dilation", "groups"):
        if p[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=p[key])
    if p["pad"] < 0:
        raise OpcError("padding must be >= 0", arg="pad", value=p["pad"], expected="0 or more")
    if p["layout"] not in ("NCHW", "NHWC"):
        raise OpcError("unsupported layout", arg="layout", value=p["layout"], expected="NCHW or NHWC")
    if p["c"] % p["groups"] or p["k"] % p["groups"]:
        raise OpcError(f"groups must divide c={p['c']} and k={p['k']}", arg="groups", value=p["groups"],
                       expected="a common divisor of c and k")
    ho, wo = conv_out_hw(wl)
    if ho < 1 or wo < 1:
        raise OpcError(f"output would be {ho}x{wo}", arg="r", value=p["r"], expected="a kernel that fits the padded input")


def _conv_inputs(wl: Workload) -> list:
    p = wl.p
    x = (p["n"], p["c"], p["h"], p["w"]) if p["layout"] == "NCHW" else (p["n"], p["h"], p["w"], p["c"])
    cg = p["c"] // p["groups"]
    w = (p["k"], cg, p["r"], p["s"]) if p["layout"] == "NCHW" else (p["r"], p["s"], cg, p["k"])
    return [("data", x, wl.dtype), ("weight", w, wl.dtype)]


def _conv_kwargs(wl: Workload) -> dict:
    p = wl.p
    return dict(stride=p["stride"], padding=p["pad"], dilation=p["dilation"], groups=p["groups"], layout=p["layout"])


def _conv_flops(wl: Workload) -> int:
    p = wl.p
    return 2 * int(np.prod(conv_out_shape(wl))) * (p["c"] // p["groups"]) * p["r"] * p["s"]



def _conv_ref_acc(wl: Workload, ins) -> np.ndarray:
    p = wl.p
    return ref.conv2d(ins[0], ins[1], p["stride"], p["pad"], p["dilation"], p["groups"], p["layout"])



register_op(OpDef(
    name="conv2d", summary="2-D convolution (NCHW/OIHW or NHWC/HWIO; stride, pad, dilation, groups)",
    family="conv2d", defaults=CONV_DEFAULTS, dtypes=CUBE, preset_kind="conv",
    compute_fn=lambda wl: (lambda ins: (ins, dsl.conv2d(*ins, **_conv_kwargs(wl))))(placeholders(_conv_inputs(wl))),
    reference_fn=lambda wl, ins: _conv_ref_acc(wl, ins).astype(acc_out(wl.dtype)),
    input_specs=_conv_inputs, flops_fn=_conv_flops, validate_fn=_validate_conv,
))


def _conv_bias_inputs(wl: Workload) -> list:
    bdt = "int32" if wl.dtype == "int8" else wl.dtype
    return _conv_inputs(wl) + [("bias", (wl["k"],), bdt)]


def _conv_bias_relu_compute(wl: Workload):
    ins = placeholders(_conv_bias_inputs(wl))
    fn = fusion_manager.get("fuse_conv2d_bias_relu").compute
    return ins, fn(*ins, **_conv_kwargs(wl))


def _conv_bias_relu_ref(wl: Workload, ins) -> np.ndarray:
    acc = _conv_ref_acc(wl, ins)
    return np.maximum(acc + bcast_c(ins[2].astype(acc.dtype), wl), 0).astype(acc_out(wl.dtype))


def _ew_params(wl: Workload) -> dict:
    p = wl.p
    n, *rest = conv_out_shape(wl)
    if p["layout"] == "NCHW":
        k, h, w = rest
    else:
        h, w, k = rest
    return {"n": n, "c": k, "h": h, "w": w, "layout": p["layout"]}


def _conv_params(wl: Workload) -> dict:
    return {k: v for k, v in wl.params}


def _unfused(wl: Workload, *epilogue: tuple[str, ...]) -> list[Step]:
    """The fusion op by op: the conv2d, then each epilogue step (op, its other inputs) on the
    previous step's result."""
    steps = [Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1"))]
    for j, (op, *ins) in enumerate(epilogue):
        steps.append(Step(op=op, params=_ew_params(wl), inputs=(f"s{j}", *ins)))
    return steps


register_op(OpDef(
    name="conv2d_bias_relu", summary="fused conv2d + bias + ReLU (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=CUBE, preset_kind="conv", fusion="fuse_conv2d_bias_relu", epilogue="bias;relu",
    compute_fn=_conv_bias_relu_compute, reference_fn=_conv_bias_relu_ref, input_specs=_conv_bias_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + 2 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("bias_add", "in2"), ("relu",)),
))


def _conv_bn_inputs(wl: Workload) -> list:
    return _conv_inputs(wl) + [("scale", (wl["k"],), wl.dtype), ("shift", (wl["k"],), wl.dtype)]


def _conv_bn_relu_compute(wl: Workload):
    ins = placeholders(_conv_bn_inputs(wl))
    fn = fusion_manager.get("fuse_conv2d_bn_relu").compute
    return ins, fn(*ins, **_conv_kwargs(wl))


def _conv_bn_relu_ref(wl: Workload, ins) -> np.ndarray:
    conv = _conv_ref_acc(wl, ins).astype(wl.dtype)  # the conv result is cast before BN, as in the DSL
    y = conv * bcast_c(ins[2], wl) + bcast_c(ins[3], wl)
    return np.maximum(y, 0).astype(wl.dtype)


register_op(OpDef(
    name="conv2d_bn_relu", summary="fused conv2d + batch norm (inference) + ReLU (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn_relu", epilogue="bn;relu",
    compute_fn=_conv_bn_relu_compute, reference_fn=_conv_bn_relu_ref, input_specs=_conv_bn_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + 3 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("batch_norm", "in2", "in3"), ("relu",)),
))


# conv + bias with no activation, and conv + bias / BN + a residual add (+ ReLU): the groups
# torch.onnx.export's ResNets are made of (BN folded into the conv's bias). The residual is an
# output-shaped tensor the template reads in its epilogue (TBE's conv + eltwise fusion).


def _conv_bias_compute(wl: Workload):
    ins = placeholders(_conv_bias_inputs(wl))
    return ins, fusion_manager.get("fuse_conv2d_bias").compute(*ins, **_conv_kwargs(wl))


def _conv_bias_ref(wl: Workload, ins) -> np.ndarray:
    acc = _conv_ref_acc(wl, ins)
    return (acc + bcast_c(ins[2].astype(acc.dtype), wl)).astype(acc_out(wl.dtype))


register_op(OpDef(
    name="conv2d_bias", summary="fused conv2d + bias, no activation (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=CUBE, preset_kind="conv", fusion="fuse_conv2d_bias", epilogue="bias",
    compute_fn=_conv_bias_compute, reference_fn=_conv_bias_ref, input_specs=_conv_bias_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("bias_add", "in2")),
))


def _residual(wl: Workload) -> tuple:
    return ("residual", conv_out_shape(wl), wl.dtype)


def _conv_bias_add_inputs(wl: Workload) -> list:
    return _conv_bias_inputs(wl) + [_residual(wl)]


def _conv_bias_add_op(relu: bool) -> None:
    name = "conv2d_bias_add_relu" if relu else "conv2d_bias_add"

    def compute(wl: Workload):
        ins = placeholders(_conv_bias_add_inputs(wl))
        return ins, fusion_manager.get(f"fuse_{name}").compute(*ins, **_conv_kwargs(wl))

    def reference(wl: Workload, ins) -> np.ndarray:
        y = (_conv_bias_ref(wl, ins) + ins[3]).astype(wl.dtype)  # the residual is added in the output dtype
        return np.maximum(y, 0).astype(wl.dtype) if relu else y

    register_op(OpDef(
        name=name, summary=f"fused conv2d + bias + residual add{' + ReLU' if relu else ''} (one kernel; the residual "
                           "read in the epilogue)", family="conv2d",
        defaults=CONV_DEFAULTS, dtypes=FLOAT, preset_kind="conv", fusion=f"fuse_{name}", epilogue="bias;add;relu" if relu else "bias;add",
        compute_fn=compute, reference_fn=reference, input_specs=_conv_bias_add_inputs,
        flops_fn=lambda wl: _conv_flops(wl) + (3 if relu else 2) * int(np.prod(conv_out_shape(wl))),
        validate_fn=_validate_conv,
        unfused_fn=lambda wl: _unfused(wl, ("bias_add", "in2"), ("add", "in3"), *([("relu",)] if relu else [])),
    ))


_conv_bias_add_op(False)
_conv_bias_add_op(True)


# conv + bn without an activation (ResNet's second conv before the residual add), and with a
# residual add and ReLU (the ONNX graphs' groups)


@fusion_manager.register("fuse_conv2d_bn", ops=("conv2d", "batch_norm"))
def _fuse_conv2d_bn_compute(data, weight, scale, shift, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
                            kernel_name="fuse_conv2d_bn"):
    return dsl.batch_norm(dsl.conv2d(data, weight, stride, padding, dilation, groups, layout), scale, shift, layout)


def _conv_bn_compute(wl: Workload):
    ins = placeholders(_conv_bn_inputs(wl))
    return ins, fusion_manager.get("fuse_conv2d_bn").compute(*ins, **_conv_kwargs(wl))


register_op(OpDef(
    name="conv2d_bn", summary="fused conv2d + batch norm (inference), no activation (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn", epilogue="bn",
    compute_fn=_conv_bn_compute,
    reference_fn=lambda wl, ins: (_conv_ref_acc(wl, ins).astype(wl.dtype) * bcast_c(ins[2], wl)
                                  + bcast_c(ins[3], wl)).astype(wl.dtype),
    input_specs=_conv_bn_inputs, flops_fn=lambda wl: _conv_flops(wl) + 2 * int(np.prod(conv_out_shape(wl))),
    validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("batch_norm", "in2", "in3")),
))


def _conv_bn_add_relu_compute(wl: Workload):
    ins = placeholders(_conv_bn_inputs(wl) + [_residual(wl)])
    return ins, fusion_manager.get("fuse_conv2d_bn_add_relu").compute(*ins, **_conv_kwargs(wl))


def _conv_bn_add_relu_ref(wl: Workload, ins) -> np.ndarray:
    y = (_conv_ref_acc(wl, ins).astype(wl.dtype) * bcast_c(ins[2], wl) + bcast_c(ins[3], wl)).astype(wl.dtype)
    return np.maximum((y + ins[4]).astype(wl.dtype), 0).astype(wl.dtype)


register_op(OpDef(
    name="conv2d_bn_add_relu", summary="fused conv2d + batch norm + residual add + ReLU (one kernel; the residual "
                                       "read in the epilogue)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn_add_relu", epilogue="bn;add;relu",
    compute_fn=_conv_bn_add_relu_compute, reference_fn=_conv_bn_add_relu_ref,
    input_specs=lambda wl: _conv_bn_inputs(wl) + [_residual(wl)],
    flops_fn=lambda wl: _conv_flops(wl) + 4 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("batch_norm", "in2", "in3"), ("add", "in4"), ("relu",)),
))



# conv + bias + HardSwish (MobileNetV3's conv block): a fusion pattern made of steps the vocabulary
# has (`opcompiler.ops.steps`), declared here alone; its `epilogue` tells each template whether it can
# lower it (docs/adding_an_operator.md)
_HSWISH = parse_chain("hardswish")


@fusion_manager.register("fuse_conv2d_bias_hardswish", ops=("conv2d", "bias_add", "hardswish"))
def _fuse_conv2d_bias_hardswish_compute(data, weight, bias, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
                                        kernel_name="fuse_conv2d_bias_hardswish"):
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout, bias=bias)
    return apply_te(dsl, _HSWISH, conv, None, [int(d) for d in conv.shape], str(conv.dtype))


register_op(OpDef(
    name="conv2d_bias_hardswish", summary="fused conv2d + bias + HardSwish (one kernel; MobileNetV3)",
    family="conv2d", defaults=CONV_DEFAULTS, dtypes=FLOAT, preset_kind="conv",
    fusion="fuse_conv2d_bias_hardswish", epilogue="bias;hardswish",
    compute_fn=lambda wl: (lambda ins: (ins, fusion_manager.get("fuse_conv2d_bias_hardswish").compute(
        *ins, **_conv_kwargs(wl))))(placeholders(_conv_bias_inputs(wl))),
    reference_fn=lambda wl, ins: apply_np(_HSWISH, _conv_bias_ref(wl, ins), [], wl.dtype),
    input_specs=_conv_bias_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + (1 + chain_flops(_HSWISH)) * int(np.prod(conv_out_shape(wl))),
    validate_fn=_validate_conv,
    unfused_fn=lambda wl: _unfused(wl, ("bias_add", "in2"), ("hardswish",)),
))
