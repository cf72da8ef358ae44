"""Target files and the instruction-level cost model, checked against hand-computed cycles."""
from __future__ import annotations

import tomllib

import numpy as np
import pytest

from opcompiler.backend.ascend import KernelBuilder, Machine
from opcompiler.backend.ascend.program import Memory, VOp
from opcompiler.backend.ascend.timing import schedule
from opcompiler.target import load_target


def _leaves(obj, path=""):
    if isinstance(obj, dict):
        if "value" in obj and set(obj) <= {"value", "source"}:
            yield path, obj
            return
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


@pytest.mark.parametrize("name", ["ascend910-sim", "ascend310-sim"])
def test_every_figure_has_a_source(name):
    t = load_target(name)
    doc = tomllib.loads(open(t.path, encoding="utf-8").read())
    missing = [p for p, v in _leaves(doc) if not isinstance(v, dict) or not v.get("source")]
    assert missing == []


def test_alias_and_machine():
    t = load_target("ascend-sim")
    assert t.name == "ascend910-sim" and t.family == "ascend"
    m = Machine.from_target(t)
    assert m.cube["float16"] == (16, 16, 16) and m.cube["int8"] == (16, 32, 16)
    assert m.lanes(2) == 128 and m.lanes(4) == 64
    assert m.level("L0A").alignment == 512 and m.level("UB").capacity == 256 * 1024
    assert m.path("GM", "L1").pipe == "MTE2" and m.path("UB", "GM").pipe == "MTE3"
    assert m.path("L1", "L0A").pipe == "MTE1" and m.path("L0C", "UB").pipe == "V"


def _mach():
    return Machine.from_target(load_target("ascend-sim"))


def test_one_dma_hand_computed():
    """One 32 KiB GM -> L1 DMA on one core: launch + issue + latency + bytes at 110 B per cycle
    (Ascend910A.ini l2_read_rate), rounded up once: 200 + 32768 / 110 = 497.9 -> 498 cycles."""
    m = _mach()
    kb = KernelBuilder(m, 0, 1)
    a = kb.gm("A", (64, 256), "float16")
    l1 = kb.alloc("L1", "A_L1", (64, 256), "float16")
    kb.data_move(l1, (slice(None),), a, (slice(None),))
    t = schedule(kb.finish(gm_inputs=("A",)))
    p = m.path("GM", "L1")
    assert (p.latency_cycles, p.bytes_per_cycle) == (200, 110)
    assert t.cycles == m.launch_cycles + m.issue_cycles + 498
    assert t.busy["MTE2"] == 498 and t.bytes_by_path == {"GM->L1": 32768}


def test_one_mmad_hand_computed_and_values():
    """Load2D A and B, one MMAD of 4x2x3 fractals: the cube runs 24 fractal-cycles + startup
    after the later of the two MTE1 loads (A at 512 B per cycle, B at 256: Ascend910A.ini
    l1_to_l0_a_rate, l1_to_l0_b_rate), and C = A @ B in fp32."""
    m = _mach()
    kb = KernelBuilder(m, 0, 1)
    a_l1 = kb.alloc("L1", "a1", (4, 2, 16, 16), "float16")
    b_l1 = kb.alloc("L1", "b1", (2, 3, 16, 16), "float16")
    a0 = kb.alloc("L0A", "a0", (4, 2, 16, 16), "float16")
    b0 = kb.alloc("L0B", "b0", (2, 3, 16, 16), "float16")
    c0 = kb.alloc("L0C", "c0", (3, 64, 16), "float32")
    kb.data_move(a0, (slice(None),), a_l1, (slice(None),))
    kb.data_move(b0, (slice(None),), b_l1, (slice(None),))
    kb.mmad(c0, a0, b0, 4, 2, 3)
    prog = kb.finish()
    t = schedule(prog)
    pa, pb = m.path("L1", "L0A"), m.path("L1", "L0B")
    assert (pa.bytes_per_cycle, pb.bytes_per_cycle) == (512, 256)
    load_a = pa.latency_cycles + 4 * 2 * 512 // 512  # 8 fractals, one per cycle
    load_b = pb.latency_cycles + 2 * 3 * 512 // 256  # 6 fractals, two cycles each
    issue = m.launch_cycles + m.issue_cycles  # the first instruction leaves the scalar unit
    b_end = issue + load_a + load_b  # MTE1 runs the two loads back to back, in order
    mmad_start = b_end + m.sync_cycles  # M waits on MTE1's flag
    assert t.busy["M"] == m.cube_startup + 24
    assert t.cycles == mmad_start + m.cube_startup + 24
    rng = np.random.default_rng(0)
    mem = Memory({k: v.capacity for k, v in m.levels.items()}, {})
    A = rng.standard_normal((64, 32)).astype("float16")
    B = rng.standard_normal((32, 48)).astype("float16")
    mem.view(a_l1)[...] = A.reshape(4, 16, 2, 16).transpose(0, 2, 1, 3)
    mem.view(b_l1)[...] = B.reshape(2, 16, 3, 16).transpose(0, 2, 3, 1)
    for ins in prog.instrs:
        ins.execute(mem)
    got = mem.view(c0).transpose(1, 0, 2).reshape(64, 48)
    np.testing.assert_allclose(got, A.astype(np.float32) @ B.astype(np.float32), rtol=1e-5, atol=1e-4)


