"""The ascend-sim recurrent cell (lstm, gru) with its hidden units split over cores: values against
the op references with cores run in lockstep between SyncAll barriers, the two clocks, the GM
traffic of the exchange, and the barrier's cost from the target file."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import execute
from opcompiler.backend.ascend.program import Barrier, DataMove, Memory, Scalar, SyncAll
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

BE = get_backend(load_target("ascend-sim"))


def _inputs(wl, seed=1):
    return [(a * 0.3).astype(wl.dtype) for a in get_op(wl.op).make_inputs(wl, seed=seed)]


def _cfg(bt=16, hn=16, hs=2, cores=2):
    return {"batch_tile": bt, "hidden_tile": hn, "hidden_split": hs, "block_dim": cores}


@pytest.mark.parametrize("op,shape,cfg", [
    ("lstm", "t=3,b=16,i=32,h=32", _cfg()),
    ("lstm", "t=4,b=40,i=24,h=48,reverse=1", _cfg(cores=4)),  # 3 batch tiles on 2 groups: padded barriers
    ("lstm", "t=3,b=20,i=40,h=64", _cfg(hn=16, hs=4, cores=8)),
    ("gru", "t=3,b=16,i=32,h=32", _cfg()),
    ("gru", "t=4,b=40,i=24,h=48,reverse=1", _cfg(cores=8)),
    ("gru", "t=3,b=16,i=20,h=24", _cfg(hs=1, cores=1)),
])
def test_values_and_clocks(op, shape, cfg):
    wl = workload(op, shape, dtype="float16")
    ins = _inputs(wl)
    kern = BE.build(wl, cfg)
    res = BE.run(kern, ins)
    want = get_op(op).reference(wl, [a.astype(np.float32) for a in ins])
    np.testing.assert_allclose(res.outputs[0].astype(np.float32), want, atol=2e-3, rtol=1e-2)
    assert res.cycles == BE.measure(kern).cycles > 0


def test_a_core_that_skips_the_barrier_reads_stale_h():
    """Run core 1 only after core 0 has finished (no lockstep): core 0 reads h columns core 1 has
    not yet written, and the values go wrong; in lockstep they are right."""
    wl = workload("lstm", "t=3,b=16,i=32,h=32", dtype="float16")
    ins = [a.astype(wl.dtype) for a in get_op("lstm").make_inputs(wl, seed=3)]
    plan = BE.build(wl, _cfg()).artifact.plan
    gm = plan.pack(ins)
    gm[plan.out_name] = np.zeros(plan.out_shape, plan.out_dtype)
    m = plan.make_program(0).machine
    caps = {lvl: lv.capacity for lvl, lv in m.levels.items()}
    for core in range(plan.active_cores):
        mem = Memory(caps, gm)
        for ins_ in plan.make_program(core).instrs:
            if not isinstance(ins_, (Barrier, SyncAll, Scalar)):
                ins_.execute(mem)
    want = get_op("lstm").reference(wl, [a.astype(np.float32) for a in ins])
    stale = np.abs(plan.unpack(gm[plan.out_name]).astype(np.float32) - want).max()
    out, _ = execute.run(plan, plan.make_program(0), ins)
    locked = np.abs(out.astype(np.float32) - want).max()
    assert locked < 4e-3 and stale > 20 * locked


def test_exchange_traffic_and_barriers():
    """Per core and step: its h columns written once, the tile's whole h read back once after a
    SyncAll; weights read once (its columns only, resident in L1)."""
    t, b, i, h = 4, 16, 32, 64
    wl = workload("lstm", f"t={t},b={b},i={i},h={h}", dtype="float16")
    plan = BE.build(wl, _cfg(hn=16, hs=4, cores=4)).artifact.plan
    prog = plan.make_program(0)
    syncs = sum(isinstance(x, SyncAll) for x in prog.instrs)
    assert syncs == t
    read, written = {}, {}
    for x in prog.instrs:
        if isinstance(x, DataMove) and x.path[0] == "GM":
            read[x.src.name] = read.get(x.src.name, 0) + x.nbytes
        if isinstance(x, DataMove) and x.path[1] == "GM":
            written[x.dst.name] = written.get(x.dst.name, 0) + x.nbytes
    assert written == {"Y": t * b * (h // 4) * 2}  # this core's 16 hidden units, every step
    assert read["Y"] == t * b * h * 2  # the whole h, every step
    assert read["W"] == i * 4 * (h // 4) * 2 and read["R"] == h * 4 * (h // 4) * 2  # its weight columns, once


def test_barrier_costs_the_target_figure():
    """The same kernel with the barrier's figure raised by 1,000 cycles: t barriers on core 0's
    critical path, so exactly t * 1,000 cycles more by both clocks."""
    from opcompiler.target import with_figures

    t = 3
    wl = workload("gru", f"t={t},b=16,i=32,h=32", dtype="float16")
    base = BE.measure(BE.build(wl, _cfg())).cycles
    tgt = load_target("ascend-sim")
    slow = with_figures(tgt, {"units.scalar.core_sync_cycles": tgt.unit("scalar")["core_sync_cycles"] + 1000}, "slow-sync")
    be2 = get_backend(slow)
    kern = be2.build(wl, _cfg())
    assert be2.measure(kern).cycles == base + t * 1000
    assert be2.run(kern, _inputs(wl)).cycles == base + t * 1000


def test_default_splits_the_hidden_units_of_a_large_layer():
    """nn.LSTM(512, 512) at batch 64: W and R (4 MB) do not fit one core's L1; the derived default
    splits the hidden units so each core's columns do, and every core works."""
    wl = workload("lstm", "t=2,b=64,i=512,h=512", dtype="float16")
    kern = BE.build(wl)
    plan = kern.artifact.plan
    assert plan.active_cores == 32
    assert plan.info["weights"] == "resident in L1" and plan.info["hidden_split"] > 1


def test_gru_lbr0_is_refused_in_one_line():
    from opcompiler.errors import OpcError

    with pytest.raises(OpcError) as e:
        BE.build(workload("gru", "t=2,b=16,i=16,h=16,lbr=0", dtype="float16"))
    assert "linear_before_reset" in str(e.value) and "\n" not in str(e.value)
