"""The built-in ops. Each is registered once, with compute, reference, FLOPs and presets."""
from __future__ import annotations

import numpy as np
from tvm import te

from .. import dsl
from ..errors import OpcError
from ..fusion import fusion_manager
from ..workload import Workload
from . import reference as ref
from .registry import OpDef, Step, register_op

_FLOAT = ("float32", "float16")
_CUBE = ("float32", "float16", "int8")


def _acc_out(dtype: str) -> str:
    return {"float16": "float16", "float32": "float32", "int8": "int32"}[dtype]


# ---------------------------------------------------------------- convolution family

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


def _placeholders(specs) -> list:
    return [te.placeholder(s, d, name=n) for n, s, d in specs]


def _conv_ref_acc(wl: Workload, ins) -> np.ndarray:
    p = wl.p
    return ref.conv2d(ins[0], ins[1], p["stride"], p["pad"], p["dilation"], p["groups"], p["layout"])


def _chan_axis(wl: Workload) -> int:
    return 1 if wl.p.get("layout", "NCHW") == "NCHW" else 3


def _bcast_c(v: np.ndarray, wl: Workload, ndim: int = 4) -> np.ndarray:
    shape = [1] * ndim
    shape[_chan_axis(wl)] = -1
    return v.reshape(shape)


register_op(OpDef(
    name="conv2d", summary="2-D convolution (NCHW/OIHW or NHWC/HWIO; stride, pad, dilation, groups)",
    family="conv2d", defaults=CONV_DEFAULTS, dtypes=_CUBE, preset_kind="conv",
    compute_fn=lambda wl: (lambda ins: (ins, dsl.conv2d(*ins, **_conv_kwargs(wl))))(_placeholders(_conv_inputs(wl))),
    reference_fn=lambda wl, ins: _conv_ref_acc(wl, ins).astype(_acc_out(wl.dtype)),
    input_specs=_conv_inputs, flops_fn=_conv_flops, validate_fn=_validate_conv,
))


def _conv_bias_inputs(wl: Workload) -> list:
    bdt = "int32" if wl.dtype == "int8" else wl.dtype
    return _conv_inputs(wl) + [("bias", (wl["k"],), bdt)]


def _conv_bias_relu_compute(wl: Workload):
    ins = _placeholders(_conv_bias_inputs(wl))
    fn = fusion_manager.get("fuse_conv2d_bias_relu").compute
    return ins, fn(*ins, **_conv_kwargs(wl))


def _conv_bias_relu_ref(wl: Workload, ins) -> np.ndarray:
    acc = _conv_ref_acc(wl, ins)
    return np.maximum(acc + _bcast_c(ins[2].astype(acc.dtype), wl), 0).astype(_acc_out(wl.dtype))


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


register_op(OpDef(
    name="conv2d_bias_relu", summary="fused conv2d + bias + ReLU (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=_CUBE, preset_kind="conv", fusion="fuse_conv2d_bias_relu",
    compute_fn=_conv_bias_relu_compute, reference_fn=_conv_bias_relu_ref, input_specs=_conv_bias_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + 2 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: [
        Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
        Step(op="bias_add", params=_ew_params(wl), inputs=("s0", "in2")),
        Step(op="relu", params=_ew_params(wl), inputs=("s1",)),
    ],
))


def _conv_bn_inputs(wl: Workload) -> list:
    return _conv_inputs(wl) + [("scale", (wl["k"],), wl.dtype), ("shift", (wl["k"],), wl.dtype)]


def _conv_bn_relu_compute(wl: Workload):
    ins = _placeholders(_conv_bn_inputs(wl))
    fn = fusion_manager.get("fuse_conv2d_bn_relu").compute
    return ins, fn(*ins, **_conv_kwargs(wl))


def _conv_bn_relu_ref(wl: Workload, ins) -> np.ndarray:
    conv = _conv_ref_acc(wl, ins).astype(wl.dtype)  # the conv result is cast before BN, as in the DSL
    y = conv * _bcast_c(ins[2], wl) + _bcast_c(ins[3], wl)
    return np.maximum(y, 0).astype(wl.dtype)


register_op(OpDef(
    name="conv2d_bn_relu", summary="fused conv2d + batch norm (inference) + ReLU (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=_FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn_relu",
    compute_fn=_conv_bn_relu_compute, reference_fn=_conv_bn_relu_ref, input_specs=_conv_bn_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + 3 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: [
        Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
        Step(op="batch_norm", params=_ew_params(wl), inputs=("s0", "in2", "in3")),
        Step(op="relu", params=_ew_params(wl), inputs=("s1",)),
    ],
))


# conv + bias with no activation, and conv + bias / BN + a residual add (+ ReLU): the groups
# torch.onnx.export's ResNets are made of (BN folded into the conv's bias). The residual is an
# output-shaped tensor the template reads in its epilogue (TBE's conv + eltwise fusion).


def _conv_bias_compute(wl: Workload):
    ins = _placeholders(_conv_bias_inputs(wl))
    return ins, fusion_manager.get("fuse_conv2d_bias").compute(*ins, **_conv_kwargs(wl))


