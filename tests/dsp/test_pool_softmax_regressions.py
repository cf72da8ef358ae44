"""dsp-sim regressions of pooling, softmax and the row reductions found by fuzzing, run through the
public API; values checked by run_op's "correct" (numpy reference, opcompiler.verify.TOLERANCE)."""
import pytest

from opcompiler.api import run_op
from opcompiler.cli import main as cli_main
from opcompiler.ops.limits import limits_of, unsupported


def _pool(n, c, h, w, k, st, pad, mode):
    return dict(n=n, c=c, h=h, w=w, kernel=k, stride=st, pad=pad, mode=mode, layout="NCHW")


# One plane (n = c = 1): TVM folds the plane index of the window's store to 0, and the window
# lowering took the plane loop for a tap loop ("the output loops must enclose the window loops").
@pytest.mark.parametrize("shape,config", [
    (_pool(1, 1, 1, 1, 1, 1, 0, "max"), None),
    (_pool(1, 1, 16, 3, 3, 1, 0, "max"), {"planes": 1, "rows": 2, "separable": 0, "dbuf": 0, "cores": 1}),
    (_pool(1, 1, 16, 3, 3, 1, 0, "max"), {"planes": 1, "rows": 2, "separable": 1, "dbuf": 1, "cores": 8}),
    (_pool(1, 1, 5, 7, 3, 2, 1, "avg"), None),
    (_pool(1, 1, 2, 2, 2, 1, 1, "avg"), None),
    (_pool(1, 1, 1, 1, 1, 1, 0, "avg"), None),
    (_pool(2, 1, 7, 1, 3, 2, 1, "max"), None),
])
def test_pool2d_one_plane(shape, config):
    rep = run_op("pool2d", "dsp-sim", shape=shape, dtype="float32", config=config)
    assert rep["correct"], rep["max_abs_err"]


# n = 1: the compute has no broadcast blocks (the schedule asked for them: a ScheduleError), and
# exp / the division index the (m, 1) max and sum by the column, read as a vector along the lanes
# (garbage past the row: nan).
@pytest.mark.parametrize("m", [1, 3, 33])
def test_softmax_one_column(m):
    rep = run_op("softmax", "dsp-sim", shape={"m": m, "n": 1}, dtype="float32")
    assert rep["correct"], rep["max_abs_err"]


def test_softmax_one_column_configs():
    for cfg in ({"rows": 2, "acc": 1, "dbuf": 0, "cores": 1}, {"rows": 4, "acc": 8, "dbuf": 1, "cores": 8}):
        rep = run_op("softmax", "dsp-sim", shape={"m": 7, "n": 1}, dtype="float32", config=cfg)
        assert rep["correct"], (cfg, rep["max_abs_err"])


# reduce_mean on dsp-sim: the sum, then one vector pass multiplying by 1/n (it was refused).
@pytest.mark.parametrize("m,n", [(33, 16), (1, 1), (7, 129), (17, 33)])
def test_reduce_mean_runs(m, n):
    rep = run_op("reduce_mean", "dsp-sim", shape={"m": m, "n": n}, dtype="float32")
    assert rep["correct"], rep["max_abs_err"]
    assert rep["template"] == "dsp.reduce"


@pytest.mark.parametrize("shape,cfg", [
    ({"m": 33, "n": 16}, {"rows": 1, "acc": 1, "dbuf": 0, "cores": 1}),  # one core, nothing overlaps
    ({"m": 1, "n": 1}, None),  # the default config (with more rows per core the DMAs can hide the pass)
])
def test_reduce_mean_costs_one_more_pass_than_the_sum(shape, cfg):
    s = run_op("reduce_sum", "dsp-sim", shape=shape, dtype="float32", config=cfg)
    m = run_op("reduce_mean", "dsp-sim", shape=shape, dtype="float32", config=cfg)
    assert s["correct"] and m["correct"]
    assert m["cycles"] > s["cycles"]
    # the multiply's VPU pass per row block: more vector loads / stores, the DMAs unchanged
    assert m["counters"]["vldst"] > s["counters"]["vldst"]
    assert m["counters"]["dma_transfers"] == s["counters"]["dma_transfers"]


def test_reduce_mean_not_declared_unsupported_on_dsp(capsys):
    assert unsupported("reduce_mean", "dsp", {"m": 33, "n": 16}, "float32") is None
    assert limits_of("reduce_mean", "dsp") == []
    assert cli_main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "no dsp.reduce lowering" not in out
