"""The matmul's one route: an s_tir schedule whose tensorized blocks are the AI Core instructions,
compiled by LLVM, run once to record the trace, then simulated."""
from __future__ import annotations

import pytest

from opcompiler.api import run_op
from opcompiler.ops import get_op, workload

TIR = {"double_buffer": 1, "block_dim": 4, "a_layout": "ND"}


@pytest.mark.parametrize("op", ["matmul", "matmul_bias", "matmul_bias_relu"])
@pytest.mark.parametrize("shape,tiles", [("m=40,k=100,n=70", (16, 16, 16)), ("m=64,k=128,n=96", (32, 64, 32))])
def test_tir_matmul_matches_numpy(op, shape, tiles):
    """The bias, cast and ReLU blocks are scheduled into UB and tensorized too (fused epilogue)."""
    cfg = {**TIR, "m_tile": tiles[0], "k_tile": tiles[1], "n_tile": tiles[2]}
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16", config=cfg)
    assert rep["correct"], rep["max_abs_err"]
    assert rep["lowering"].startswith("TVM s_tir")


def test_tir_trace_is_the_schedules_loop_nest(backend):
    """64x128x96 in 32x64x32 tiles: 2*3 output tiles, 2 k steps each -> 12 MMADs of 2x4x2
    fractals, 12 A and 12 B DMAs, 6 casts out; core 0 of 4 holds 2 tiles."""
    from opcompiler.backend.ascend.program import DataMove, Mmad

    wl = workload("matmul", "m=64,k=128,n=96", dtype="float16")
    kern = backend.build(wl, {**TIR, "m_tile": 32, "k_tile": 64, "n_tile": 32})
    plan = kern.artifact.plan
    assert plan.info["tir_tiles"] == 6
    progs = [plan.make_program(c) for c in range(plan.active_cores)]
    mmads = [i for p in progs for i in p.instrs if isinstance(i, Mmad)]
    assert len(mmads) == 12 and {(i.m1, i.k1, i.n1) for i in mmads} == {(2, 4, 2)}
    assert sum(i.init for i in mmads) == 6
    dmas = [i for p in progs for i in p.instrs if isinstance(i, DataMove) and i.path[0] == "GM"]
    assert len(dmas) == 24
    fun = backend.run(kern, get_op("matmul").make_inputs(wl))
    assert fun.cycles == backend.measure(kern).cycles


@pytest.mark.parametrize("a_layout", ["zZ", "ND"])
@pytest.mark.parametrize("op,shape,tiles", [
    ("matmul", "m=40,k=100,n=70", (32, 64, 32)),  # tiles that do not divide: pad_einsum, partial tiles clipped
    ("matmul_bias", "m=96,k=722,n=362", (64, 1024, 32)),  # a 64x1024 A tile: L0 chunks of K
    ("matmul_bias_relu", "m=1,k=2048,n=1000", (16, 2048, 32)),
])
def test_tir_partial_tiles_and_l0_chunks_match_numpy(op, shape, tiles, a_layout):
    cfg = {**TIR, "m_tile": tiles[0], "k_tile": tiles[1], "n_tile": tiles[2], "a_layout": a_layout}
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16", config=cfg)
    assert rep["correct"], rep["max_abs_err"]


@pytest.mark.parametrize("op,shape,tiles", [
    ("matmul", "m=40,k=100,n=70", (16, 32, 16)),  # no epilogue: the unpadding copy is the output block
    ("matmul", "m=32,k=64,n=32", (32, 64, 16)),  # 16-aligned: the L0C copy writes the output
    ("matmul_bias_relu", "m=130,k=300,n=200", (64, 128, 64)),
])
def test_tir_int8_matmul_matches_numpy(op, shape, tiles):
    """int8: 16x32 fractals (K0 = 32), int32 accumulation, bias and ReLU in int32, no cast."""
    cfg = {**TIR, "m_tile": tiles[0], "k_tile": tiles[1], "n_tile": tiles[2]}
    rep = run_op(op, "ascend-sim", shape=shape, dtype="int8", config=cfg)
    assert rep["correct"], rep["max_abs_err"]
    assert rep["lowering"].startswith("TVM s_tir")
