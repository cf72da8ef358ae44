"""The simulator core both machines share: buffers, the scoreboard, channels, the profile."""
from __future__ import annotations

import pytest

from opcompiler import errors
from opcompiler.backend.ascend import KernelBuilder
from opcompiler.backend.ascend.machine import Machine
from opcompiler.backend.dsp.machine import machine as dsp_machine
from opcompiler.backend.dsp.program import Allocator, Op
from opcompiler.backend.ascend.program import Instr
from opcompiler.sim import Arena, CapacityError, Channels, Clocked, Instruction, Scoreboard, Timing, barrier
from opcompiler.sim.scoreboard import run_repeated
from opcompiler.target import load_target


def test_one_capacity_error_a_clean_user_error():
    assert CapacityError is errors.CapacityError and issubclass(CapacityError, errors.OpcError)
    a = Arena("UB", 1000, 32)
    assert a.alloc("x", 10) == 0 and a.alloc("y", 10) == 32  # aligned
    with pytest.raises(CapacityError, match="'z' needs 1000 B in UB but only 936 B") as e:
        a.alloc("z", 1000, "z is (500,) float16")
    assert (e.value.buffer, e.value.level, e.value.need_bytes, e.value.capacity_bytes) == ("z", "UB", 1000, 936)
    assert "x 10 B, y 10 B" in str(e.value)


def test_both_machines_allocate_through_the_core():
    asc = Machine.from_target(load_target("ascend-sim"))
    kb = KernelBuilder(asc)
    kb.alloc("UB", "a", (3,), "float16")
    b = kb.alloc("UB", "b", (16,), "float16")
    assert b.offset == asc.level("UB").alignment and isinstance(kb.arenas["UB"], Arena)
    with pytest.raises(CapacityError, match="in L0A"):
        kb.alloc("L0A", "huge", (asc.level("L0A").capacity,), "float16")
    dm = dsp_machine(load_target("dsp-sim"))
    am = Allocator.of(dm.level("AM"))  # the target's capacity and alignment
    assert (am.capacity, am.align) == (dm.cap("AM"), 128) and am.alloc("p", 3) == 0 and am.alloc("q", 1) == 32
    dsp = Allocator("AM", 1024)
    assert isinstance(dsp, Arena) and dsp.alloc("t", 3) == 0 and dsp.alloc("u", 1) == 64 // 4
    with pytest.raises(CapacityError, match="'v' needs 2048 B in AM"):
        dsp.alloc("v", 512)


def test_clocks_in_hz_on_both_machines():
    asc = Machine.from_target(load_target("ascend-sim"))
    dsp = dsp_machine(load_target("dsp-sim"))
    for m, ghz in ((asc, load_target("ascend-sim").clock_ghz), (dsp, load_target("dsp-sim").clock_ghz)):
        assert isinstance(m, Clocked) and m.clock_hz == ghz * 1e9 and m.clock_ghz == ghz
        assert m.cycles_to_seconds(m.clock_hz) == 1.0


def test_both_isas_implement_the_instruction_protocol():
    assert issubclass(Instr, Instruction) and issubclass(Op, Instruction)
    op = Op("dma", "dma", reads=("a",), writes=("b",), fn=lambda mem: 7)
    assert op.unit == "dma" and op.execute(None) == 7
    dsp = dsp_machine(load_target("dsp-sim"))
    dma = Op("dma", "dma", nbytes=4096, path="DDR->AM", nruns=4)
    from opcompiler.backend.dsp.timing import dma_cycles  # the DSP's costs live in its timing model
    assert dma_cycles(dsp, dma)[0] == dsp.dma_startup + dsp.ddr_latency + 4096 // dsp.dma_bytes_per_cycle \
        + 4 * dsp.dma_row_cycles
    assert Op("vpu", "vpu", cycles=17).cost_cycles(dsp) == 17
    from opcompiler.backend.ascend import timing
    from opcompiler.backend.ascend.program import Mmad
    from opcompiler.backend import get_backend
    from opcompiler.ops import workload
    be = get_backend(load_target("ascend-sim"))
    prog = be.build(workload("matmul", "m=32,k=64,n=32", dtype="float16")).artifact.program
    timing.schedule(prog)  # leaves each instruction's cost of the last contention round
    mm = next(i for i in prog.instrs if isinstance(i, Mmad))
    assert mm.cycles == mm.cost_cycles(prog.machine) == prog.machine.cube_startup + mm.m1 * mm.k1 * mm.n1


def test_scoreboard_raw_war_and_flags():
    sb = Scoreboard(("A", "B"), sync_cycles=5, issue_cycles=1, issue_unit="S")
    assert sb.place("A", (), ("x",), 10) == 11  # issued at 1
    assert sb.place("B", ("x",), ("y",), 3) == 11 + 5 + 3  # RAW across pipes: + a flag
    assert sb.place("A", (), ("x",), 2) == 11 + 5 + 3 + 5 + 2  # WAR on x (B read it): waits + a flag
    assert sb.syncs == 2 and sb.busy["S"] == 3 and sb.busy["A"] == 12 and sb.busy["B"] == 3
    plain = Scoreboard(("A", "B"))
    plain.place("A", (), ("x",), 10)
    assert plain.place("B", ("x",), (), 3) == 13 and plain.syncs == 0


def test_channels_are_shared_and_barriers_align_cores():
    busy: dict = {}
    ch = Channels(("ddr",), busy={"ddr": 0.0})
    cores = [Scoreboard(("dma", "vpu"), mult=k) for k in (1, 3)]
    e0 = cores[0].place("dma", (), ("a",), 5, ch, (("ddr", 100),), 2)
    e1 = cores[1].place("dma", (), ("a",), 5, ch, (("ddr", 100),), 2)
    assert (e0, e1) == (102, 402) and ch.busy["ddr"] == 400  # the second group waits and holds 3x
    cores[0].place("vpu", ("a",), (), 1)
    barrier(cores)
    assert all(sb.now() == 402 for sb in cores) and busy == {}


@pytest.mark.parametrize("count", [1, 2, 5, 40])
def test_steady_state_skip_is_exact(count):
    def go(skip):
        sb = Scoreboard(("dma", "vpu", "sync"), work=("dma", "vpu"))
        ch = Channels(("ddr",))
        body = [("dma", (), ("t0",), 7, (("ddr", 9),)), ("vpu", ("t0",), ("o",), 11, ()),
                ("dma", ("o",), (), 3, (("ddr", 4),))]
        skipped = []
        run_repeated(sb, ch, tuple(body), count, lambda i: sb.place(i[0], i[1], i[2], i[3], ch, i[4], 1),
                     skipped.append, skip=skip)
        return sb.now(), dict(sb.busy), dict(ch.busy), skipped
    fast, slow = go(True), go(False)
    assert fast[:3] == slow[:3] and slow[3] == []


def test_timing_reads_machine_counters_as_attributes():
    t = Timing(cycles=10, busy={"M": 4}, host_cycles=3, detail={"gm_read_bytes": 64})
    assert t.gm_read_bytes == 64 and t.device_cycles == 7
    with pytest.raises(AttributeError):
        t.nothing
