"""Functional-mode regressions on dsp-sim: kernels that once failed to execute (or computed wrong
values) in functional mode, run through the public API with values checked against numpy."""
import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.errors import OpcFailure

# light_resnet50's layer n16 (conv2d_bn_relu, c=256, 56x56, k=64, 1x1) with conv2d's record: two
# SM input tiles of 32 columns x 256 channels fill the 64 KB of SM exactly, and 32 pixels in
# register blocks of 12 leave a tail block of 8 whose 4 predicated-off pixels index past its
# tile. The evaluator loaded them anyway (then discarded them): in the second buffer that is
# past the end of SM, an IndexError (index 16384, size 16384) in `opcompiler compare`.
TAIL_PAST_SM = {"pw": 12, "kv": 1, "rows": 1, "cols": 32, "order": "out", "dbuf": 1, "w_path": "gsm",
                "out_path": "ddr", "split": "batch"}


@pytest.mark.parametrize("op", ["conv2d", "conv2d_bn_relu"])
def test_register_block_tail_past_sm_end(op):
    # the smallest form: one image of two rows (split=batch: one core runs both stages, the
    # second in SM's second buffer)
    rep = run_op(op, "dsp-sim", shape="n=1,c=256,h=2,w=32,k=32,r=1,s=1,stride=1,pad=0,layout=NHWC",
                 config=TAIL_PAST_SM)
    assert rep["bytes_by_level"]["SM"] >= 2 * 32 * 256 * 4  # both SM buffers written: the second one ran
    assert rep["correct"], rep["max_abs_err"]


def test_resnet50_n16_layer():
    """The layer as light_resnet50 compiles it (NCHW, relaid by DMA; items across the cores)."""
    cfg = {**TAIL_PAST_SM, "kv": 2, "split": "items"}
    rep = run_op("conv2d_bn_relu", "dsp-sim", shape="n=1,c=256,h=56,w=56,k=64,r=1,s=1,stride=1,pad=0,layout=NCHW",
                 config=cfg)
    assert rep["correct"], rep["max_abs_err"]


class _Low:
    names = {7: "data_local_SM"}


def test_out_of_memory_load_that_runs_is_a_failure():
    """Only the loads of iterations the predicates exclude are skipped: an index outside the
    memory at an iteration that runs is the program's bug, reported, never clamped."""
    from opcompiler.backend.dsp.lower.eval import TirExec

    ex = TirExec(_Low(), None, 0)
    arr = np.arange(8, dtype=np.float32)
    idx = np.arange(6, 10).reshape(1, 4)  # 8 and 9 are past the end
    got = ex._masked_load(7, arr, idx, np.array([[True, True, False, False]]), 2)
    assert got[0, :2].tolist() == [6.0, 7.0] and np.isnan(got[0, 2:]).all()
    with pytest.raises(OpcFailure, match="data_local_SM outside its memory"):
        ex._masked_load(7, arr, idx, np.array([[True, True, True, False]]), 2)
