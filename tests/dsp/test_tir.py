"""The DSP schedules as TVM s_tir.Schedules: same tiles as the simulated program, correct math."""
import numpy as np
import pytest

from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template


@pytest.mark.parametrize("op,shape,config", [
    ("conv2d", "n=2,c=8,h=9,w=9,k=64,r=3,s=3,pad=1,layout=NHWC", {"rows": 2, "cols": 4}),
    ("conv2d", "n=2,c=5,h=9,w=13,k=20,r=3,s=3,stride=2,pad=0,layout=NCHW", {"rows": 2, "cols": 4, "order": "ws"}),
    ("conv2d_bn_relu", "n=1,c=13,h=19,w=19,k=64,r=3,s=3,pad=1,layout=NHWC", "paper"),
    ("matmul_bias_relu", "m=16,k=40,n=70", {"rows": 4, "kv": 2}),
])
def test_program_tiles_are_the_tir_schedule_tiles(op, shape, config):
    t = load_target("dsp-sim")
    wl = workload(op, shape=shape)
    tm = get_template(get_op(op).family, "dsp")
    cfg = tm.paper(wl, t) if config == "paper" else tm.config(wl, t, config)
    res = tm.tir_check(wl, t, cfg)
    assert res["match"], res
    assert set(res["tir"]) == {"local.SM", "local.AM"}


def test_tir_schedule_computes_the_convolution():
    """The schedule's loop nest, built for the host, matches numpy (fp32 tolerance of verify)."""
    import tvm
    from opcompiler.schedules.dsp.tir import tir_schedule

    from opcompiler.verify import compare
    t = load_target("dsp-sim")
    wl = workload("conv2d", shape="n=2,c=5,h=9,w=13,k=20,r=3,s=3,stride=2,pad=1,layout=NHWC")
    tm = get_template("conv2d", "dsp")
    sch = tir_schedule(wl, t, tm.config(wl, t, {"rows": 2, "cols": 4, "pw": 3}))
    ex = tvm.compile(sch.mod, target="llvm")
    d = get_op("conv2d")
    xs = d.make_inputs(wl, 0)
    ref = d.reference(wl, xs)
    args = [tvm.runtime.tensor(x) for x in xs] + [tvm.runtime.tensor(np.zeros(ref.shape, "float32"))]
    ex(*args)
    assert compare(args[-1].numpy(), ref)[0]
