"""The matmul family: matmul and its fusions (bias, ReLU)."""
from __future__ import annotations

import numpy as np

from ... import dsl
from ...errors import OpcError
from ..fusion import fusion_manager
from ...workload import Workload
from .. import reference as ref
from ..registry import OpDef, Step, register_op
from .common import CUBE, acc_out, placeholders

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
    defaults=MM_DEFAULTS, dtypes=CUBE, preset_kind="matmul",
    compute_fn=lambda wl: (lambda ins: (ins, dsl.matmul(*ins, bool(wl["trans_a"]), bool(wl["trans_b"]))))(
        placeholders(_mm_inputs(wl))),
    reference_fn=lambda wl, ins: _mm_ref_acc(wl, ins).astype(acc_out(wl.dtype)),
    input_specs=_mm_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"], validate_fn=_validate_mm,
))

MMB_DEFAULTS = {"m": 16, "k": 256, "n": 1024, "trans_a": 0, "trans_b": 0}


def _mmb_inputs(wl: Workload) -> list:
    bdt = "int32" if wl.dtype == "int8" else wl.dtype
    return _mm_inputs(wl) + [("bias", (wl["n"],), bdt)]


def _fused_compute(fusion: str):
    """The compute of the matmul fusion registered as `fusion` (inputs A, B, bias)."""
    def compute(wl: Workload):
        ins = placeholders(_mmb_inputs(wl))
        return ins, fusion_manager.get(fusion).compute(*ins, bool(wl["trans_a"]), bool(wl["trans_b"]))
    return compute


def _mmb_ref_acc(wl: Workload, ins) -> np.ndarray:
    """The reference matmul plus the bias, in the accumulator's type (int32 for int8, else fp32)."""
    return _mm_ref_acc(wl, ins) + ins[2].astype(np.float32 if wl.dtype != "int8" else np.int32)


def _ew_params(wl: Workload) -> dict:
    """The (m, n) output as an NHWC element-wise workload (the unfused bias_add / relu)."""
    return {"n": 1, "c": wl["n"], "h": 1, "w": wl["m"], "layout": "NHWC"}


register_op(OpDef(
    name="matmul_bias_relu", summary="fused matmul + bias + ReLU (fully connected layer)", family="matmul",
    defaults=MMB_DEFAULTS, dtypes=CUBE, preset_kind="matmul", fusion="fuse_matmul_bias_relu", epilogue="bias;relu",
    compute_fn=_fused_compute("fuse_matmul_bias_relu"),
    reference_fn=lambda wl, ins: np.maximum(_mmb_ref_acc(wl, ins), 0).astype(acc_out(wl.dtype)),
    input_specs=_mmb_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"] + 2 * wl["m"] * wl["n"],
    validate_fn=_validate_mm,
    unfused_fn=lambda wl: [
        Step(op="matmul", params=dict(wl.params), inputs=("in0", "in1")),
        Step(op="bias_add", params=_ew_params(wl), inputs=("s0", "in2")),
        Step(op="relu", params=_ew_params(wl), inputs=("s1",)),
    ],
))


@fusion_manager.register("fuse_matmul_bias", ops=("matmul", "bias_add"))
def _fuse_matmul_bias_compute(tensor_a, tensor_b, bias, trans_a=False, trans_b=False, kernel_name="fuse_matmul_bias"):
    return dsl.matmul(tensor_a, tensor_b, trans_a, trans_b, bias=bias)


register_op(OpDef(
    name="matmul_bias", summary="fused matmul + bias, no activation (fully connected layer)", family="matmul",
    defaults=MMB_DEFAULTS, dtypes=CUBE, preset_kind="matmul", fusion="fuse_matmul_bias", epilogue="bias",
    compute_fn=_fused_compute("fuse_matmul_bias"),
    reference_fn=lambda wl, ins: _mmb_ref_acc(wl, ins).astype(acc_out(wl.dtype)),
    input_specs=_mmb_inputs, flops_fn=lambda wl: 2 * wl["m"] * wl["k"] * wl["n"] + wl["m"] * wl["n"],
    validate_fn=_validate_mm,
    unfused_fn=lambda wl: [
        Step(op="matmul", params=dict(wl.params), inputs=("in0", "in1")),
        Step(op="bias_add", params=_ew_params(wl), inputs=("s0", "in2")),
    ],
))