def _conv_bias_ref(wl: Workload, ins) -> np.ndarray:
    acc = _conv_ref_acc(wl, ins)
    return (acc + _bcast_c(ins[2].astype(acc.dtype), wl)).astype(_acc_out(wl.dtype))


register_op(OpDef(
    name="conv2d_bias", summary="fused conv2d + bias, no activation (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=_CUBE, preset_kind="conv", fusion="fuse_conv2d_bias",
    compute_fn=_conv_bias_compute, reference_fn=_conv_bias_ref, input_specs=_conv_bias_inputs,
    flops_fn=lambda wl: _conv_flops(wl) + int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: [
        Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
        Step(op="bias_add", params=_ew_params(wl), inputs=("s0", "in2")),
    ],
))


def _residual(wl: Workload) -> tuple:
    return ("residual", conv_out_shape(wl), wl.dtype)


def _conv_bias_add_inputs(wl: Workload) -> list:
    return _conv_bias_inputs(wl) + [_residual(wl)]


def _conv_bias_add_op(relu: bool) -> None:
    name = "conv2d_bias_add_relu" if relu else "conv2d_bias_add"

    def compute(wl: Workload):
        ins = _placeholders(_conv_bias_add_inputs(wl))
        return ins, fusion_manager.get(f"fuse_{name}").compute(*ins, **_conv_kwargs(wl))

    def reference(wl: Workload, ins) -> np.ndarray:
        y = (_conv_bias_ref(wl, ins) + ins[3]).astype(wl.dtype)  # the residual is added in the output dtype
        return np.maximum(y, 0).astype(wl.dtype) if relu else y

    register_op(OpDef(
        name=name, summary=f"fused conv2d + bias + residual add{' + ReLU' if relu else ''} (one kernel; the residual "
                           "read in the epilogue)", family="conv2d",
        defaults=CONV_DEFAULTS, dtypes=_FLOAT, preset_kind="conv", fusion=f"fuse_{name}",
        compute_fn=compute, reference_fn=reference, input_specs=_conv_bias_add_inputs,
        flops_fn=lambda wl: _conv_flops(wl) + (3 if relu else 2) * int(np.prod(conv_out_shape(wl))),
        validate_fn=_validate_conv,
        unfused_fn=lambda wl: [
            Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
            Step(op="bias_add", params=_ew_params(wl), inputs=("s0", "in2")),
            Step(op="add", params=_ew_params(wl), inputs=("s1", "in3")),
        ] + ([Step(op="relu", params=_ew_params(wl), inputs=("s2",))] if relu else []),
    ))


_conv_bias_add_op(False)
_conv_bias_add_op(True)

# ---------------------------------------------------------------- matmul family

MM_DEFAULTS = {"m": 16, "k": 256, "n": 1024, "trans_a": 0, "trans_b": 0}


