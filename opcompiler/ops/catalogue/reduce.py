"""Row reductions over an (m, n) tensor: reduce_sum, reduce_max, reduce_mean, softmax."""
from __future__ import annotations

import numpy as np

from ... import dsl
from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import EW_DTYPES, placeholders

RED_DEFAULTS = {"m": 1024, "n": 1024}


def _validate_red(wl: Workload) -> None:
    for key in ("m", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])


for _name, _fn, _np in (("reduce_sum", dsl.sum, np.sum), ("reduce_max", dsl.reduce_max, np.max)):
    register_op(OpDef(
        name=_name, summary=f"{_name.split('_')[1]} over the last axis of an (m, n) tensor", family="reduce",
        defaults=RED_DEFAULTS, dtypes=EW_DTYPES,
        compute_fn=(lambda f: lambda wl: (lambda ins: (ins, f(ins[0], axis=1)))(
            placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])))(_fn),
        reference_fn=(lambda f: lambda wl, ins: f(ins[0].astype(np.float32), axis=1).astype(wl.dtype))(_np),
        input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)],
        flops_fn=lambda wl: wl["m"] * wl["n"], validate_fn=_validate_red,
    ))



def _mean_compute(wl: Workload):
    (x,) = ins = placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])
    return ins, dsl.vmuls(dsl.sum(x, axis=1), 1.0 / wl["n"])


register_op(OpDef(
    name="reduce_mean", summary="mean over the last axis of an (m, n) tensor (global average pooling as a row "
                                "reduction: the sum, then one multiply by 1/n)", family="reduce",
    defaults=RED_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_mean_compute,
    reference_fn=lambda wl, ins: (ins[0].astype(np.float32).sum(axis=1) * np.float32(1.0 / wl["n"])).astype(wl.dtype),
    input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)],
    flops_fn=lambda wl: wl["m"] * wl["n"] + wl["m"], validate_fn=_validate_red,
))


SOFTMAX_DEFAULTS = {"m": 16, "n": 1000}


def _softmax_compute(wl: Workload):
    (x,) = ins = placeholders([("x", (wl["m"], wl["n"]), wl.dtype)])
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
    defaults=SOFTMAX_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_softmax_compute, reference_fn=_softmax_ref,
    input_specs=lambda wl: [("x", (wl["m"], wl["n"]), wl.dtype)], flops_fn=lambda wl: 5 * wl["m"] * wl["n"],
    validate_fn=_validate_red,
))
