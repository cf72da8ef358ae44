"""Functional and timing modes run the same program and report the same cycles."""
from __future__ import annotations

import pytest

from opcompiler.ops import get_op, workload

KERNELS = [("matmul", "m=40,k=100,n=70", "float16"), ("matmul_bias_relu", "m=64,k=256,n=128", "float16"),
           ("conv2d_bn_relu", "n=2,c=13,h=10,w=10,k=20,r=3,s=3,stride=1,pad=1", "float16"),
           ("conv2d", "n=1,c=16,h=9,w=9,k=32,r=3,s=3,stride=2,pad=1", "int8"),
           ("batch_norm", "n=2,c=20,h=9,w=9", "float32"), ("add_relu", "n=1,c=16,h=20,w=20", "float16")]


@pytest.mark.parametrize("op,shape,dtype", KERNELS)
def test_functional_and_timing_cycles_equal(backend, op, shape, dtype):
    wl = workload(op, shape, dtype=dtype)
    kern = backend.build(wl)
    fun = backend.run(kern, get_op(op).make_inputs(wl))
    tim = backend.measure(kern)
    assert fun.outputs is not None and tim.outputs is None
    assert fun.cycles == tim.cycles > 0
    assert fun.metrics["bytes_by_level"] == tim.metrics["bytes_by_level"]
    assert fun.metrics["pipe_ratios"] == tim.metrics["pipe_ratios"]


def test_report_keys(backend):
    wl = workload("conv2d", "n=1,c=16,h=8,w=8,k=16,r=3,s=3,stride=1,pad=1", dtype="float16")
    res = backend.measure(backend.build(wl))
    for key in ("cycles", "percent_of_peak", "bound", "bytes_by_level", "pipe_ratios", "tflops", "roofline"):
        assert key in res.metrics
    assert set(res.metrics["pipe_ratios"]) == {"mac_ratio", "vec_ratio", "scalar_ratio", "mte1_ratio", "mte2_ratio",
                                               "mte3_ratio"}
    assert all(0 <= v <= 1 for v in res.metrics["pipe_ratios"].values())
    assert res.seconds == pytest.approx(res.cycles / 1e9)


@pytest.mark.parametrize("op,shape,dtype", KERNELS + [("pool2d", "n=1,c=16,h=9,w=9,kernel=3,stride=2,pad=1", "float16"),
                                                      ("softmax", "m=8,n=100", "float16")])
def test_features_for_the_tuner(op, shape, dtype):
    """Every template states its derived quantities; tiles fall as tiles grow."""
    import math

    from opcompiler.target import load_target
    from opcompiler.template import get_template

    wl = workload(op, shape, dtype=dtype)
    tgt = load_target("ascend-sim")
    tmpl = get_template(get_op(op).family, "ascend")
    feats = tmpl.features(wl, tgt, None)
    assert feats and all(isinstance(v, (int, float)) and math.isfinite(v) for v in feats.values())
    assert feats["active_cores"] >= 1 and any(k.startswith("occupancy") for k in feats)


@pytest.mark.parametrize("op,shape,dtype", [
    ("matmul_bias_relu", "m=64,k=256,n=96", "int8"),
    ("conv2d_bn_relu", "n=2,c=13,h=10,w=10,k=20,r=3,s=3,stride=2,pad=1", "float16"),
    ("conv2d", "n=1,c=32,h=8,w=8,k=32,r=3,s=3,pad=1,groups=4", "float16"),
    ("bn_relu", "n=2,c=20,h=9,w=9", "float32"),
    ("pool2d", "n=1,c=16,h=9,w=9,kernel=3,stride=2,pad=1,mode=avg", "float16"),
    ("ew_chain", "n=1,c=13,h=7,w=9,chain=bn;sigmoid", "float16")])
def test_random_configs_check_build_and_compute_agree(backend, op, shape, dtype):
    """What the tuner relies on: `check` accepts exactly the configs that build, and every
    config that builds computes the reference with the same cycles in both modes."""
    import random

    from opcompiler.errors import OpcError
    from opcompiler.target import load_target
    from opcompiler.template import get_template
    from opcompiler.verify import compare

    wl = workload(op, shape, dtype=dtype)
    tgt = load_target("ascend-sim")
    tmpl = get_template(get_op(op).family, "ascend")
    rng = random.Random(7)
    inputs = get_op(op).make_inputs(wl)
    ref = get_op(op).reference(wl, inputs)
    for _ in range(5):
        cfg = tmpl.random_config(wl, tgt, rng)
        cfg["lowering"] = "tik" if "lowering" in cfg else None
        cfg = {k: v for k, v in cfg.items() if v is not None}
        why = tmpl.check(wl, tgt, tmpl.config(wl, tgt, cfg))
        if why is not None:
            with pytest.raises(OpcError):
                backend.build(wl, cfg)
            continue
        kern = backend.build(wl, cfg)
        res = backend.run(kern, inputs)
        assert compare(res.outputs[0], ref)[0], cfg
        assert res.cycles == backend.measure(kern).cycles
