"""The element-wise steps transformers need (issue 33): erf, gelu (erf form), gelu_tanh, tanh, sub
and rec, each one line of the step vocabulary (`opcompiler/ops/steps.py`), composed from the
vector unit's own operations (neither machine has an erf or tanh instruction): they run on cpu,
ascend-sim and dsp-sim through the existing element-wise templates.

erf is Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7); float16 inputs are computed in float32
on the vector unit, since 1 - t P(t) exp(-x^2) cancels near 0. Checked against float64 math.erf /
np.tanh on x in [-6, 6] (every branch): max abs error <= 2e-6 in float32, <= 4e-3 in float16
(gelu of x up to 6: float16's spacing at 4..8 is 2^-8, and a few roundings)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from opcompiler.api import build
from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.ops.steps import STEPS, parse_chain
from opcompiler.target import load_target


def erf64(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


EXACT = {
    "erf": erf64,
    "gelu": lambda x: x.astype(np.float64) * (1 + erf64(x / math.sqrt(2))) / 2,
    "gelu_tanh": lambda x: 0.5 * x.astype(np.float64) * (1 + np.tanh(math.sqrt(2 / math.pi) * (
        x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3))),
    "tanh": lambda x: np.tanh(x.astype(np.float64)),
}
TOL = {"float32": 2e-6, "float16": 4e-3}


def _run(step: str, target: str, dtype: str, shape: str):
    wl = workload("ew_chain", f"{shape},chain={step}", dtype=dtype)
    tgt = load_target(target)
    x = np.linspace(-6, 6, int(np.prod(get_op("ew_chain").inputs(wl)[0][1])), dtype=np.float32)
    x = x.reshape(get_op("ew_chain").inputs(wl)[0][1]).astype(dtype)
    out = get_backend(tgt).run(build(wl, tgt), [x]).outputs[0]
    return x, out


@pytest.mark.parametrize("step", sorted(EXACT))
@pytest.mark.parametrize("target,dtype,shape", [
    ("cpu", "float32", "n=1,c=3,h=5,w=7"),
    ("ascend-sim", "float16", "n=1,c=16,h=8,w=8"),
    ("ascend-sim", "float32", "n=2,c=3,h=5,w=7"),
    ("dsp-sim", "float32", "n=2,c=3,h=5,w=7"),
    ("dsp-sim", "float32", "n=1,c=8,h=4,w=4,layout=NHWC"),
])
def test_step_matches_float64(step, target, dtype, shape):
    x, out = _run(step, target, dtype, shape)
    err = np.abs(out.astype(np.float64) - EXACT[step](x.astype(np.float32)))
    assert err.max() <= TOL[dtype], (step, target, dtype, err.max())


def test_the_reference_is_the_function():
    """The numpy references of the catalogue are the functions themselves (float64), not the
    A&S approximation the kernels use."""
    x = np.linspace(-6, 6, 101).astype(np.float32)
    for step, f in EXACT.items():
        ref = STEPS[step].ref(x, [], (), "float32")
        assert np.abs(ref - f(x)).max() <= 1e-7, step
    assert STEPS["erf"].wide and STEPS["gelu"].wide and not STEPS["tanh"].wide
    assert parse_chain("sub;rec") == [("sub", ()), ("rec", ())]


def test_erf_float16_holds_float32_temporaries_in_ub():
    """A wide step's temporaries are float32: the UB footprint (and so the default tile) says so."""
    from opcompiler.ops.steps import chain_temp_bytes
    assert chain_temp_bytes(parse_chain("erf"), "float16") == 4 * STEPS["erf"].temps
    assert chain_temp_bytes(parse_chain("hardswish"), "float16") == 2
    wl = workload("ew_chain", "n=1,c=64,h=56,w=56,chain=erf", dtype="float16")
    tgt = load_target("ascend-sim")
    k = build(wl, tgt)
    ub = next(m.capacity_bytes for m in tgt.memories if m.name == "UB")
    tile = k.config["ub_tile"]  # x's fp16 tile and the temps' fp32 tiles, double-buffered, fit
    assert 2 * tile * (2 + 4 * STEPS["erf"].temps) <= ub < 2 * (2 * tile) * (2 + 4 * STEPS["erf"].temps)
    from opcompiler.api import run_op
    rep = run_op("ew_chain", "ascend-sim", shape="n=1,c=64,h=56,w=56,chain=erf", dtype="float16")
    assert rep["correct"] and rep["config"]["ub_tile"] == tile and rep["buffer_high_water"]["UB"] <= ub