def _validate_mm(wl: Workload) -> None:
    for key in ("m", "k", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    for key in ("trans_a", "trans_b"):
        if key in wl.p and wl[key] not in (0, 1):
            raise OpcError("must be 0 or 1", arg=key, value=wl[key])


def _mm_inputs(wl: Workload) -> list:
    p = wl.p
    a = (p["k"], p["m"]) if p.get("trans_a") else (p["m"], p["k"])
    b = (p["n"], p["k"]) if p.get("trans_b") else (p["k"], p["n"])
    return [("tensor_a", a, wl.dtype), ("tensor_b", b, wl.dtype)]


def _mm_ref_acc(wl: Workload, ins) -> np.ndarray:
    return ref.matmul(ins[0], ins[1], bool(wl.p.get("trans_a")), bool(wl.p.get("trans_b")))


register_op(OpDef(
    name="matmul", summary="C = A @ B (transpose flags; fully connected)", family="matmul",
    defaults=MM_DEFAULTS, dtypes=_CUBE, preset_kind="matmul",
    compute_fn=lambda wl: (lambda ins: (ins, dsl.matmul(*ins, bool(wl["trans_a"]), bool(wl["trans_b"]))))(
        _placeholders(_mm_inputs(wl))),
    reference_fn=lambda wl, ins: _mm_ref_acc(wl, ins).astype(_acc_out(wl.dtype)),
    input_specs=_mm_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"], validate_fn=_validate_mm,
))

MMB_DEFAULTS = {"m": 16, "k": 256, "n": 1024, "trans_a": 0, "trans_b": 0}


def _mmb_inputs(wl: Workload) -> list:
    bdt = "int32" if wl.dtype == "int8" else wl.dtype
    return _mm_inputs(wl) + [("bias", (wl["n"],), bdt)]


def _mmb_compute(wl: Workload):
    ins = _placeholders(_mmb_inputs(wl))
    return ins, fusion_manager.get("fuse_matmul_bias_relu").compute(*ins, bool(wl["trans_a"]), bool(wl["trans_b"]))


register_op(OpDef(
    name="matmul_bias_relu", summary="fused matmul + bias + ReLU (fully connected layer)", family="matmul",
    defaults=MMB_DEFAULTS, dtypes=_CUBE, preset_kind="matmul", fusion="fuse_matmul_bias_relu",
    compute_fn=_mmb_compute,
    reference_fn=lambda wl, ins: np.maximum(_mm_ref_acc(wl, ins) + ins[2].astype(np.float32 if wl.dtype != "int8"
                                                                                   else np.int32), 0
                                            ).astype(_acc_out(wl.dtype)),
    input_specs=_mmb_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"] + 2 * wl["m"] * wl["n"],
    validate_fn=_validate_mm,
    unfused_fn=lambda wl: [
        Step(op="matmul", params=dict(wl.params), inputs=("in0", "in1")),
        Step(op="bias_add", params={"n": 1, "c": wl["n"], "h": 1, "w": wl["m"], "layout": "NHWC"}, inputs=("s0", "in2")),
        Step(op="relu", params={"n": 1, "c": wl["n"], "h": 1, "w": wl["m"], "layout": "NHWC"}, inputs=("s1",)),
    ],
))

# ---------------------------------------------------------------- element-wise family

EW_DEFAULTS = {"n": 1, "c": 64, "h": 56, "w": 56, "layout": "NCHW"}
_EW_DTYPES = ("float32", "float16")


def _ew_shape(wl: Workload) -> tuple[int, ...]:
    p = wl.p
    return (p["n"], p["c"], p["h"], p["w"]) if p["layout"] == "NCHW" else (p["n"], p["h"], p["w"], p["c"])


def _validate_ew(wl: Workload) -> None:
    for key in ("n", "c", "h", "w"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    if wl.layout not in ("NCHW", "NHWC"):
        raise OpcError("unsupported layout", arg="layout", value=wl.layout, expected="NCHW or NHWC")
    if wl.p.get("bcast", 0) not in (0, 1):
        raise OpcError("must be 0 (same shapes) or 1 (y is per-channel and broadcast)", arg="bcast",
                       value=wl.p.get("bcast"))


def _ew_op(name: str, summary: str, n_in: int, compute, reference, flops_per: int, extra_inputs=None,
           defaults=EW_DEFAULTS, fusion: str = "", unfused=None) -> None:
    def inputs(wl: Workload) -> list:
        return [(f"x{i}" if i else "x", _ew_shape(wl), wl.dtype) for i in range(n_in)] + (
            extra_inputs(wl) if extra_inputs else [])

    def comp(wl: Workload):
        ins = _placeholders(inputs(wl))
        return ins, compute(wl, ins)

    register_op(OpDef(
        name=name, summary=summary, family="elemwise", defaults=defaults, dtypes=_EW_DTYPES,
        compute_fn=comp, reference_fn=reference, input_specs=inputs,
        flops_fn=lambda wl: flops_per * int(np.prod(_ew_shape(wl))), validate_fn=_validate_ew, fusion=fusion,
        unfused_fn=unfused,
    ))


def _chan_inputs(*names):
    return lambda wl: [(n, (wl["c"],), wl.dtype) for n in names]


_ew_op("relu", "ReLU (vrelu)", 1, lambda wl, ins: dsl.vrelu(ins[0]),
       lambda wl, ins: np.maximum(ins[0], 0), 1)
_ew_op("add", "element-wise add (vadd)", 2, lambda wl, ins: dsl.vadd(ins[0], ins[1]),
       lambda wl, ins: (ins[0] + ins[1]).astype(wl.dtype), 1)
_ew_op("bias_add", "add a per-channel bias", 1,
       lambda wl, ins: dsl.vadd(ins[0], dsl.broadcast(
           _reshape_c(ins[1], wl), _ew_shape(wl))),
       lambda wl, ins: (ins[0] + _bcast_c(ins[1], wl)).astype(wl.dtype), 1, extra_inputs=_chan_inputs("bias"))
_ew_op("batch_norm", "inference batch norm: x * scale[c] + shift[c]", 1,
       lambda wl, ins: dsl.batch_norm(ins[0], ins[1], ins[2], wl.layout),
       lambda wl, ins: (ins[0] * _bcast_c(ins[1], wl) + _bcast_c(ins[2], wl)).astype(wl.dtype), 2,
       extra_inputs=_chan_inputs("scale", "shift"))


def _bn_relu_compute(wl, ins):
    return fusion_manager.get("fuse_bn_relu").compute(ins[0], ins[1], ins[2], wl.layout)


_ew_op("bn_relu", "fused batch norm + ReLU (one kernel)", 1, _bn_relu_compute,
       lambda wl, ins: np.maximum(ins[0] * _bcast_c(ins[1], wl) + _bcast_c(ins[2], wl), 0).astype(wl.dtype), 3,
       extra_inputs=_chan_inputs("scale", "shift"), fusion="fuse_bn_relu",
       unfused=lambda wl: [Step(op="batch_norm", params=dict(wl.params), inputs=("in0", "in1", "in2")),
                           Step(op="relu", params=dict(wl.params), inputs=("s0",))])


def _reshape_c(t: te.Tensor, wl: Workload) -> te.Tensor:
    """A (C,) tensor viewed as (1, C, 1, 1) or (1, 1, 1, C) for broadcasting."""
    ax = _chan_axis(wl)
    shape = [1, 1, 1, 1]
    shape[ax] = int(t.shape[0])
    return te.compute(shape, lambda *i: t[i[ax]], name=f"{t.op.name}_view", tag="elemwise|view")


ADD_RELU_DEFAULTS = {**EW_DEFAULTS, "bcast": 0}


def _add_relu_inputs(wl: Workload) -> list:
    shape = _ew_shape(wl)
    yshape = shape
    if wl.p.get("bcast"):
        yl = [1, 1, 1, 1]
        yl[_chan_axis(wl)] = wl["c"]
        yshape = tuple(yl)
    return [("input_x", shape, wl.dtype), ("input_y", yshape, wl.dtype)]


def _add_relu_compute(wl: Workload):
    ins = _placeholders(_add_relu_inputs(wl))
    return ins, fusion_manager.get("fuse_add_relu").compute(ins[0], ins[1], None)


register_op(OpDef(
    name="add_relu", summary="fused add + ReLU with broadcasting (seed 002's fuse_add_relu)", family="elemwise",
    defaults=ADD_RELU_DEFAULTS, dtypes=_EW_DTYPES, fusion="fuse_add_relu",
    compute_fn=_add_relu_compute, reference_fn=lambda wl, ins: np.maximum(ins[0] + ins[1], 0).astype(wl.dtype),
    input_specs=_add_relu_inputs, flops_fn=lambda wl: 2 * int(np.prod(_ew_shape(wl))), validate_fn=_validate_ew,
    unfused_fn=lambda wl: [
        Step(op="add" if not wl.p.get("bcast") else "bias_add",
             params={k: v for k, v in wl.params if k != "bcast"}, inputs=("in0", "in1")),
        Step(op="relu", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("s0",)),
    ] if not wl.p.get("bcast") else [
        Step(op="bias_add", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("in0", "in1")),
        Step(op="relu", params={k: v for k, v in wl.params if k != "bcast"}, inputs=("s0",)),
    ],
))

# ---------------------------------------------------------------- pooling and reductions

POOL_DEFAULTS = {"n": 1, "c": 64, "h": 112, "w": 112, "kernel": 3, "stride": 2, "pad": 1, "mode": "max",
                 "layout": "NCHW"}


def _pool_out(wl: Workload) -> tuple[int, int]:
    p = wl.p
    return ((p["h"] + 2 * p["pad"] - p["kernel"]) // p["stride"] + 1,
            (p["w"] + 2 * p["pad"] - p["kernel"]) // p["stride"] + 1)


def _validate_pool(wl: Workload) -> None:
    _validate_ew(wl)
    if wl["mode"] not in ("max", "avg"):
        raise OpcError("unsupported pool mode", arg="mode", value=wl["mode"], expected="max or avg")
    if wl["pad"] < 0:
        raise OpcError("padding must be >= 0", arg="pad", value=wl["pad"])
    if wl["pad"] * 2 >= wl["kernel"] + 1 and wl["pad"] > 0 and wl["pad"] >= wl["kernel"]:
        raise OpcError("padding must be smaller than the kernel", arg="pad", value=wl["pad"],
                       expected=f"< kernel={wl['kernel']}")
    if min(_pool_out(wl)) < 1:
        raise OpcError("window larger than the padded input", arg="kernel", value=wl["kernel"])


register_op(OpDef(
    name="pool2d", summary="max or average pooling (mode=max|avg)", family="pool", defaults=POOL_DEFAULTS,
    dtypes=_EW_DTYPES,
    compute_fn=lambda wl: (lambda ins: (ins, dsl.pool2d(ins[0], wl["kernel"], wl["stride"], wl["pad"], wl["mode"],
                                                        wl.layout)))(
        _placeholders([("x", _ew_shape(wl), wl.dtype)])),
    reference_fn=lambda wl, ins: ref.pool2d(ins[0], wl["kernel"], wl["stride"], wl["pad"], wl["mode"], wl.layout),
    input_specs=lambda wl: [("x", _ew_shape(wl), wl.dtype)],
    flops_fn=lambda wl: wl["n"] * wl["c"] * int(np.prod(_pool_out(wl))) * wl["kernel"] ** 2,
    validate_fn=_validate_pool,
))

RED_DEFAULTS = {"m": 1024, "n": 1024}


def _validate_red(wl: Workload) -> None:
    for key in ("m", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])


for _name, _fn, _np in (("reduce_sum", dsl.sum, np.sum), ("reduce_max", dsl.reduce_max, np.max)):
    register_op(OpDef(
        name=_name, summary=f"{_name.split('_')[1]} over the last axis of an (m, n) tensor", family="reduce",
        defaults=RED_DEFAULTS, dtypes=_EW_DTYPES,
        compute_fn=(lambda f: lambda wl: (lambda ins: (ins, f(ins[0], axis=1)))(
            _placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])))(_fn),
        reference_fn=(lambda f: lambda wl, ins: f(ins[0].astype(np.float32), axis=1).astype(wl.dtype))(_np),
        input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)],
        flops_fn=lambda wl: wl["m"] * wl["n"], validate_fn=_validate_red,
    ))



