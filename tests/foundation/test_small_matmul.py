"""Small M and N for the matmul family on every target (issue 29 item 1: dsp-sim crashed on
m=1, 2, 8 with n=1 and compare crashed on MiniGo at batch 1 because of it).

Every (m, n) in {1, 2, 3, 8, 15, 16, 17}^2 at k=64, for matmul and the fully connected layers
(matmul_bias, matmul_bias_relu), built with the template default and run functionally; the
output is checked against a float64 numpy computation of the same inputs:

* float32 (cpu, dsp-sim): |out - ref| <= 1e-5 + 1e-5 |ref| (64-term sums of products of
  standard normals: float32 rounding is ~1e-6 of them);
* float16 (ascend-sim, the cube's dtype; fp32 accumulation, fp16 result): |out - ref| <=
  1e-3 + 1e-3 |ref| (one rounding of the result to fp16 is at most 2^-11 ~ 4.9e-4 relative, the
  inputs are exact in fp16 by construction).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

SIZES = (1, 2, 3, 8, 15, 16, 17)
K = 64
OPS = ("matmul", "matmul_bias", "matmul_bias_relu")
TARGETS = {"cpu": ("float32", 1e-5), "ascend-sim": ("float16", 1e-3), "dsp-sim": ("float32", 1e-5)}


def _reference(op: str, ins: list[np.ndarray]) -> np.ndarray:
    y = ins[0].astype(np.float64) @ ins[1].astype(np.float64)
    if op != "matmul":
        y = y + ins[2].astype(np.float64)
    if op == "matmul_bias_relu":
        y = np.maximum(y, 0)
    return y


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("target_name", TARGETS)
def test_small_m_and_n(target_name: str, op: str) -> None:
    dtype, tol = TARGETS[target_name]
    target = load_target(target_name)
    backend = get_backend(target)
    rng = np.random.default_rng(29)
    failures = []
    for m, n in itertools.product(SIZES, SIZES):
        wl = workload(op, {"m": m, "k": K, "n": n}, dtype=dtype)
        ins = [rng.standard_normal(size=shape).astype(dt) for _, shape, dt in get_op(op).inputs(wl)]
        kernel = backend.build(wl, None)  # the template default
        out = np.asarray(backend.run(kernel, ins).outputs[0], dtype=np.float64).reshape(m, n)
        ref = _reference(op, ins)
        err = np.abs(out - ref)
        if not np.all(err <= tol + tol * np.abs(ref)):
            failures.append((m, n, float(err.max())))
    assert failures == [], f"{op} on {target_name}: (m, n, max abs err) outside the tolerance: {failures}"
