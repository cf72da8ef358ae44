"""Functional mode: the simulated kernels' outputs against the numpy references (verify.TOLERANCE
for fp32: rtol 1e-4, atol 1e-5 of the largest magnitude), and the two modes agreeing."""
import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.verify import compare


@pytest.fixture(scope="module")
def be():
    return get_backend(load_target("dsp-sim"))


def _check(be, op, config=None, **kw):
    wl = workload(op, **kw)
    d = get_op(op)
    k = be.build(wl, config)
    ins = d.make_inputs(wl, seed=1)
    res = be.run(k, ins)
    ok, err = compare(res.outputs[0], d.reference(wl, ins))
    assert ok, f"{op} {wl.shape_str()} {k.config}: max abs err {err}"
    return k, res


@pytest.mark.parametrize("preset", ["minigo.conv3_init", "minigo.conv3_res", "minigo.conv1_policy",
                                    "minigo.conv1_value"])
@pytest.mark.parametrize("config", [None, "paper"])
def test_minigo_convs(be, preset, config):
    _check(be, "conv2d", config, preset=preset, batch=3)


@pytest.mark.parametrize("preset", ["minigo.fc1", "minigo.fc2", "minigo.fc3"])
@pytest.mark.parametrize("config", [None, "paper"])
def test_minigo_fc(be, preset, config):
    _check(be, "matmul_bias_relu", config, preset=preset, batch=10)


@pytest.mark.parametrize("shape,config", [
    ("n=2,c=3,h=9,w=8,k=5,r=3,s=3,stride=2,pad=0,layout=NHWC", None),                 # stride, no pad, odd C, K
    ("n=1,c=7,h=11,w=10,k=33,r=5,s=3,stride=1,pad=2,layout=NHWC", {"kv": 1, "pw": 7, "rows": 3}),  # K tail, 3 k-blocks
    ("n=3,c=13,h=8,w=8,k=70,r=3,s=3,dilation=2,pad=2,layout=NHWC", {"order": "ws", "rows": 3}),
    ("n=2,c=5,h=7,w=6,k=33,r=3,s=3,stride=2,pad=1,layout=NCHW", None),                 # NCHW via DMA relayout
    ("n=9,c=4,h=6,w=6,k=8,r=1,s=1,pad=0,layout=NHWC", {"split": "batch", "out_path": "gsm", "w_path": "host_copies"}),
    ("n=2,c=6,h=5,w=5,k=40,r=3,s=3,pad=1,layout=NHWC", {"w_path": "ddr", "dbuf": 0, "pw": 3, "rows": 4}),
    ("n=2,c=5,h=9,w=13,k=20,r=3,s=3,stride=2,pad=1,layout=NHWC", {"cols": 4, "rows": 2}),   # column tiles, edges
    ("n=1,c=3,h=8,w=17,k=8,r=5,s=5,pad=2,layout=NCHW", {"cols": 8, "order": "ws", "rows": 3}),
])
def test_conv_shapes(be, shape, config):
    _check(be, "conv2d", config, shape=shape)


@pytest.mark.parametrize("op", ["conv2d_bias_relu", "conv2d_bn_relu"])
@pytest.mark.parametrize("order", ["out", "ws"])
def test_fused_conv(be, op, order):
    _check(be, op, {"order": order}, shape="n=2,c=6,h=7,w=7,k=36,r=3,s=3,pad=1,layout=NHWC")


@pytest.mark.parametrize("shape", ["m=13,k=29,n=37", "m=5,k=8,n=70,trans_a=1,trans_b=1"])
def test_matmul_shapes(be, shape):
    _check(be, "matmul", None, shape=shape)


@pytest.mark.parametrize("op,shape", [
    ("bn_relu", "n=3,c=64,h=5,w=5,layout=NHWC"), ("bn_relu", "n=2,c=13,h=19,w=19,layout=NCHW"),
    ("batch_norm", "n=2,c=13,h=5,w=7,layout=NHWC"), ("relu", "n=2,c=3,h=5,w=7"), ("add", "n=2,c=3,h=5,w=7"),
    ("bias_add", "n=3,c=5,h=5,w=7,layout=NHWC"), ("add_relu", "n=2,c=13,h=5,w=7,bcast=1,layout=NHWC"),
    ("add_relu", "n=2,c=13,h=5,w=7"),
])
def test_elemwise(be, op, shape):
    _check(be, op, None, shape=shape)
    _check(be, op, "paper", shape=shape)


