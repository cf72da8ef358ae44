"""Transposes that move the innermost axis on ascend-sim: vnchwconv, the vector unit's transpose.

`schedules/ascend/move.py` reads a tile of x into UB in runs of whole rows (MTE2), the op's
block is the transpose UB -> UB (`vector_transpose`), which `lower.move` lowers to vnchwconv
(`program.VecTrans`: 16 x 32 B blocks per repeat, the tile's rows padded to 16 and its columns to a
32 B block in UB), and the transposed tile leaves in runs (MTE3). Before, such a transpose was
copied one element per DMA (about 200 cycles an element) and refused past 65536 elements.
Outputs are copies: bit-exact against numpy; both clocks (functional, timing) agree.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend import get_backend
from opcompiler.backend.ascend import execute, fclock
from opcompiler.backend.ascend.timing import schedule
from opcompiler.backend.ascend import KernelBuilder
from opcompiler.backend.ascend.program import DataMove, Memory, Scalar, VecTrans
from opcompiler.backend.ascend.machine import Machine
from opcompiler.ops import get_op, workload
from opcompiler.schedules.ascend.move import transpose_geometry, vector_tile
from opcompiler.target import load_target

TARGET = load_target("ascend-sim")
SMALL = {"ub_tile": 1024, "double_buffer": 1, "block_dim": 4}
CASES = [  # (dims, perm, config): odd sizes, size-1 axes, partial tiles, every rule of the tile choice
    ("16x16", "10", None), ("3x5", "10", None), ("17x33", "10", SMALL), ("4x6x5", "201", None),
    ("2x3x40x40", "0132", None), ("2x3x40x40", "0132", {"ub_tile": 4096, "double_buffer": 0, "block_dim": 8}),
    ("6x5x4x3", "3012", {"ub_tile": 1024, "double_buffer": 0, "block_dim": 2}), ("7x33x17", "210", SMALL),
    ("5x1x3x1x7", "42130", None), ("2x1x3x2x3", "43210", None), ("3x600", "10", {"ub_tile": 2048, "double_buffer": 1,
                                                                                   "block_dim": 32}),
    ("130x17x300x3", "2031", None), ("9x130x130", "021", {"ub_tile": 8192, "double_buffer": 1, "block_dim": 4}),
    # more than 65536 elements (refused before)
    ("1x12x128x64", "0132", None), ("300x301", "10", None), ("257x1000", "10", {"ub_tile": 2048, "double_buffer": 0,
                                                                               "block_dim": 8}),
    ("3x5x7x11x13", "43210", None), ("1x3x224x224", "0231", None), ("1x224x224x3", "0312", None),
]


def _wl(dims: str, perm: str, dtype: str):
    return workload("transpose", f"dims={dims},perm={perm}", dtype=dtype)


@pytest.fixture(scope="module")
def be():
    return get_backend(TARGET)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("dims,perm,cfg", CASES, ids=lambda v: str(v))
def test_values_are_numpy_s_bit_for_bit_and_the_clocks_agree(be, dims, perm, cfg, dtype):
    wl = _wl(dims, perm, dtype)
    d = get_op("transpose")
    ins = d.make_inputs(wl, 5)
    kern = be.build(wl, cfg)
    run = be.run(kern, ins)
    ref = d.reference(wl, ins)
    assert run.outputs[0].shape == ref.shape and run.outputs[0].tobytes() == ref.tobytes()
    assert run.cycles == be.measure(kern).cycles
    prog = kern.artifact.program
    moves = [i for i in prog.instrs if isinstance(i, DataMove)]
    trans = [i for i in prog.instrs if isinstance(i, VecTrans)]
    tiles = sum(isinstance(i, Scalar) for i in prog.instrs)
    assert trans and len(moves) == 2 * tiles  # one move in and one out per tile, never one per element


def test_goal_shape_runs_within_twice_the_transpose_that_keeps_the_last_axis():
    """dims=1x12x128x64: perm 0132 (vnchwconv) at most twice the cycles of 0213 (runs of 64 kept)."""
    for dtype in ("float16", "float32"):
        moved = run_op("transpose", "ascend-sim", shape="dims=1x12x128x64,perm=0132", dtype=dtype)
        kept = run_op("transpose", "ascend-sim", shape="dims=1x12x128x64,perm=0213", dtype=dtype)
        assert moved["correct"] and moved["max_abs_err"] == 0
        assert moved["cycles"] == moved["timing_cycles"]
        assert moved["cycles"] <= 2 * kept["cycles"], (dtype, moved["cycles"], kept["cycles"])


def test_one_block_by_hand():
    """dims=16x16, perm=10, fp16, one core, one buffer: a 512 B tile, one vnchwconv repeat.

    ascend910-sim: launch 1000; issue 2 cycles an instruction; set_flag/wait_flag 4. One core:
    HBM 1200 B/cycle shared by one reader and one writer = 600 B/cycle each, above the paths.
        MTE2 GM -> UB  issued 1002: 200 + 512 / 110 = 204.7 -> 205 cycles, ends 1207
        V vnchwconv    issued 1004, waits for MTE2 + flag: starts 1211; 16 + 1 repeat x 1 cycle
                       x (16 blocks x 32 B / 256 B) = 18 cycles, ends 1229
        MTE3 UB -> GM  issued 1006, waits for V + flag: starts 1233; 200 + 512 / 64 = 208, ends 1441
        loop control   6 cycles of scalar issue (ends before)
    """
    rep = run_op("transpose", "ascend-sim", shape="dims=16x16,perm=10", dtype="float16",
                 config={"ub_tile": 1024, "double_buffer": 0, "block_dim": 1})
    assert rep["correct"] and rep["cycles"] == rep["timing_cycles"] == 1441
    assert rep["instructions_core0"] == 4 and rep["sync_events_core0"] == 2
    prog = get_backend(TARGET).build(_wl("16x16", "10", "float16"),
                                     {"ub_tile": 1024, "double_buffer": 0, "block_dim": 1}).artifact.program
    assert [type(i).__name__ for i in prog.instrs] == ["DataMove", "VecTrans", "DataMove", "Scalar"]
    assert prog.instrs[1].repeat == 1 and prog.instrs[1].cost_cycles(prog.machine) == 18


def test_goal_shape_instructions(be):
    """1x12x128x64 perm 0132, fp16, default config: two 128 x 64 matrices a tile (6 tiles, one a
    core); each matrix is 8 row bands x 4 column blocks of 16 x 16, one vnchwconv per column
    block with 8 repeats (source rows 64 elements apart, destination rows 128)."""
    kern = be.build(_wl("1x12x128x64", "0132", "float16"))
    prog = kern.artifact.program
    assert prog.active_cores == 6
    kinds = [type(i).__name__ for i in prog.instrs]
    assert kinds == ["DataMove"] + ["VecTrans"] * 8 + ["DataMove", "Scalar"]
    t = [i for i in prog.instrs if isinstance(i, VecTrans)]
    assert {(i.repeat, i.src_rep, i.dst_rep) for i in t} == {(8, 64, 1)}
    assert t[0].src_addrs == tuple(range(0, 16 * 64, 64)) and t[0].dst_addrs == tuple(range(0, 16 * 128, 128))
    assert all(i.bursts == 1 for i in prog.instrs if isinstance(i, DataMove))  # whole rows: one run each way


@pytest.mark.parametrize("dtype,shape", [("float16", (16, 16)), ("float32", (8, 16))])
def test_vnchwconv_transposes_one_block(dtype, shape):
    """One repeat: 16 source blocks of 32 B (rows) -> the transpose, in C order, as 16 blocks of
    32 B (fp32: 8 rows of 16, two blocks a row), at arbitrary block addresses."""
    m = Machine.from_target(TARGET)
    kb = KernelBuilder(m)
    src = kb.alloc("UB", "a", (2 * 16 * 32 // np.dtype(dtype).itemsize,), dtype)
    dst = kb.alloc("UB", "b", (16 * 32 // np.dtype(dtype).itemsize,), dtype)
    epb = 32 // np.dtype(dtype).itemsize
    x = np.arange(src.shape[0]).astype(dtype)
    rows = [2 * epb * i for i in range(16)]  # every other block
    ins = VecTrans(dst=dst, dst_addrs=tuple(epb * k for k in range(16)), src=src, src_addrs=tuple(rows), repeat=1,
                   dst_rep=0, src_rep=0)
    mem = Memory({"UB": m.level("UB").capacity}, {})
    mem.view(src)[...] = x
    assert ins.execute(mem) == 16 * epb
    block = np.stack([x[r:r + epb] for r in rows])  # (16, E)
    assert block.T.shape == shape and np.array_equal(mem.view(dst), block.T.reshape(-1))


def test_builder_refuses_unaligned_or_overrunning_blocks():
    from opcompiler.errors import OpcFailure

    kb = KernelBuilder(Machine.from_target(TARGET))
    a = kb.alloc("UB", "a", (16, 32), "float16")
    b = kb.alloc("UB", "b", (32, 16), "float16")
    kb.transpose(b, 0, 16, a, 0, 32, 16, 32)
    assert len(kb.instrs) == 1 and kb.instrs[0].repeat == 2
    with pytest.raises(OpcFailure):
        kb.transpose(b, 0, 16, a, 8, 32, 16, 32)  # not a whole 32 B block
    with pytest.raises(OpcFailure):
        kb.transpose(b, 0, 16, a, 0, 32, 17, 32)  # 17 rows pad to 32: past the buffer


def test_a_corrupted_vnchwconv_gives_a_wrong_result(be):
    """The simulator runs what the lowering emitted: one source block address off by a block."""
    wl = _wl("4x6x5", "201", "float16")
    ins = get_op("transpose").make_inputs(wl, 2)
    kern = be.build(wl)
    plan = kern.artifact.plan
    prog = plan.make_program(0)
    k = next(j for j, i in enumerate(prog.instrs) if isinstance(i, VecTrans))
    t = prog.instrs[k]
    prog.instrs[k] = dataclasses.replace(t, src_addrs=(t.src_addrs[1],) + t.src_addrs[1:])
    prog.instrs[k].pipe, prog.instrs[k].reads, prog.instrs[k].writes = t.pipe, t.reads, t.writes
    out, _ = execute.run(plan, prog, ins)
    assert not np.array_equal(out, get_op("transpose").reference(wl, ins))


def test_each_clock_counts_the_transpose_on_its_own(be, monkeypatch):
    """The vnchwconv cost broken in one accounting at a time: the clocks, equal before, differ."""
    wl = _wl("2x3x40x40", "0132", "float16")
    ins = get_op("transpose").make_inputs(wl, 1)
    kern = be.build(wl)
    plan, prog = kern.artifact.plan, kern.artifact.program

    def functional(fc=None):
        mem = Memory({lv: v.capacity for lv, v in prog.machine.levels.items()}, plan.pack(ins))
        mem.gm[plan.out_name] = np.zeros(plan.out_shape, plan.out_dtype)
        return execute.replay(prog, mem, fc).cycles

    timing = schedule(prog).cycles
    assert functional() == timing
    fc = fclock.clock(TARGET)
    assert functional(dataclasses.replace(fc, vec_repeat_bytes=fc.vec_repeat_bytes * 2)) != timing
    orig = VecTrans.cost_cycles
    monkeypatch.setattr(VecTrans, "cost_cycles", lambda self, m, r=0.0, w=0.0: orig(self, m, r, w) + 1)
    assert schedule(prog).cycles != functional()


def test_the_tile_choice():
    """Whole R x C slices (and a batch range) when they fit half the UB tile, padded; else whole
    rows of one side; else a square of 16-multiples."""
    g = transpose_geometry(_wl("1x12x128x64", "0132", "float16"))
    assert g.vector and g.sizes == (12, 128, 64) and g.order == (0, 2, 1)
    assert vector_tile(g.sizes, g.order, 2, 32768) == (2, 128, 64)
    assert vector_tile(g.sizes, g.order, 2, 8192) == (1, 64, 64)  # 128 x 64 > 4096 elements: a square of 64
    assert vector_tile((1000, 1000), (1, 0), 2, 32768) == (128, 128)
    assert vector_tile((3, 50176), (1, 0), 2, 32768) == (3, 1024)
    g = transpose_geometry(_wl("2x1x5", "210", "float16"))  # size-1 axes dropped: (2, 5) -> (5, 2)
    assert g.vector and g.sizes == (2, 5) and g.order == (1, 0)
    g = transpose_geometry(_wl("4x5x1", "021", "float16"))  # only a size-1 axis moves: a plain copy
    assert not g.vector and (g.blocks, g.run) == (1, 20)
