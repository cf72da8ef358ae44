"""Transposes that keep the innermost axis on ascend-sim: strided DMAs, not a DMA per run.

`schedules/ascend/move.py` views x and y as the permutation with its size-1 axes dropped and
adjacent axes merged, writes the op's block into a UB tile laid out as y and copies the tile out
in one move (MTE3). The block is the move in (MTE2): y's leading axes whose x axes come in the
same order (a chain, `runs_tile`) and the kept run are one DMA that gathers those runs from x
(x's box and the tile's box in one C order; the DMA pays the path's burst cost for every run
after the first, on the side where they lie apart), the tile's other leading axes an instruction
loop around it. Before, each run was its own DMA (a head split of 64 KiB, 512 runs of 128 B:
105,654 cycles, ~35x a copy of the same bytes). Outputs are copies: bit-exact against numpy;
both clocks (functional, timing) agree.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend import get_backend
from opcompiler.backend.ascend import execute, fclock
from opcompiler.backend.ascend.timing import schedule
from opcompiler.backend.ascend.program import DataMove, Memory
from opcompiler.ops import get_op, workload
from opcompiler.schedules.ascend.move import runs_tile, transpose_geometry
from opcompiler.target import load_target

TARGET = load_target("ascend-sim")
SMALL = {"ub_tile": 1024, "double_buffer": 1, "block_dim": 4}
CASES = [  # (dims, perm, config): head split / merge, batches, odd sizes, size-1 axes, partial tiles
    ("128x4x64", "102", None), ("1x12x128x64", "0213", None), ("1x4x128x64", "2013", None),
    ("2x128x12x64", "0213", None), ("2x12x128x64", "0213", {"ub_tile": 4096, "double_buffer": 0, "block_dim": 8}),
    ("7x5x9", "102", None), ("33x17x13", "102", SMALL), ("9x130x24", "102", SMALL),
    ("3x5x7x11", "2103", None), ("3x5x7x11", "1203", {"ub_tile": 2048, "double_buffer": 1, "block_dim": 2}),
    ("5x1x3x1x7x9", "320145", None), ("2x3x4x5x8", "31024", SMALL), ("6x7x1x10", "1023", None),
    ("40x3x24", "102", {"ub_tile": 1024, "double_buffer": 0, "block_dim": 1}),
]


def _wl(dims: str, perm: str, dtype: str):
    return workload("transpose", f"dims={dims},perm={perm}", dtype=dtype)


@pytest.fixture(scope="module")
def be():
    return get_backend(TARGET)


def _moves(g, tile: int) -> tuple[int, int]:
    """(DMAs in over the whole tensor: one per chain box, a tile's other axes one each; tiles:
    one DMA out each)."""
    ext, chain = runs_tile(g.sizes, g.order, tile)
    y = [g.sizes[k] for k in g.order[:-1]]
    tiles = [-(-n // e) for n, e in zip(y, ext)]
    return int(np.prod([t if k in chain else n for k, (n, t) in enumerate(zip(y, tiles))])), int(np.prod(tiles))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("dims,perm,cfg", CASES, ids=lambda v: str(v))
def test_values_are_numpy_s_bit_for_bit_and_the_clocks_agree(be, dims, perm, cfg, dtype):
    wl = _wl(dims, perm, dtype)
    g = transpose_geometry(wl)
    assert not g.vector and len(g.sizes) > 1
    d = get_op("transpose")
    ins = d.make_inputs(wl, 5)
    kern = be.build(wl, cfg)
    run = be.run(kern, ins)
    ref = d.reference(wl, ins)
    assert run.outputs[0].shape == ref.shape and run.outputs[0].tobytes() == ref.tobytes()
    assert run.cycles == be.measure(kern).cycles
    plan = kern.artifact.plan
    progs = [plan.make_program(c) for c in range(plan.active_cores)]
    moves = [i for p in progs for i in p.instrs if isinstance(i, DataMove)]
    into = [i for i in moves if i.path == ("GM", "UB")]
    out = [i for i in moves if i.path == ("UB", "GM")]
    assert (len(into), len(out)) == _moves(g, (cfg or {"ub_tile": 32768})["ub_tile"])
    assert len(into) < g.blocks  # never a DMA per run
    nbytes = int(np.prod([int(v) for v in dims.split("x")])) * np.dtype(dtype).itemsize
    assert sum(i.nbytes for i in into) == sum(i.nbytes for i in out) == nbytes


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("dims,perm", [("128x4x64", "102"), ("1x12x128x64", "0213"), ("1x4x128x64", "2013")])
def test_head_split_and_merge_run_within_3x_a_copy_of_the_same_bytes(dims, perm, dtype):
    """The transformer's head split / merge (default config) against the identity permutation of
    the same dims (a copy: one move in, one out per tile), measured here on both clocks."""
    moved = run_op("transpose", "ascend-sim", shape=f"dims={dims},perm={perm}", dtype=dtype)
    copy = run_op("transpose", "ascend-sim", shape=f"dims={dims},perm={''.join(map(str, range(len(perm))))}",
                  dtype=dtype)
    for rep in (moved, copy):
        assert rep["correct"] and rep["max_abs_err"] == 0 and rep["cycles"] == rep["timing_cycles"]
    assert moved["cycles"] <= 3 * copy["cycles"], (dims, perm, dtype, moved["cycles"], copy["cycles"])


def test_one_tile_by_hand():
    """dims=16x2x16, perm=102, fp16, one core, one buffer: y is (2, 16, 16), one tile of 512
    elements; the chain is y's axis 1 (x's axis 0): two DMAs in, each 16 runs of 32 B from x
    (rows 64 B apart) into the tile's half for one y row, then the tile out in one run.

    ascend910-sim: launch 1000; issue 2 cycles an instruction; set_flag/wait_flag 4. One core:
    HBM 1200 B/cycle shared by one reader and one writer = 600 B/cycle each, above the paths.
        MTE2 GM -> UB  issued 1002: 200 + 512 / 110 + 2 x 15 bursts = 234.7 -> 235, ends 1237
        MTE2 GM -> UB  issued 1004, waits for the pipe: 1237 + 235, ends 1472
        MTE3 UB -> GM  waits for MTE2 + flag: starts 1476; 200 + 1024 / 64 = 216, ends 1692
    """
    cfg = {"ub_tile": 1024, "double_buffer": 0, "block_dim": 1}
    rep = run_op("transpose", "ascend-sim", shape="dims=16x2x16,perm=102", dtype="float16", config=cfg)
    assert rep["correct"] and rep["cycles"] == rep["timing_cycles"] == 1692
    assert rep["instructions_core0"] == 4 and rep["sync_events_core0"] == 1
    prog = get_backend(TARGET).build(_wl("16x2x16", "102", "float16"), cfg).artifact.program
    assert [type(i).__name__ for i in prog.instrs] == ["DataMove", "DataMove", "DataMove", "Scalar"]
    a, b, c = prog.instrs[:3]
    assert a.src_idx == (slice(0, 16), slice(0, 1), slice(0, 16))  # x[:, 0, :]: 16 runs, 64 B apart
    assert a.dst_idx == (slice(0, 1), slice(0, 16), slice(0, 16))  # the tile's y row 0
    assert (b.src_idx[1], b.dst_idx[0]) == (slice(1, 2), slice(1, 2))
    assert (a.bursts, a.nbytes, c.bursts, c.nbytes) == (16, 512, 1, 1024)


def test_the_chain_and_tile_choice():
    """The chain leaves the fewest DMAs in; the tile takes it whole, then the other axes."""
    g = transpose_geometry(_wl("1x12x128x64", "0213", "float16"))  # x (12, 128, 64), y (128, 12, 64)
    assert (g.sizes, g.order, g.run, g.blocks) == ((12, 128, 64), (1, 0, 2), 64, 1536)
    assert runs_tile(g.sizes, g.order, 32768) == ((128, 4), (0,))  # 4 DMAs of 128 runs a tile, 3 tiles
    assert runs_tile(g.sizes, g.order, 4096) == ((64, 1), (0,))
    g = transpose_geometry(_wl("128x4x64", "102", "float16"))  # y (4, 128, 64)
    assert runs_tile(g.sizes, g.order, 32768) == ((4, 128), (1,))
    g = transpose_geometry(_wl("2x3x5x9x8", "01324", "float16"))  # 0, 1 merged: x (6, 5, 9, 8), y (6, 9, 5, 8)
    assert g.sizes == (6, 5, 9, 8) and g.order == (0, 2, 1, 3)
    assert runs_tile(g.sizes, g.order, 32768) == ((6, 9, 5), (0, 1))  # (6, 9) in both orders: 5 DMAs in


def test_a_corrupted_strided_dma_gives_a_wrong_result(be):
    """The simulator runs what the lowering emitted: one gather's source box one run over."""
    wl = _wl("128x4x64", "102", "float16")
    ins = get_op("transpose").make_inputs(wl, 2)
    plan = be.build(wl).artifact.plan
    prog = plan.make_program(0)
    k = next(j for j, i in enumerate(prog.instrs) if isinstance(i, DataMove) and i.path == ("GM", "UB"))
    t = prog.instrs[k]
    assert t.src_idx[1] == slice(0, 1)
    prog.instrs[k] = dataclasses.replace(t, src_idx=(t.src_idx[0], slice(1, 2), t.src_idx[2]))
    prog.instrs[k].pipe, prog.instrs[k].reads, prog.instrs[k].writes = t.pipe, t.reads, t.writes
    out, _ = execute.run(plan, prog, ins)
    assert not np.array_equal(out, get_op("transpose").reference(wl, ins))


def test_each_clock_counts_the_bursts_on_its_own(be, monkeypatch):
    """The per-burst cost broken in one accounting at a time: the clocks, equal before, differ."""
    wl = _wl("1x12x128x64", "0213", "float16")
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
    paths = {k: (bpc, lat, burst * 2) for k, (bpc, lat, burst) in fc.paths.items()}
    assert functional(dataclasses.replace(fc, paths=paths)) > timing
    orig = DataMove.cost_cycles
    monkeypatch.setattr(DataMove, "cost_cycles",
                        lambda self, m, r=0.0, w=0.0: orig(self, m, r, w) + (self.bursts > 1))
    assert schedule(prog).cycles != functional()