@pytest.mark.parametrize("op,shape,config", [
    ("conv2d", "n=5,c=13,h=9,w=9,k=64,r=3,s=3,pad=1,layout=NHWC", "paper"),
    ("conv2d", "n=11,c=8,h=7,w=7,k=40,r=3,s=3,pad=1,layout=NCHW", {"kv": 1, "rows": 2}),
    ("bn_relu", "n=3,c=13,h=9,w=9,layout=NHWC", None),
])
def test_functional_and_timing_modes_agree(be, op, shape, config):
    """run reports the timing clock (the same cycles as measure) and the functional replay's own
    clock beside it: equal where no identical cores run as one group (the NCHW conv), else
    below the timing clock by what the group's shared channel blocks cost (the documented
    relation: within 10 % of the device cycles here); and the timing program
    issues exactly the transfers and instructions the functional execution performed."""
    k, res = _check(be, op, config, shape=shape)
    timed = be.measure(k)
    assert timed.cycles == res.cycles == res.metrics["timing_cycles"]
    fun, host = res.metrics["functional_cycles"], res.metrics["host_cycles"]
    if "NCHW" in shape:
        assert fun == timed.cycles and not res.metrics["clocks_differ"]
    else:
        assert fun < timed.cycles and res.metrics["clocks_differ"]
        assert fun - host > 0.9 * (timed.cycles - host)  # here 5.7 % (conv) and 7.6 % (bn_relu) below
    assert res.metrics["functional_counters"] == timed.metrics["counters"]


KSPLIT = {"split": "k", "w_path": "ddr", "out_path": "ddr", "pw": 1, "rows": 1}


@pytest.mark.parametrize("op,shape", [("matmul_bias_relu", "m=1,k=722,n=362"), ("matmul", "m=3,k=5,n=70"),
                                      ("matmul_bias_relu", "m=2,k=37,n=33,trans_b=1")])
def test_reduction_split_across_cores_through_gsm(be, op, shape):
    k, res = _check(be, op, KSPLIT, shape=shape)
    assert res.metrics["bytes_by_level"]["GSM"] > 0  # the partials went through GSM
    timed = be.measure(k)  # run reports the timing clock, and beside it the functional replay's own:
    assert res.cycles == timed.cycles  # equal without core groups, else within 15 % of the device cycles
    fun = res.metrics["functional_cycles"]  # (identical cores timed as one group, tests/sim/test_crosscheck.py)
    assert fun == timed.cycles if max(k.artifact["program"].multiplicity) == 1 else \
        abs(fun - timed.cycles) <= 0.15 * timed.metrics["dsp_cycles"], (fun, timed.cycles)


def test_reduction_split_helps_a_single_row(be):
    """MiniGo's FC on one sample: splitting the 722-long reduction over 8 cores beats giving the
    single row to one core (DSP-side cycles; the launch is the same), but only a little: both
    must bring the 1 MB of weights from DDR once, and that dominates (FC is data-movement bound)."""
    wl = workload("matmul_bias_relu", shape="m=1,k=722,n=362")
    rows = be.measure(be.build(wl, {"kv": 8, "rows": 1, "pw": 1, "w_path": "ddr"}))
    ksplit = be.measure(be.build(wl, {**KSPLIT, "kv": 8}))
    assert rows.metrics["cores_used"] == 1 and ksplit.metrics["cores_used"] == 8
    assert ksplit.metrics["dsp_cycles"] < 0.95 * rows.metrics["dsp_cycles"]
    w_bytes = 722 * 362 * 4
    assert ksplit.metrics["busy_ratios"]["DDR bandwidth"] > 0  # weights streamed once from DDR
    assert ksplit.metrics["bytes_by_level"]["DDR"] >= w_bytes
