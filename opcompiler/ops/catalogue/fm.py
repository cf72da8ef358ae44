"""The factorization machine's pairwise term (DeepFM's FM component, Rendle 2010) as one fused
reduction chain over the field axis:

    e    (b, f, k)  the field embeddings of b samples: f fields, k values each
    out  (b, k)     (sum_f e[:, f, :])^2 - sum_f e[:, f, :]^2

(half its sum over k is the FM term: 0.5 * sum_k out, left to the ops that follow). Both sums
and the squares run in float32 whatever the dtype (the difference of two close sums: float16
partial sums would lose it); the result is cast to the op dtype once. Written out in a model,
`e.sum(1).pow(2) - e.pow(2).sum(1)` is five kernels and two transposes, every intermediate in
global memory; the importer folds that chain into this op (`opcompiler.graph.translate.fm`)."""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

FM_DEFAULTS = {"b": 256, "f": 26, "k": 16}  # Criteo's 26 sparse fields, 16 values each
FM_DTYPES = ("float32", "float16")


def _inputs(wl: Workload) -> list:
    return [("e", (wl["b"], wl["f"], wl["k"]), wl.dtype)]


def _validate(wl: Workload) -> None:
    for key in ("b", "f", "k"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])


def _compute(wl: Workload):
    (e,) = ph = placeholders(_inputs(wl))
    b, f, k = wl["b"], wl["f"], wl["k"]
    ef = te.compute((b, f, k), lambda i, r, j: e[i, r, j].astype("float32"), name="fm_in", tag="fm_in") \
        if wl.dtype != "float32" else e
    r1 = te.reduce_axis((0, f), name="r1")
    s = te.compute((b, k), lambda i, j: te.sum(ef[i, r1, j], axis=r1), name="fm_sum", tag="fm_sum")
    sq = te.compute((b, f, k), lambda i, r, j: ef[i, r, j] * ef[i, r, j], name="fm_sq", tag="fm_sq")
    r2 = te.reduce_axis((0, f), name="r2")
    q = te.compute((b, k), lambda i, j: te.sum(sq[i, r2, j], axis=r2), name="fm_sumsq", tag="fm_sumsq")
    out = te.compute((b, k), lambda i, j: (s[i, j] * s[i, j] - q[i, j]).astype(wl.dtype), name="fm_out",
                     tag="fm_out")
    return ph, out


def _reference(wl: Workload, ins) -> np.ndarray:
    e = np.asarray(ins[0]).astype(np.float64)
    return (e.sum(axis=1) ** 2 - (e * e).sum(axis=1)).astype(wl.dtype)


register_op(OpDef(
    name="fm_interaction", summary="factorization machine's pairwise term over the field axis of e (b, f, k): "
                                   "(sum_f e)^2 - sum_f e^2 -> (b, k), one fused reduction chain (DeepFM)",
    family="fm", defaults=FM_DEFAULTS, dtypes=FM_DTYPES, compute_fn=_compute, reference_fn=_reference,
    input_specs=_inputs, flops_fn=lambda wl: wl["b"] * wl["k"] * (3 * wl["f"] + 2), validate_fn=_validate,
))
