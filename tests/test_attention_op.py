"""The attention op: its numpy reference against torch's scaled_dot_product_attention (an
independent implementation), and the cpu template against the reference."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target


@pytest.mark.parametrize("shape", ["b=2,h=3,sq=17,skv=29,d=8", "b=1,h=2,sq=40,skv=40,d=16,causal=1",
                                   "b=2,h=2,sq=12,skv=20,d=8,mask=2,scale=0.5", "b=1,h=1,sq=9,skv=31,d=4,mask=1"])
def test_reference_matches_torch_sdpa(shape):
    torch = pytest.importorskip("torch")
    wl = workload("attention", shape, dtype="float32")
    ins = get_op("attention").make_inputs(wl, seed=5)
    q, k, v = (torch.from_numpy(a) for a in ins[:3])
    mask = torch.from_numpy(ins[3])[:, None] if len(ins) > 3 else None
    scale = None if wl["scale"] == "auto" else float(wl["scale"])
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(wl["causal"]),
                                                            scale=scale).numpy()
    np.testing.assert_allclose(get_op("attention").reference(wl, ins), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 2e-3)])
def test_cpu_template(dtype, tol):
    be = get_backend(load_target("cpu"))
    wl = workload("attention", "b=2,h=2,sq=33,skv=47,d=16,causal=1,mask=2", dtype=dtype)
    ins = get_op("attention").make_inputs(wl, seed=2)
    out = be.run(be.build(wl), ins).outputs[0]
    np.testing.assert_allclose(out.astype(np.float32), get_op("attention").reference(wl, ins).astype(np.float32),
                               atol=tol, rtol=tol)
