"""Unit-size dimensions on dsp-sim: the conv2d and matmul families build, run and match their
numpy references when a dimension is 1. Values are checked through `run_op`'s "correct", that is
`opcompiler.verify.compare` at `opcompiler.verify.TOLERANCE` (fp32: rtol 1e-4, atol 1e-5 of the
largest magnitude).

When a tile's extent along an axis is 1, TVM leaves that axis's loop out of the loop nest that
`compute_at` / `reverse_compute_at` create, so a schedule that picks a loop by its position finds
fewer loops than it expects. The shapes and configs below each once raised an internal error:

* the weight tile's copy (`direct._weights`): one weight element per channel block (matmul
  K = N = 1; conv C*R*S = K = 1) left no loop under the channel-block loop -> IndexError;
* split=k (`ksplit.ksplit_schedule`): with K = 1 only one K part holds data, so the loop over the
  parts under the row-block loop is left out -> IndexError;
* order=ws with an epilogue (`direct._ws_staged`): with one output channel the lanes' loop is
  left out, and a 1x1 tile then had no loop under the stage loop -> ScheduleError.
"""
import pytest

from opcompiler.api import run_op

MATMUL = dict(trans_a=0, trans_b=0)
CONV = dict(n=1, stride=1, pad=0, dilation=1, groups=1, layout="NCHW")


def _run(op, shape, config=None):
    r = run_op(op, "dsp-sim", shape=shape, dtype="float32", config=config)
    assert r["correct"], f"{op} {shape} {config}: max abs err {r.get('max_abs_err')}"
    return r


@pytest.mark.parametrize("op,shape", [
    ("matmul", dict(MATMUL, m=1, k=1, n=1)),
    ("matmul", dict(MATMUL, m=16, k=1, n=1)),
    ("matmul", dict(MATMUL, m=17, k=1, n=1, trans_a=1, trans_b=1)),
    ("matmul_bias", dict(MATMUL, m=1, k=1, n=1)),
    ("matmul_bias_relu", dict(MATMUL, m=16, k=1, n=1)),
    ("conv2d", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1)),
    ("conv2d", dict(CONV, n=2, c=1, h=7, w=3, k=1, r=1, s=1, stride=2)),
    ("conv2d_bias", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1)),
    ("conv2d_bn_relu", dict(CONV, c=1, h=7, w=7, k=1, r=1, s=1)),
    ("conv2d_bias_add_relu", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1)),
])
def test_one_weight_element(op, shape):
    """Default configs (w_path=gsm): the weight tile of one element."""
    _run(op, shape)


@pytest.mark.parametrize("w_path", ["ddr", "gsm"])
def test_one_weight_element_paths(w_path):
    cfg = dict(pw=1, kv=1, rows=1, cols=1, order="out", dbuf=1, w_path=w_path, out_path="ddr", split="items")
    _run("conv2d_bn_relu", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1), cfg)
    _run("matmul_bias_relu", dict(MATMUL, m=1, k=1, n=1), dict(cfg, algo="fc"))


@pytest.mark.parametrize("op", ["matmul", "matmul_bias_relu"])
@pytest.mark.parametrize("m,n,rows,pw", [(1, 1, 1, 1), (16, 1, 4, 2), (3, 1, 2, 1), (16, 16, 4, 2), (1, 16, 1, 1)])
def test_ksplit_k1(op, m, n, rows, pw):
    """split=k with K = 1: one K part holds data."""
    cfg = dict(pw=pw, kv=1, rows=rows, cols=1, order="out", dbuf=1, w_path="ddr", out_path="ddr", split="k",
               algo="fc")
    _run(op, dict(MATMUL, m=m, k=1, n=n), cfg)


def test_ksplit_k1_row_block_is_the_reduction_pass():
    """K = 1 keeps the structure of K = 2 (the reduction pass over the row block's rows, not over
    the features): its time is no more than K = 2's."""
    cfg = dict(pw=2, kv=1, rows=4, cols=1, order="out", dbuf=1, w_path="ddr", out_path="ddr", split="k", algo="fc")
    c1 = _run("matmul", dict(MATMUL, m=16, k=1, n=16), cfg)["cycles"]
    c2 = _run("matmul", dict(MATMUL, m=16, k=2, n=16), cfg)["cycles"]
    assert c1 <= c2


@pytest.mark.parametrize("op,shape,rows,cols", [
    ("conv2d_bn_relu", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1), 1, 1),
    ("conv2d_bias_add_relu", dict(CONV, c=1, h=1, w=1, k=1, r=1, s=1), 1, 1),
    ("conv2d_bn_relu", dict(CONV, c=1, h=1, w=1, k=1, r=3, s=3, pad=1), 1, 1),
    ("conv2d_bn_relu", dict(CONV, c=3, h=7, w=3, k=1, r=1, s=1), 2, 2),
    ("conv2d_bias", dict(CONV, c=2, h=4, w=4, k=1, r=3, s=3, pad=1), 1, 2),
])
def test_ws_epilogue_one_channel(op, shape, rows, cols):
    """order=ws with an epilogue and one output channel (no lanes' loop)."""
    cfg = dict(pw=1, kv=1, rows=rows, cols=cols, order="ws", dbuf=0, w_path="ddr", out_path="ddr", split="items")
    _run(op, shape, cfg)


def test_grouped_conv_sliced_unevenly_fits_sm_with_its_default():
    """light_shufflenet's 1x1 grouped conv (4 groups of 68 channels): the default sliced a group
    into blocks of 16 (68 % 16 = 4) and TVM's region of a stage's weights is then about the whole
    kernel's, 77,248 B against SM's 64 KB: the build was refused. The SM estimate now counts that
    region, so the default is one that builds, and the values match numpy."""
    rep = run_op("conv2d", "dsp-sim", shape="n=1,c=272,h=14,w=14,k=272,r=1,s=1,stride=1,pad=0,groups=4",
                 dtype="float32")
    assert rep["correct"] is True