def _mean_compute(wl: Workload):
    (x,) = ins = _placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])
    return ins, dsl.vmuls(dsl.sum(x, axis=1), 1.0 / wl["n"])


register_op(OpDef(
    name="reduce_mean", summary="mean over the last axis of an (m, n) tensor (global average pooling as a row "
                                "reduction: the sum, then one multiply by 1/n)", family="reduce",
    defaults=RED_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_mean_compute,
    reference_fn=lambda wl, ins: (ins[0].astype(np.float32).sum(axis=1) * np.float32(1.0 / wl["n"])).astype(wl.dtype),
    input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)],
    flops_fn=lambda wl: wl["m"] * wl["n"] + wl["m"], validate_fn=_validate_red,
))

# ---------------------------------------------------------------- ops added for ONNX graphs (opcompiler.graph)
# conv+bn and matmul+bias without an activation (ResNet's second conv before the residual add,
# FC layers that end a head), a general element-wise chain (Sigmoid, Clip, Mul and any fused run of
# element-wise ops), channel concat and row softmax.


@fusion_manager.register("fuse_conv2d_bn", ops=("conv2d", "batch_norm"))
def _fuse_conv2d_bn_compute(data, weight, scale, shift, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
                            kernel_name="fuse_conv2d_bn"):
    return dsl.batch_norm(dsl.conv2d(data, weight, stride, padding, dilation, groups, layout), scale, shift, layout)


