"""The VPU micro-kernel scheduler and the DMA / shared-channel timing, against hand-computed cycles."""
import math

import pytest

from opcompiler.backend.dsp.timing import mk_out, mk_ws
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import Op, Program, View, dma_op
from opcompiler.errors import CapacityError, OpcError
from opcompiler.target import load_target


@pytest.fixture(scope="module")
def m():
    return machine(load_target("dsp-sim"))


def test_single_accumulator_is_latency_bound(m):
    # one chain: loads land at 4 (latency 4), FMA i issues at 4 + 6 i, the last result is ready
    # at 6 L + 4, the store completes 4 cycles later, plus the 7-cycle loop exit: 6 L + 15
    for steps in (1, 10, 576):
        assert mk_out(m, 1, 1, steps).cycles == 6 * steps + 15
    assert mk_out(m, 1, 1, 10).fmas == 10


@pytest.mark.parametrize("pw,kv,per_step", [
    (4, 2, 6),    # 8 chains < 3 FMACs x 6 cycles: still the 6-cycle latency per step
    (9, 2, 6),    # 18 chains = 3 x 6: latency and throughput meet
    (12, 2, 8),   # 24 FMAs per step at 3 per cycle: throughput bound
])
def test_fma_steady_state_per_step(m, pw, kv, per_step):
    a, b = mk_out(m, pw, kv, 300), mk_out(m, pw, kv, 200)
    assert a.cycles - b.cycles == 100 * per_step
    assert a.fmas == 300 * pw * kv


def test_fmac_utilization_grows_with_independent_accumulators(m):
    util = [mk_out(m, pw, 2, 576).fmas / (3 * mk_out(m, pw, 2, 576).cycles) for pw in (1, 4, 9)]
    assert util[0] == pytest.approx(2 / 18, rel=0.01)
    assert util[1] == pytest.approx(8 / 18, rel=0.01)
    assert util[2] > 0.98


def test_register_capacity_enforced(m):
    with pytest.raises(CapacityError, match="vector registers"):
        mk_out(m, 19, 3, 10)  # 57 accumulators + 22 per step > 64 registers
    with pytest.raises(CapacityError):
        mk_ws(m, 19, 4, 5, 5, 19, True)  # 100 weight registers


def _one_dma(m, nbytes, mult=1):
    src = View(("DDR", "x"), 0, (nbytes // 4,), (1,))
    dst = View(("AM",), 0, (nbytes // 4,), (1,))
    op = dma_op(m, src, dst, (), ("t",), False)
    return Program(cores=[[op]], multiplicity=[mult], host_pre=[], host_post=[], ddr_tensors={}, inputs=[],
                   output="", out_shape=())


def test_dma_cost_and_shared_ddr(m):
    nb = 65536
    ddr_per_cycle = 42.7e9 / 1.8e9
    # engine: 300 start-up + 200 DDR latency + 65536 / 64 + 1 run x 2; channel: start-up + the
    # transfer's whole cycles at the DDR rate
    chan = math.ceil(nb / ddr_per_cycle)
    t1 = timing(m, _one_dma(m, nb))
    assert t1.dsp_cycles == max(300 + 200 + nb // 64 + 2, 300 + chan)
    # eight cores loading at once queue on the shared DDR channel: 8x the channel time
    t8 = timing(m, _one_dma(m, nb, mult=8))
    assert t8.dsp_cycles == 300 + 8 * chan
    assert t8.counters.bytes_by_level["DDR"] == 8 * nb


def test_no_am_to_sm_path(m):
    v = View(("AM",), 0, (4,), (1,))
    with pytest.raises(OpcError, match="no AM->SM path"):
        dma_op(m, v, View(("SM",), 0, (4,), (1,)), (), (), False)


def test_barrier_waits_for_slowest(m):
    slow = Op("vpu", "vpu", cycles=1000)
    fast = Op("vpu", "vpu", cycles=10)
    after = Op("vpu", "vpu", cycles=5)
    bar = Op("barrier", "sync")
    prog = Program(cores=[[slow, bar, after], [fast, bar, after]], multiplicity=[1, 1], host_pre=[("launch", 7, 0)],
                   host_post=[], ddr_tensors={}, inputs=[], output="", out_shape=())
    t = timing(m, prog)
    assert t.dsp_cycles == 1005 and t.cycles == 1012


@pytest.mark.parametrize("kind,args", [
    ("out", (4, 8, 300, ("bias", "relu"))), ("out", (10, 2, 200, ())), ("out", (12, 2, 150, ("bn", "relu"))),
    ("out", (3, 1, 117, ())), ("ws", (57, 2, 3, 3, 19, True)), ("ws", (40, 1, 1, 1, 40, False)),
])
def test_steady_state_skip_is_exact(m, monkeypatch, kind, args):
    """Skipping whole periods of a periodic loop gives exactly the fully simulated counts."""
    import opcompiler.backend.dsp.timing as tm
    fn = (tm.mk_out if kind == "out" else tm.mk_ws).__wrapped__
    fast = fn(m, *args)
    monkeypatch.setattr(tm, "SKIP_PERIODS", False)
    assert fn(m, *args) == fast


@pytest.mark.parametrize("op,shape,config", [
    ("conv2d", "n=16,c=8,h=9,w=9,k=32,r=3,s=3,pad=1,layout=NHWC", {"rows": 1, "dbuf": 1}),
    ("conv2d", "n=16,c=8,h=9,w=9,k=32,r=3,s=3,pad=1,layout=NHWC", {"rows": 2, "dbuf": 0, "out_path": "gsm"}),
    ("conv2d", "n=20,c=4,h=6,w=20,k=40,r=3,s=3,pad=1,stride=2,layout=NHWC", {"cols": 4, "rows": 1}),
    ("bn_relu", "n=40,c=64,h=19,w=19,layout=NHWC", None),
])
def test_repeat_skip_is_exact(monkeypatch, op, shape, config):
    """Skipping repetitions of identical stages once the state is a pure time shift gives the
    same cycles, busy time and counters as issuing every stage."""
    import opcompiler.backend.dsp.timing as tm
    from opcompiler.backend import get_backend
    from opcompiler.ops import workload
    be = get_backend(load_target("dsp-sim"))
    k = be.build(workload(op, shape=shape), config)
    fast = be.measure(k)
    monkeypatch.setattr(tm, "SKIP_REPEATS", False)
    slow = be.measure(k)
    assert fast.cycles == slow.cycles
    assert fast.metrics["counters"] == slow.metrics["counters"]
    assert fast.metrics["fmac_utilization"] == pytest.approx(slow.metrics["fmac_utilization"], rel=1e-9)
