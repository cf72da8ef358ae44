"""A chain that repeats a step (`add;add`: a bias then a residual; `mul;mul`: GELU's tail) on
ascend-sim. Each stage's TE tensor is named by its step, so the last intermediate of a repeated
step shares the output's name; the flat schedule once matched buffers by name and tried to
re-flatten that intermediate (TVM `InternalError: args.size() == initial_indices_orig.size()`).
It now matches the function's parameters by identity (`schedules/ascend/elemwise.py`).

Values against the numpy reference at the catalogue's tolerance (`opcompiler.verify.compare`)."""
from __future__ import annotations

import pytest

from opcompiler.api import run_op

CHAINS = ["sigmoid;sigmoid", "add;add", "mul;mul", "clip:0:6;clip:1:2", "affine:2:1;affine:0.5:-1",
          "hardswish;affine:1:2", "relu;add;relu;add", "bn;bn"]


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("shape,dtype", [("n=1,c=1,h=1,w=1", "float16"), ("n=1,c=3,h=5,w=7", "float32"),
                                         ("n=1,c=64,h=16,w=16", "float16")])
def test_repeated_steps_run_and_match_numpy(chain, shape, dtype):
    rep = run_op("ew_chain", "ascend-sim", shape=f"{shape},layout=NCHW,chain={chain}", dtype=dtype)
    assert rep["correct"] is True, rep
    assert rep["cycles"] > 0


def test_repeated_step_costs_what_its_instructions_cost():
    """`add;add` issues one more vector add per tile than `add`, and reads one more operand."""
    one = run_op("ew_chain", "ascend-sim", shape="n=1,c=64,h=16,w=16,layout=NCHW,chain=add", dtype="float16")
    two = run_op("ew_chain", "ascend-sim", shape="n=1,c=64,h=16,w=16,layout=NCHW,chain=add;add",
                 dtype="float16")
    assert two["correct"] and one["correct"]
    assert two["cycles"] > one["cycles"]