def _conv_bn_compute(wl: Workload):
    ins = _placeholders(_conv_bn_inputs(wl))
    return ins, fusion_manager.get("fuse_conv2d_bn").compute(*ins, **_conv_kwargs(wl))


register_op(OpDef(
    name="conv2d_bn", summary="fused conv2d + batch norm (inference), no activation (one kernel)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=_FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn",
    compute_fn=_conv_bn_compute,
    reference_fn=lambda wl, ins: (_conv_ref_acc(wl, ins).astype(wl.dtype) * _bcast_c(ins[2], wl)
                                  + _bcast_c(ins[3], wl)).astype(wl.dtype),
    input_specs=_conv_bn_inputs, flops_fn=lambda wl: _conv_flops(wl) + 2 * int(np.prod(conv_out_shape(wl))),
    validate_fn=_validate_conv,
    unfused_fn=lambda wl: [
        Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
        Step(op="batch_norm", params=_ew_params(wl), inputs=("s0", "in2", "in3")),
    ],
))


def _conv_bn_add_relu_compute(wl: Workload):
    ins = _placeholders(_conv_bn_inputs(wl) + [_residual(wl)])
    return ins, fusion_manager.get("fuse_conv2d_bn_add_relu").compute(*ins, **_conv_kwargs(wl))


def _conv_bn_add_relu_ref(wl: Workload, ins) -> np.ndarray:
    y = (_conv_ref_acc(wl, ins).astype(wl.dtype) * _bcast_c(ins[2], wl) + _bcast_c(ins[3], wl)).astype(wl.dtype)
    return np.maximum((y + ins[4]).astype(wl.dtype), 0).astype(wl.dtype)


register_op(OpDef(
    name="conv2d_bn_add_relu", summary="fused conv2d + batch norm + residual add + ReLU (one kernel; the residual "
                                       "read in the epilogue)", family="conv2d",
    defaults=CONV_DEFAULTS, dtypes=_FLOAT, preset_kind="conv", fusion="fuse_conv2d_bn_add_relu",
    compute_fn=_conv_bn_add_relu_compute, reference_fn=_conv_bn_add_relu_ref,
    input_specs=lambda wl: _conv_bn_inputs(wl) + [_residual(wl)],
    flops_fn=lambda wl: _conv_flops(wl) + 4 * int(np.prod(conv_out_shape(wl))), validate_fn=_validate_conv,
    unfused_fn=lambda wl: [
        Step(op="conv2d", params=_conv_params(wl), inputs=("in0", "in1")),
        Step(op="batch_norm", params=_ew_params(wl), inputs=("s0", "in2", "in3")),
        Step(op="add", params=_ew_params(wl), inputs=("s1", "in4")),
        Step(op="relu", params=_ew_params(wl), inputs=("s2",)),
    ],
))


@fusion_manager.register("fuse_matmul_bias", ops=("matmul", "bias_add"))
def _fuse_matmul_bias_compute(tensor_a, tensor_b, bias, trans_a=False, trans_b=False, kernel_name="fuse_matmul_bias"):
    return dsl.matmul(tensor_a, tensor_b, trans_a, trans_b, bias=bias)


def _mm_bias_compute(wl: Workload):
    ins = _placeholders(_mmb_inputs(wl))
    return ins, fusion_manager.get("fuse_matmul_bias").compute(*ins, bool(wl["trans_a"]), bool(wl["trans_b"]))


register_op(OpDef(
    name="matmul_bias", summary="fused matmul + bias, no activation (fully connected layer)", family="matmul",
    defaults=MMB_DEFAULTS, dtypes=_CUBE, preset_kind="matmul", fusion="fuse_matmul_bias",
    compute_fn=_mm_bias_compute,
    reference_fn=lambda wl, ins: (_mm_ref_acc(wl, ins) + ins[2].astype(np.float32 if wl.dtype != "int8" else np.int32)
                                  ).astype(_acc_out(wl.dtype)),
    input_specs=_mmb_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"] + wl["m"] * wl["n"],
    validate_fn=_validate_mm,
    unfused_fn=lambda wl: [
        Step(op="matmul", params=dict(wl.params), inputs=("in0", "in1")),
        Step(op="bias_add", params={"n": 1, "c": wl["n"], "h": 1, "w": wl["m"], "layout": "NHWC"}, inputs=("s0", "in2")),
    ],
))

