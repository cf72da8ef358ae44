"""The flash-attention kernel on ascend-sim: values against numpy (fp16: fp32 statistics, P rounded
to fp16 as the cube takes it), the two clocks, the score tile kept off GM, the causal bound."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend.ascend.program import DataMove, Mmad
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload

TOL = dict(atol=2e-3, rtol=2e-3)  # fp16 outputs of magnitude <= ~3; the reference rounds P as the kernel does

CASES = [
    ("b=1,h=2,sq=128,skv=128,d=64", {"q_tile": 64, "kv_tile": 64}),
    ("b=2,h=2,sq=100,skv=300,d=40,causal=1,mask=2", {"q_tile": 64, "kv_tile": 64}),  # odd sizes, mask per batch
    ("b=1,h=3,sq=257,skv=129,d=64,causal=1", {"q_tile": 32, "kv_tile": 32, "double_buffer": 0}),
    ("b=1,h=1,sq=20,skv=200,d=130,mask=1", {"q_tile": 16, "kv_tile": 64}),  # d past 128, one shared mask
    ("b=1,h=2,sq=64,skv=256,d=128,causal=1", None),  # the derived default
]


@pytest.mark.parametrize("shape,cfg", CASES)
def test_values_against_numpy(backend, shape, cfg):
    wl = workload("attention", shape, dtype="float16")
    kern = backend.build(wl, {**cfg, "block_dim": 4} if cfg else None)
    ins = get_op("attention").make_inputs(wl, seed=3)
    res = backend.run(kern, ins)
    np.testing.assert_allclose(res.outputs[0].astype(np.float32),
                               get_op("attention").reference(wl, ins).astype(np.float32), **TOL)


def test_large_scores_keep_fp32_statistics(backend):
    """Scores near 60 overflow exp in fp16; the running max in fp32 keeps the softmax exact."""
    wl = workload("attention", "b=1,h=1,sq=32,skv=96,d=16,scale=1.0", dtype="float16")
    q, k, v = get_op("attention").make_inputs(wl, seed=1)
    k = (k * 4).astype(np.float16)
    res = backend.run(backend.build(wl, {"q_tile": 16, "kv_tile": 32}), [q, k, v])
    ref = get_op("attention").reference(wl, [q, k, v])
    assert np.isfinite(res.outputs[0]).all()
    np.testing.assert_allclose(res.outputs[0].astype(np.float32), ref.astype(np.float32), **TOL)


def test_clocks_agree_and_scores_stay_on_chip(backend):
    wl = workload("attention", "b=1,h=2,sq=96,skv=160,d=64,causal=1", dtype="float16")
    kern = backend.build(wl, {"q_tile": 32, "kv_tile": 64, "double_buffer": 1, "block_dim": 2})
    fun = backend.run(kern, get_op("attention").make_inputs(wl))
    tim = backend.measure(kern)
    assert fun.cycles == tim.cycles > 0
    plan = kern.artifact.plan
    gm_written = sum(ins.nbytes for core in range(plan.active_cores) for ins in plan.make_program(core).instrs
                     if isinstance(ins, DataMove) and ins.path[1] == "GM")
    assert gm_written == 2 * 96 * 64 * 2  # the output and nothing else: no score byte reaches GM


def test_causal_bound_skips_tiles_above_the_diagonal(backend):
    """sq = skv = 256 in 64 x 64 tiles: 4 + 3 + 2 + 1 = 10 tile pairs per head (16 without the
    bound), each one Q K^T and one P V on the cube."""
    for causal, pairs in ((1, 10), (0, 16)):
        wl = workload("attention", f"b=1,h=1,sq=256,skv=256,d=64,causal={causal}", dtype="float16")
        plan = backend.build(wl, {"q_tile": 64, "kv_tile": 64, "double_buffer": 1, "block_dim": 1}).artifact.plan
        mmads = [i for i in plan.make_program(0).instrs if isinstance(i, Mmad)]
        assert len(mmads) == 2 * pairs
        assert {(i.m1, i.k1, i.n1) for i in mmads} == {(4, 4, 4)}  # 64 rows x d 64 x 64 keys, in fractals


def test_fp32_is_refused_in_one_line(backend):
    with pytest.raises(OpcError, match="float16") as e:
        backend.build(workload("attention", "b=1,h=1,sq=32,skv=32,d=16", dtype="float32"))
    assert "\n" not in str(e.value)


def test_causal_tiles_are_balanced_and_core_0_is_the_heaviest(backend):
    """Under the causal bound query tiles differ in work (tile i has i + 1 key tiles here); they are
    dealt longest first to the least loaded core, and core 0 (the one the timing replays) carries
    the most: 16 tiles of 1..16 key tiles over 4 cores, 136 pairs, 34 per core."""
    wl = workload("attention", "b=1,h=1,sq=1024,skv=1024,d=64,causal=1", dtype="float16")
    plan = backend.build(wl, {"q_tile": 64, "kv_tile": 64, "double_buffer": 1, "block_dim": 4}).artifact.plan
    pairs = [sum(isinstance(i, Mmad) for i in plan.make_program(c).instrs) // 2 for c in range(4)]
    assert sorted(pairs) == [34, 34, 34, 34] and pairs[0] == max(pairs)
