"""The op catalogue on the CPU backend: every op against its numpy reference, fused vs unfused,
FLOP counts by hand, presets and shape parsing."""
from __future__ import annotations

import pytest

from opcompiler import OpcError
from opcompiler.api import run_op, run_unfused
from opcompiler.backend import get_backend
from opcompiler.ops import PRESETS, get_op, list_ops, workload
from opcompiler.target import load_target
from opcompiler.verify import compare

SMALL = {
    "conv2d": ["n=2,c=13,h=9,w=11,k=5,r=3,s=3,stride=2,pad=1",
               "n=1,c=8,h=10,w=10,k=8,groups=8,r=3,s=3,pad=1,layout=NHWC",
               "n=1,c=4,h=10,w=10,k=6,r=3,s=3,pad=2,dilation=2",
               "n=1,c=16,h=8,w=8,k=32,r=1,s=1,pad=0"],
    "matmul": ["m=7,k=13,n=5,trans_a=1,trans_b=1", "m=16,k=64,n=48"],
    "elemwise": ["n=2,c=3,h=5,w=7", "n=1,c=16,h=4,w=4,layout=NHWC"],
    "pool": ["n=1,c=3,h=7,w=9,kernel=3,stride=2,pad=1,mode=avg", "n=1,c=4,h=8,w=8,kernel=2,stride=2,pad=0"],
    "reduce": ["m=6,n=40"],
}


BY_OP = {"transpose": ["dims=2x3x4x5,perm=0213", "dims=3x7,perm=10", "dims=2x3x4,perm=210"],
         "slice": ["dims=2x8x3x3,axis=1,start=2,end=6", "dims=5x7,axis=0,start=1,end=5"],
         # the cpu lstm unrolls its steps in TE (create_prim_func takes no scan): a short sequence
         "lstm": ["t=6,b=3,i=20,h=24", "t=4,b=2,i=9,h=16,reverse=1"],
         "gru": ["t=6,b=3,i=20,h=24", "t=5,b=2,i=9,h=16,reverse=1,lbr=0"], "attention": ["b=1,h=2,sq=33,skv=40,d=16,causal=1,mask=2"]}


def cases():
    for op in list_ops():
        for dt in op.dtypes:
            for shape in BY_OP.get(op.name) or SMALL.get(op.family, [None]):  # ops added later run at their default shape
                yield pytest.param(op.name, dt, shape, id=f"{op.name}-{dt}-{shape}")


@pytest.mark.parametrize("op,dtype,shape", list(cases()))
def test_op_matches_reference_on_cpu(op, dtype, shape):
    rep = run_op(op, "cpu", shape=shape, dtype=dtype)
    assert rep["correct"], rep
    assert rep["seconds"] > 0 and rep["flops"] >= 0  # data movement ops (concat) count no FLOPs


@pytest.mark.parametrize("op,shape", [
    ("conv2d_bn_relu", "n=1,c=8,h=9,w=9,k=16"), ("conv2d_bias_relu", "n=2,c=3,h=7,w=7,k=8,stride=2"),
    ("matmul_bias_relu", "m=8,k=32,n=16"), ("add_relu", "n=1,c=8,h=5,w=6"), ("add_relu", "n=1,c=8,h=5,w=6,bcast=1"),
    ("bn_relu", "n=2,c=4,h=3,w=3,layout=NHWC"),
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_equals_unfused(op, shape, dtype):
    wl = workload(op, shape, dtype=dtype)
    d = get_op(op)
    ins = d.make_inputs(wl, seed=3)
    backend = get_backend(load_target("cpu"))
    fused = backend.run(backend.build(wl), ins).outputs[0]
    unfused, steps = run_unfused(wl, "cpu", ins)
    assert len(steps) == len(d.unfused(wl)) >= 2
    ok, err = compare(fused, unfused.astype(fused.dtype))
    assert ok, err


def test_flop_counts_by_hand():
    # seed 000 §4.2.3: a multiply-add counts 2
    assert get_op("matmul").flops(workload("matmul", preset="seed.matmul_16x256x1024")) == 2 * 16 * 256 * 1024
    wl = workload("conv2d", preset="resnet50.res2_3x3")
    assert get_op("conv2d").flops(wl) == 2 * 1 * 64 * 56 * 56 * 64 * 3 * 3 == 231_211_008
    wl = workload("conv2d", "n=1,c=8,h=10,w=10,k=8,groups=8,r=3,s=3,pad=1")
    assert get_op("conv2d").flops(wl) == 2 * 8 * 10 * 10 * 1 * 9
    # bytes: inputs once + output once
    wl = workload("relu", "n=1,c=2,h=3,w=4")
    assert get_op("relu").bytes(wl) == 2 * 24 * 4


def test_presets_and_batch_override():
    for name in ["resnet50.res2_3x3", "minigo.conv3_init", "minigo.conv3_res", "minigo.conv1_policy",
                 "minigo.conv1_value", "minigo.fc1", "minigo.fc2", "minigo.fc3", "seed.matmul_16x256x1024"]:
        assert name in PRESETS
    wl = workload("conv2d", preset="minigo.conv3_res", batch=768)
    assert wl["n"] == 768 and wl.layout == "NHWC" and wl["c"] == 64
    assert workload("matmul", preset="minigo.fc1", batch=96)["m"] == 96
    assert workload("conv2d", "minigo.conv3_init")["c"] == 13  # a preset name passed to --shape
    assert sum(1 for k in PRESETS if k.startswith("resnet50.")) >= 10


@pytest.mark.parametrize("call,words", [
    (lambda: workload("conv2d", "n=1,c=x"), "integer"),
    (lambda: workload("conv2d", "n=1,q=3"), "no shape parameter 'q'"),
    (lambda: workload("conv2d", "n=1,c=6,k=8,groups=4"), "groups"),
    (lambda: workload("conv2d", "pad=-1"), "padding"),
    (lambda: workload("conv2d", dtype="bfloat16"), "does not support this dtype"),
    (lambda: workload("conv2d_bn_relu", dtype="int8"), "does not support this dtype"),
    (lambda: workload("conv2d", preset="nope"), "unknown preset"),
    (lambda: workload("matmul", preset="resnet50.res2_3x3"), "conv shape"),
    (lambda: workload("nope"), "unknown op"),
    (lambda: workload("conv2d", "n=1,h=2,w=2,r=5,s=5,pad=0"), "output would be"),
    (lambda: load_target("tpu-v9"), "unknown target"),
])
def test_bad_workloads(call, words):
    with pytest.raises(OpcError) as e:
        call()
    assert words in str(e.value)


def test_unknown_knob_lists_the_space():
    with pytest.raises(OpcError) as e:
        run_op("conv2d", "cpu", shape="n=1,c=4,h=6,w=6,k=8", config={"tile_q": 3})
    msg = str(e.value)
    assert "tile_q" in msg and "tile_vec in" in msg and "tile_reg in" in msg


def test_default_cpu_conv_is_tiled_and_vectorized():
    from opcompiler.template import get_template
    wl = workload("conv2d", preset="resnet50.res2_3x3")
    t = get_template("conv2d", "cpu")
    script = t.apply(wl, load_target("cpu"), t.default(wl, load_target("cpu"))).mod.script()
    assert "T.parallel" in script and "T.vectorized" in script and "T.unroll" in script