# ew_chain: steps separated by ";" applied in order to x. Unary: relu, sigmoid, clip:LO:HI, affine:A:B (x*A+B),
# pow:P (x**P for x > 0, as exp(P*ln x): LRN's denominator).
# With a full-shape operand: add, mul. With per-channel (C,) operands: bias, scale, bn (scale, shift).
EW_CHAIN_DEFAULTS = {**EW_DEFAULTS, "chain": "sigmoid"}
_CHAIN_EXTRA = {"relu": (), "sigmoid": (), "clip": (), "affine": (), "pow": (), "add": ("full",), "mul": ("full",), "bias": ("chan",),
                "scale": ("chan",), "bn": ("chan", "chan")}


def _chain_steps(wl: Workload) -> list[tuple[str, tuple[float, ...]]]:
    steps = []
    for item in filter(None, str(wl["chain"]).split(";")):
        name, *args = item.split(":")
        if name not in _CHAIN_EXTRA:
            raise OpcError(f"unknown element-wise step {name!r}", arg="chain", value=wl["chain"],
                           expected="steps among " + ", ".join(_CHAIN_EXTRA) + " separated by ';'")
        arity = {"clip": 2, "affine": 2, "pow": 1}.get(name, 0)
        if len(args) != arity:
            want = {"clip": "2 bounds (clip:LO:HI)", "affine": "2 numbers (affine:A:B = x*A+B)",
                    "pow": "1 exponent (pow:P)"}
            raise OpcError(f"step {item!r} takes {want.get(name, 'no arguments')}", arg="chain", value=wl["chain"])
        steps.append((name, tuple(float(a) for a in args)))
    if not steps:
        raise OpcError("empty chain", arg="chain", value=wl["chain"], expected="e.g. bn;relu or sigmoid")
    return steps


def _chain_inputs(wl: Workload) -> list:
    out = [("x", _ew_shape(wl), wl.dtype)]
    for i, (name, _) in enumerate(_chain_steps(wl)):
        for j, kind in enumerate(_CHAIN_EXTRA[name]):
            out.append((f"s{i}_{name}{j}", _ew_shape(wl) if kind == "full" else (wl["c"],), wl.dtype))
    return out


def _chain_apply(wl: Workload, ins: list, xp) -> object:
    """One implementation for the TE compute (xp=None) and the numpy reference (xp=np)."""
    x, extra = ins[0], iter(ins[1:])
    for name, args in _chain_steps(wl):
        vals = [next(extra) for _ in _CHAIN_EXTRA[name]]
        if xp is not None:
            vals = [_bcast_c(v, wl) if v.ndim == 1 else v for v in vals]
            one = np.asarray(1, wl.dtype)
            x = {"relu": lambda: np.maximum(x, 0), "sigmoid": lambda: one / (one + np.exp(-x)),
                 "clip": lambda: np.clip(x, *np.asarray(args, wl.dtype)), "add": lambda: x + vals[0],
                 "affine": lambda: x * np.asarray(args[0], wl.dtype) + np.asarray(args[1], wl.dtype),
                 "pow": lambda: np.exp(np.log(x.astype(np.float32)) * np.float32(args[0])),
                 "mul": lambda: x * vals[0], "bias": lambda: x + vals[0], "scale": lambda: x * vals[0],
                 "bn": lambda: x * vals[0] + vals[1]}[name]().astype(wl.dtype)
            continue
        shape = _ew_shape(wl)
        vals = [dsl.broadcast(_reshape_c(v, wl), shape) if len(v.shape) == 1 else v for v in vals]
        x = {"relu": lambda: dsl.vrelu(x), "sigmoid": lambda: dsl.vrec(dsl.vadds(dsl.vexp(dsl.vmuls(x, -1.0)), 1.0)),
             "clip": lambda: dsl.vmax(dsl.vmin(x, dsl.broadcast(args[1], shape, wl.dtype)),
                                      dsl.broadcast(args[0], shape, wl.dtype)),
             "affine": lambda: dsl.vadds(dsl.vmuls(x, args[0]), args[1]),
             "pow": lambda: dsl.vexp(dsl.vmuls(dsl.vlog(x), args[0])),
             "add": lambda: dsl.vadd(x, vals[0]), "mul": lambda: dsl.vmul(x, vals[0]),
             "bias": lambda: dsl.vadd(x, vals[0]), "scale": lambda: dsl.vmul(x, vals[0]),
             "bn": lambda: dsl.vadd(dsl.vmul(x, vals[0]), vals[1])}[name]()
    return x


def _chain_compute(wl: Workload):
    ins = _placeholders(_chain_inputs(wl))
    return ins, _chain_apply(wl, ins, None)


