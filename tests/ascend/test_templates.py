"""Every ascend template's output against the numpy reference in functional mode.

Tolerances are opcompiler.verify's: fp16 rtol 1e-2 with atol 2e-3 x the reference's largest
magnitude (the cube accumulates in fp32 and rounds once to fp16); int8 -> int32 exact; fp32
(vector ops) rtol 1e-4. Shapes are small on purpose; odd channel counts (3, 13), strides,
paddings, dilation and NHWC are included.
"""
from __future__ import annotations

import pytest

from opcompiler.api import run_op
from opcompiler.errors import OpcFailure

CONV = [
    "n=1,c=3,h=11,w=9,k=20,r=3,s=3,stride=2,pad=1",
    "n=2,c=13,h=10,w=10,k=33,r=5,s=5,stride=1,pad=2",
    "n=1,c=8,h=12,w=12,k=16,r=3,s=3,stride=1,pad=2,dilation=2",
    "n=1,c=32,h=7,w=7,k=48,r=1,s=1,stride=1,pad=0",
    "n=1,c=13,h=9,w=9,k=20,r=3,s=3,stride=1,pad=1,layout=NHWC",
    "n=1,c=16,h=9,w=9,k=16,r=3,s=3,stride=3,pad=0",
]


@pytest.mark.parametrize("op", ["conv2d", "conv2d_bias_relu", "conv2d_bn_relu", "conv2d_bn"])
@pytest.mark.parametrize("shape", CONV)
def test_conv_family_fp16(op, shape):
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16")
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("op", ["matmul", "matmul_bias_relu", "matmul_bias"])
@pytest.mark.parametrize("shape", ["m=16,k=256,n=1024", "m=40,k=100,n=70", "m=33,k=17,n=200,trans_a=1",
                                   "m=64,k=48,n=30,trans_b=1"])
def test_matmul_family_fp16(op, shape):
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16")
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("op,shape", [("matmul", "m=40,k=100,n=70"), ("matmul_bias_relu", "m=33,k=64,n=40"),
                                      ("conv2d", "n=1,c=13,h=9,w=9,k=20,r=3,s=3,stride=2,pad=1"),
                                      ("conv2d_bias_relu", "n=1,c=40,h=6,w=6,k=16,r=3,s=3,stride=1,pad=1")])
def test_int8_cube_is_exact(op, shape):
    rep = run_op(op, "ascend-sim", shape=shape, dtype="int8")
    assert rep["correct"] and rep["max_abs_err"] == 0


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op,shape", [
    ("relu", "n=1,c=13,h=7,w=9"), ("add", "n=2,c=16,h=5,w=5"), ("add_relu", "n=1,c=3,h=30,w=30"),
    ("add_relu", "n=1,c=13,h=7,w=7,bcast=1"), ("bias_add", "n=2,c=13,h=7,w=9"),
    ("batch_norm", "n=1,c=64,h=14,w=14"), ("bn_relu", "n=1,c=20,h=9,w=9,layout=NHWC"),
    ("ew_chain", "n=1,c=13,h=7,w=9,chain=sigmoid"), ("ew_chain", "n=1,c=13,h=7,w=9,chain=mul;clip:0:6"),
    ("ew_chain", "n=1,c=13,h=7,w=9,chain=affine:0.2:0.5;clip:0:1"),
    ("ew_chain", "n=2,c=20,h=5,w=5,chain=bn;relu;add"),
    ("ew_chain", "n=1,c=8,h=5,w=5,chain=scale;bias;sigmoid,layout=NHWC"),
    ("concat", "n=2,c=13,c1=20,h=5,w=7"), ("pad", "n=2,c=3,h=7,w=6,pt=0,pl=0,pb=1,pr=1,fill=lowest"),
    ("pad", "n=1,c=5,h=9,w=40,pt=2,pl=3,pb=0,pr=1,fill=zero"), ("transpose", "dims=1x2x3x7x9,perm=02134"),
    ("transpose", "dims=4x6x5,perm=201"), ("transpose", "dims=3x600,perm=10"),
    ("slice", "dims=2x9x5x7,axis=1,start=3,end=8"), ("slice", "dims=3x5000,axis=1,start=10,end=4990")])