def test_vector_repeats_masks_and_strides():
    """300 fp16 elements = 2 full 128-lane repeats + one repeat with mask 44; fp32 gets 64 lanes;
    block stride 0 reads one 32 B block for every block (a per-channel broadcast)."""
    m = _mach()
    kb = KernelBuilder(m, 0, 1)
    x = kb.alloc("UB", "x", (300,), "float16")
    y = kb.alloc("UB", "y", (300,), "float16")
    kb.vec("add", VOp(y), (VOp(x), VOp(x)), 300)
    reps = [(i.repeat, i.mask) for i in kb.instrs]
    assert reps == [(2, 128), (1, 44)]
    z = kb.alloc("UB", "z", (256,), "float32")
    kb.vec("relu", VOp(z), (VOp(z),), 256)
    assert (kb.instrs[-1].repeat, kb.instrs[-1].mask) == (4, 64)
    p = kb.alloc("UB", "p", (16,), "float16")
    q = kb.alloc("UB", "q", (128,), "float16")
    kb.vec_raw("mul", VOp(q, 0, 1, 8), (VOp(q, 0, 1, 8), VOp(p, 0, 0, 0)), 1)
    prog = kb.finish()
    mem = Memory({k: v.capacity for k, v in m.levels.items()}, {})
    xv = np.arange(300, dtype="float16") / 8
    mem.view(x)[...] = xv
    mem.view(z)[...] = np.linspace(-1, 1, 256, dtype="float32")
    mem.view(p)[...] = np.arange(16, dtype="float16")
    mem.view(q)[...] = 2
    for ins in prog.instrs:
        ins.execute(mem)
    np.testing.assert_array_equal(mem.view(y), xv + xv)
    assert (mem.view(z) >= 0).all()
    np.testing.assert_array_equal(mem.view(q), np.tile(np.arange(16) * 2, 8).astype("float16"))
    t = schedule(prog)
    v = m.vec_startup * 4 + m.vec_cycles_per_repeat * (2 + 1 + 4 + 1)
    assert t.busy["V"] == v


def test_double_buffering_overlaps_pipes():
    """The same DMA -> vector -> DMA stream: two UB slots let MTE2, V and MTE3 overlap, one slot
    serializes them on the buffer (WAR) dependency."""
    m = _mach()

    def stream(slots: int) -> int:
        kb = KernelBuilder(m, 0, 1)
        x = kb.gm("x", (8, 4096), "float16")
        y = kb.gm("y", (8, 4096), "float16")
        bufs = [kb.alloc("UB", f"u{s}", (4096,), "float16") for s in range(slots)]
        for i in range(8):
            u = bufs[i % slots]
            kb.data_move(u, (slice(None),), x, (i,))
            kb.vec("relu", VOp(u), (VOp(u),), 4096)
            kb.data_move(y, (i,), u, (slice(None),))
        return schedule(kb.finish(gm_inputs=("x",))).cycles

    single, double = stream(1), stream(2)
    assert double < 0.8 * single