register_op(OpDef(
    name="ew_chain", summary="element-wise chain in one kernel: chain='bn;relu', 'sigmoid', 'mul;clip:0:6', ...",
    family="elemwise", defaults=EW_CHAIN_DEFAULTS, dtypes=_EW_DTYPES, fusion="fuse_elemwise_chain",
    compute_fn=_chain_compute, reference_fn=lambda wl, ins: _chain_apply(wl, ins, np), input_specs=_chain_inputs,
    flops_fn=lambda wl: sum({"sigmoid": 4, "clip": 2, "bn": 2, "affine": 2, "pow": 3}.get(n, 1) for n, _ in _chain_steps(wl))
    * int(np.prod(_ew_shape(wl))),
    validate_fn=lambda wl: (_validate_ew(wl), _chain_steps(wl)) and None,
    unfused_fn=lambda wl: [
        Step(op="ew_chain", params={**dict(wl.params), "chain": ":".join((n,) + tuple(map(str, a)))},
             inputs=(("in0",) if i == 0 else (f"s{i - 1}",)) + tuple(
                 f"in{1 + sum(len(_CHAIN_EXTRA[m]) for m, _ in _chain_steps(wl)[:i]) + j}"
                 for j in range(len(_CHAIN_EXTRA[n]))))
        for i, (n, a) in enumerate(_chain_steps(wl))],
))

CONCAT_DEFAULTS = {"n": 1, "c": 32, "c1": 32, "h": 28, "w": 28, "layout": "NCHW"}


def _concat_inputs(wl: Workload) -> list:
    p = wl.p
    return [("x", (p["n"], p["c"], p["h"], p["w"]), wl.dtype), ("x1", (p["n"], p["c1"], p["h"], p["w"]), wl.dtype)]


def _concat_compute(wl: Workload):
    from tvm import tirx  # max(c - c0, 0): the untaken branch never indexes out of bounds
    ins = _placeholders(_concat_inputs(wl))
    a, b = ins
    c0 = wl["c"]
    out = te.compute((wl["n"], c0 + wl["c1"], wl["h"], wl["w"]),
                     lambda n, c, y, x: te.if_then_else(c < c0, a[n, c, y, x], b[n, tirx.max(c - c0, 0), y, x]),
                     name="concat", tag="elemwise|concat")
    return ins, out


def _validate_concat(wl: Workload) -> None:
    _validate_ew(wl)
    if wl["c1"] < 1:
        raise OpcError("must be >= 1", arg="c1", value=wl["c1"])


register_op(OpDef(
    name="concat", summary="concatenate two NCHW tensors along channels (c then c1)", family="elemwise",
    defaults=CONCAT_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_concat_compute,
    reference_fn=lambda wl, ins: np.concatenate(ins, axis=1), input_specs=_concat_inputs,
    flops_fn=lambda wl: 0,
    validate_fn=_validate_concat,
))

PAD_DEFAULTS = {"n": 1, "c": 64, "h": 56, "w": 56, "pt": 0, "pl": 0, "pb": 1, "pr": 1, "fill": "zero",
                "layout": "NCHW"}
PAD_FILLS = ("zero", "lowest")  # lowest: the dtype's most negative finite value (max pooling's identity)


def _pad_value(wl: Workload) -> float:
    return 0.0 if wl["fill"] == "zero" else float(np.finfo(wl.dtype).min)


def _validate_pad(wl: Workload) -> None:
    _validate_ew(wl)
    for key in ("pt", "pl", "pb", "pr"):
        if wl[key] < 0:
            raise OpcError("must be >= 0", arg=key, value=wl[key])
    if wl["fill"] not in PAD_FILLS:
        raise OpcError("unknown fill", arg="fill", value=wl["fill"], expected=" or ".join(PAD_FILLS))


def _pad_compute(wl: Workload):
    ins = _placeholders([("x", _ew_shape(wl), wl.dtype)])
    from ..dsl.nn import pad_input
    out = pad_input(ins[0], (wl["pt"], wl["pl"], wl["pb"], wl["pr"]), wl.layout, _pad_value(wl), name="pad_out")
    if out is ins[0]:  # no padding at all: still a kernel (a copy)
        out = te.compute(out.shape, lambda *i: ins[0](*i), name="pad_out", tag="elemwise")
    return ins, out


def _pad_ref(wl: Workload, ins) -> np.ndarray:
    hw = ((wl["pt"], wl["pb"]), (wl["pl"], wl["pr"]))
    widths = ((0, 0), (0, 0), *hw) if wl.layout == "NCHW" else ((0, 0), *hw, (0, 0))
    return np.pad(ins[0], widths, constant_values=np.asarray(_pad_value(wl), wl.dtype))


register_op(OpDef(
    name="pad", summary="explicit spatial padding (pt, pl, pb, pr; fill zero|lowest)",
    family="elemwise", defaults=PAD_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_pad_compute, reference_fn=_pad_ref,
    input_specs=lambda wl: [("x", _ew_shape(wl), wl.dtype)], flops_fn=lambda wl: 0, validate_fn=_validate_pad,
))

TRANSPOSE_DEFAULTS = {"dims": "1x2x4x8x8", "perm": "02134"}  # a channel shuffle of 2 groups of 4


