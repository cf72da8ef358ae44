"""Batched GEMM: batch_matmul, C[b] = op(A[b]) @ op(B[b]) (attention's Q K^T and P V).

Shape keys: `b` batches of an (m, k) x (k, n) product, `trans_a` / `trans_b` (A stored (b, k, m),
B stored (b, n, k)) and `bcast_b` (B is one matrix every batch shares: (k, n), or (n, k) with
trans_b). Dtypes as matmul: fp16 accumulates in fp32 and is cast back to fp16, int8 accumulates
and returns int32, fp32 throughout. The reduction stage is named `matmul` (its cast `matmul_out`)
so the GEMM templates and lowerings find it as they find matmul's.
"""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from .. import reference as ref
from ..registry import OpDef, register_op
from .common import CUBE, acc_out, placeholders

BMM_DEFAULTS = {"b": 16, "m": 128, "k": 64, "n": 128, "trans_a": 0, "trans_b": 0, "bcast_b": 0}
_ACC = {"float16": "float32", "float32": "float32", "int8": "int32"}


def _validate_bmm(wl: Workload) -> None:
    for key in ("b", "m", "k", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    for key in ("trans_a", "trans_b", "bcast_b"):
        if wl[key] not in (0, 1):
            raise OpcError("must be 0 or 1", arg=key, value=wl[key])


def _bmm_inputs(wl: Workload) -> list:
    p = wl.p
    a = (p["b"], p["k"], p["m"]) if p["trans_a"] else (p["b"], p["m"], p["k"])
    b = (p["n"], p["k"]) if p["trans_b"] else (p["k"], p["n"])
    return [("tensor_a", a, wl.dtype), ("tensor_b", b if p["bcast_b"] else (p["b"], *b), wl.dtype)]


def _bmm_compute(wl: Workload):
    ins = placeholders(_bmm_inputs(wl))
    a, b = ins
    ta, tb, bc = bool(wl["trans_a"]), bool(wl["trans_b"]), bool(wl["bcast_b"])
    acc, out = _ACC[wl.dtype], acc_out(wl.dtype)
    k = te.reduce_axis((0, wl["k"]), name="k")
    fa = (lambda z, i, kk: a[z, kk, i]) if ta else (lambda z, i, kk: a[z, i, kk])
    if bc:
        fb = (lambda z, kk, j: b[j, kk]) if tb else (lambda z, kk, j: b[kk, j])
    else:
        fb = (lambda z, kk, j: b[z, j, kk]) if tb else (lambda z, kk, j: b[z, kk, j])
    c = te.compute((wl["b"], wl["m"], wl["n"]),
                   lambda z, i, j: te.sum(fa(z, i, k).astype(acc) * fb(z, k, j).astype(acc), axis=k),
                   name="matmul", tag="matmul")
    if out != acc:
        c = te.compute(c.shape, lambda *i: c(*i).astype(out), name="matmul_out", tag="elemwise|cast")
    return ins, c


def _bmm_ref(wl: Workload, ins) -> np.ndarray:
    a, b = ins
    a = a.transpose(0, 2, 1) if wl["trans_a"] else a
    if wl["trans_b"]:
        b = b.T if wl["bcast_b"] else b.transpose(0, 2, 1)
    acc = ref.ACC[str(a.dtype)]
    return np.matmul(a.astype(acc), b.astype(acc)).astype(acc_out(wl.dtype))


register_op(OpDef(
    name="batch_matmul", summary="C[b] = A[b] @ B[b] over a batch (transpose flags; bcast_b: one B for every batch)",
    family="batch_matmul", defaults=BMM_DEFAULTS, dtypes=CUBE, preset_kind="matmul",
    compute_fn=_bmm_compute, reference_fn=_bmm_ref, input_specs=_bmm_inputs,
    flops_fn=lambda wl: 2 * wl["b"] * wl["m"] * wl["k"] * wl["n"], validate_fn=_validate_bmm,
))