def test_elemwise_family(op, shape, dtype):
    rep = run_op(op, "ascend-sim", shape=shape, dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("preset", ["resnet50.res2_3x3", "resnet50.res3_3x3s2", "resnet50.res5_3x3"])
def test_resnet_presets(preset):
    rep = run_op("conv2d_bn_relu", "ascend-sim", preset=preset, dtype="float16")
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("config", [{"m_tile": 16, "k_tile": 16, "n_tile": 16, "double_buffer": 0, "block_dim": 1,
                                     "w_resident": 0},
                                    {"m_tile": 32, "k_tile": 64, "n_tile": 32, "double_buffer": 1, "block_dim": 4,
                                     "w_resident": 0},
                                    {"m_tile": 16, "k_tile": 32, "n_tile": 16, "double_buffer": 1, "block_dim": 2,
                                     "w_resident": 1}])
def test_small_tiles_and_single_buffer(config):
    rep = run_op("conv2d_bias_relu", "ascend-sim", shape="n=2,c=13,h=8,w=8,k=40,r=3,s=3,stride=1,pad=1",
                 dtype="float16", config=config)
    assert rep["correct"] and rep["config"] == config, rep["max_abs_err"]


def test_a_wrong_schedule_gives_a_wrong_result(monkeypatch):
    """The simulator executes the program: a Load3D told the wrong first input row reads the
    wrong rows (here caught as an out-of-buffer read) instead of the reference's answer."""
    from opcompiler.backend.ascend.lower import builder

    real = builder.KernelBuilder.load3d

    def shifted(self, dst, src, geom, h0, c1_0, p0, mt, q0, kt1):
        real(self, dst, src, geom, h0, c1_0, p0, mt, q0, kt1)
        self.instrs[-1].h0 = h0 + 1  # off by one row after the build-time check

    monkeypatch.setattr(builder.KernelBuilder, "load3d", shifted)
    try:
        rep = run_op("conv2d", "ascend-sim", shape="n=1,c=16,h=8,w=8,k=16,r=3,s=3,stride=1,pad=1", dtype="float16")
    except OpcFailure:
        return
    assert not rep["correct"]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("shape", ["n=1,c=13,h=9,w=9,kernel=3,stride=2,pad=1",
                                   "n=1,c=16,h=8,w=10,kernel=2,stride=2,pad=0",
                                   "n=2,c=20,h=11,w=11,kernel=3,stride=1,pad=1,layout=NHWC"])
def test_pool(shape, mode, dtype):
    rep = run_op("pool2d", "ascend-sim", shape=f"{shape},mode={mode}", dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "softmax"])
@pytest.mark.parametrize("shape", ["m=5,n=37", "m=70,n=300", "m=3,n=20000"])
def test_row_kernels(op, shape, dtype):
    rep = run_op(op, "ascend-sim", shape=shape, dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("dtype", ["float16", "int8"])
@pytest.mark.parametrize("op,shape", [("matmul", "m=33,k=17,n=200,trans_a=1"), ("matmul_bias_relu", "m=40,k=100,n=70")])
def test_matmul_nd_operand_converted_on_chip(op, shape, dtype):
    """a_layout=ND: A stays row-major in GM; Load2D converts ND -> zZ fractals into L0A."""
    rep = run_op(op, "ascend-sim", shape=shape, dtype=dtype, config={"a_layout": "ND"})
    assert rep["correct"], rep["max_abs_err"]
    assert rep["gm_layouts"]["A"].startswith("ND")


@pytest.mark.parametrize("op", ["conv2d", "conv2d_bn_relu"])
@pytest.mark.parametrize("shape", ["n=2,c=32,h=8,w=8,k=32,r=3,s=3,pad=1,groups=32",
                                   "n=1,c=12,h=9,w=9,k=18,r=3,s=3,pad=1,stride=2,groups=3",
                                   "n=1,c=16,h=9,w=9,k=32,r=3,s=3,pad=1,groups=2,layout=NHWC"])
def test_grouped_and_depthwise_conv(op, shape):
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16")
    assert rep["correct"], rep["max_abs_err"]


def test_ascend310_is_the_same_code_on_other_figures():
    """The 310 file changes cores, clock and DDR; nothing in the simulator names a chip."""
    a = run_op("conv2d_bn_relu", "ascend310-sim", shape="n=1,c=13,h=9,w=9,k=20,r=3,s=3,stride=2,pad=1",
               dtype="float16")
    b = run_op("conv2d_bn_relu", "ascend-sim", shape="n=1,c=13,h=9,w=9,k=20,r=3,s=3,stride=2,pad=1",
               dtype="float16")
    assert a["correct"] and a["target"] == "ascend310-sim" and a["cycles"] != b["cycles"]
    assert a["seconds"] == pytest.approx(a["cycles"] / 0.488e9)