def transpose_dims(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, permutation) of a transpose workload: dims=AxBxC..., perm=digits (rank <= 8)."""
    try:
        dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
        perm = tuple(int(c) for c in str(wl["perm"]).zfill(len(dims)))  # "0213" may arrive as the int 213
    except ValueError:
        raise OpcError("dims must read like 2x3x4 and perm like 021", arg="dims", value=f"{wl['dims']}/{wl['perm']}",
                       expected="dims=AxBxC (up to 8 axes), perm=a digit per axis") from None
    return dims, perm


def _validate_transpose(wl: Workload) -> None:
    dims, perm = transpose_dims(wl)
    if not 1 <= len(dims) <= 8 or any(d < 1 for d in dims):
        raise OpcError("1 to 8 positive dimensions", arg="dims", value=wl["dims"], expected="e.g. 1x2x4x8x8")
    if sorted(perm) != list(range(len(dims))):
        raise OpcError(f"not a permutation of the {len(dims)} axes", arg="perm", value=wl["perm"],
                       expected="".join(map(str, range(len(dims)))) + " reordered")


def _transpose_compute(wl: Workload):
    dims, perm = transpose_dims(wl)
    ins = _placeholders([("x", dims, wl.dtype)])
    inv = [perm.index(k) for k in range(len(dims))]
    out = te.compute([dims[p] for p in perm], lambda *i: ins[0](*[i[j] for j in inv]), name="transpose",
                     tag="elemwise|transpose")
    return ins, out


register_op(OpDef(
    name="transpose", summary="permute the axes of a tensor (dims=AxBxC..., perm=digits): a data movement",
    family="elemwise", defaults=TRANSPOSE_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_transpose_compute,
    reference_fn=lambda wl, ins: np.ascontiguousarray(np.transpose(ins[0], transpose_dims(wl)[1])),
    input_specs=lambda wl: [("x", transpose_dims(wl)[0], wl.dtype)], flops_fn=lambda wl: 0,
    validate_fn=_validate_transpose,
))

SLICE_DEFAULTS = {"dims": "1x8x4x4", "axis": 1, "start": 0, "end": 4}  # ShuffleNet's channel split


def slice_geometry(wl: Workload) -> tuple[tuple[int, ...], int, int, int]:
    """(input dims, outer blocks, run start, run length) of a slice along one axis, step 1: each of
    the `outer` blocks copies `run` contiguous elements starting at `start` (in elements)."""
    dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    a = wl["axis"]
    inner = int(np.prod(dims[a + 1:], dtype=np.int64))
    return dims, int(np.prod(dims[:a], dtype=np.int64)), wl["start"] * inner, (wl["end"] - wl["start"]) * inner


def _validate_slice(wl: Workload) -> None:
    try:
        dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    except ValueError:
        raise OpcError("dims must read like 1x8x4x4", arg="dims", value=wl["dims"]) from None
    if not 0 <= wl["axis"] < len(dims):
        raise OpcError(f"no axis {wl['axis']} in a {len(dims)}-D tensor", arg="axis", value=wl["axis"])
    if not 0 <= wl["start"] < wl["end"] <= dims[wl["axis"]]:
        raise OpcError(f"need 0 <= start < end <= {dims[wl['axis']]}", arg="start", value=(wl["start"], wl["end"]))


def _slice_compute(wl: Workload):
    dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    a, st = wl["axis"], wl["start"]
    ins = _placeholders([("x", dims, wl.dtype)])
    shape = list(dims)
    shape[a] = wl["end"] - st
    out = te.compute(shape, lambda *i: ins[0](*[i[j] + st if j == a else i[j] for j in range(len(dims))]),
                     name="slice", tag="elemwise|slice")
    return ins, out


def _slice_ref(wl: Workload, ins) -> np.ndarray:
    idx = [slice(None)] * ins[0].ndim
    idx[wl["axis"]] = slice(wl["start"], wl["end"])
    return np.ascontiguousarray(ins[0][tuple(idx)])


register_op(OpDef(
    name="slice", summary="a contiguous range along one axis (dims=AxBxC..., axis, start, end): a data movement",
    family="elemwise", defaults=SLICE_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_slice_compute, reference_fn=_slice_ref,
    input_specs=lambda wl: [("x", tuple(int(d) for d in str(wl["dims"]).split("x")), wl.dtype)],
    flops_fn=lambda wl: 0, validate_fn=_validate_slice,
))

SOFTMAX_DEFAULTS = {"m": 16, "n": 1000}


def _softmax_compute(wl: Workload):
    (x,) = ins = _placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])
    xf = dsl.cast_to(x, "float32") if wl.dtype == "float16" else x  # fp16 softmax sums in fp32
    mx = dsl.reduce_max(xf, axis=1, keepdims=True)
    e = dsl.vexp(dsl.vsub(xf, mx))
    s = dsl.sum(e, axis=1, keepdims=True)
    out = dsl.vdiv(e, s)
    return ins, (dsl.cast_to(out, "float16") if wl.dtype == "float16" else out)


def _softmax_ref(wl: Workload, ins) -> np.ndarray:
    x = ins[0].astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(wl.dtype)


register_op(OpDef(
    name="softmax", summary="softmax over the last axis of an (m, n) tensor", family="softmax",
    defaults=SOFTMAX_DEFAULTS, dtypes=_EW_DTYPES, compute_fn=_softmax_compute, reference_fn=_softmax_ref,
    input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)], flops_fn=lambda wl: 5 * wl["m"] * wl["n"],
    validate_fn=_validate_red,
))
