"""fm_interaction (DeepFM's pairwise term) on ascend-sim: values against the numpy reference, the
vector pipe's busy time counted by hand from the target file, e read from GM once and only the
(b, k) result written, and the two clocks agree."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import timing
from opcompiler.backend.ascend.machine import Machine
from opcompiler.backend.ascend.program import DataMove, Vec
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

TGT = load_target("ascend-sim")
BE = get_backend(TGT)
# relative to the output's magnitude: fp32 sums of up to 40 products; fp16 inputs are exact in fp32,
# the result is rounded to fp16 once (2^-11)
TOL = {"float32": 1e-5, "float16": 1e-3}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape,cfg", [
    ("b=8,f=10,k=16", None),
    ("b=37,f=7,k=100", None),  # k not whole blocks, two 64-lane chunks, a short last tile
    ("b=3,f=1,k=5", None),  # one field: the pairwise term is 0
    ("b=4,f=40,k=64", {"rows_tile": 2, "double_buffer": 1, "block_dim": 2}),  # fields too far apart for a repeat stride
    ("b=50,f=26,k=16", {"rows_tile": 8, "double_buffer": 1, "block_dim": 4}),
])
def test_values_and_clocks(shape, cfg, dtype):
    wl = workload("fm_interaction", shape, dtype=dtype)
    ins = get_op("fm_interaction").make_inputs(wl, seed=2)
    kern = BE.build(wl, cfg or "default")
    res = BE.run(kern, ins)
    want = get_op("fm_interaction").reference(wl, ins).astype(np.float64)
    got = np.asarray(res.outputs[0]).astype(np.float64)
    assert got.shape == (wl["b"], wl["k"])
    assert np.abs(got - want).max() <= TOL[dtype] * max(1.0, np.abs(want).max())
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == BE.measure(kern).cycles


def test_vector_work_by_hand():
    """One tile of 8 samples, 10 fields of 16 fp16 values, one core: the vector pipe runs the cast
    in (1,280 fp32 values: 20 repeats of 64), 2 x 9 strided adds (8 repeats each, one per sample),
    the squares (20 repeats), s * s, s - q and the cast out (2 repeats each); each instruction costs
    vec_startup + repeats x vec_cycles_per_repeat."""
    m = Machine.from_target(TGT)
    wl = workload("fm_interaction", "b=8,f=10,k=16", dtype="float16")
    prog = BE.build(wl, {"rows_tile": 8, "double_buffer": 0, "block_dim": 1}).artifact.plan.make_program(0)
    vec = [i for i in prog.instrs if isinstance(i, Vec)]
    assert [i.op for i in vec].count("add") == 18 and all(i.repeat == 8 and i.mask == 16 for i in vec if i.op == "add")

    def cost(reps: int) -> int:
        return m.vec_startup + reps * m.vec_cycles_per_repeat

    want = cost(20) + 18 * cost(8) + cost(20) + 3 * cost(2)
    assert want == 558
    assert timing.schedule(prog).busy["V"] == want


def test_e_is_read_once_and_only_the_result_leaves():
    wl = workload("fm_interaction", "b=100,f=26,k=16", dtype="float16")
    plan = BE.build(wl, {"rows_tile": 8, "double_buffer": 1, "block_dim": 4}).artifact.plan
    rd = wr = 0
    for c in range(plan.active_cores):
        for x in plan.make_program(c).instrs:
            if isinstance(x, DataMove) and x.path[0] == "GM":
                rd += x.nbytes
            elif isinstance(x, DataMove) and x.path[1] == "GM":
                wr += x.nbytes
    assert (rd, wr) == (100 * 26 * 16 * 2, 100 * 16 * 2)
