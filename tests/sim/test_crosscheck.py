"""Checks that can fail: functional and timing modes account cycles independently and are held
to each other, and mutations of a correct kernel -- a shifted address, a dropped dependency
(a missing set_flag/wait_flag) or barrier, a wrong latency or byte count -- change the result
or the cycles, or make the two accountings disagree.

Timing mode schedules what a program declares on the scoreboard (`sim.scoreboard`).
Functional mode executes it and accounts from the execution (`sim.trace`): on the Ascend
core the dependencies are the buffers each instruction's execution actually read and wrote
and the counters are the work it actually did; on the DSP the trace is the per-core op lists
as executed (no repeat blocks, steady-state skips or core groups)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import execute as aex, timing as asc
from opcompiler.backend.ascend.program import Barrier, DataMove, Load3D, Mmad, Scalar, Vec
from opcompiler.backend.dsp import fclock, program, timing as tm
from opcompiler.backend.dsp.lower import lower as dsp_lower
from opcompiler.backend.dsp.machine import machine as dsp_machine
from opcompiler.backend.dsp.program import Program as DspProgram, View, dma_op
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

ASC = get_backend(load_target("ascend-sim"))
DT = load_target("dsp-sim")
DSP = get_backend(DT)
DM = dsp_machine(DT)

ASC_KERNELS = [("matmul", "m=40,k=100,n=70", "float16"), ("matmul_bias_relu", "m=64,k=256,n=128", "float16"),
               ("conv2d_bn_relu", "n=2,c=13,h=10,w=10,k=20,r=3,s=3,stride=1,pad=1", "float16"),
               ("conv2d", "n=1,c=16,h=9,w=9,k=32,r=3,s=3,stride=2,pad=1", "int8"),
               ("batch_norm", "n=2,c=20,h=9,w=9", "float32"), ("add_relu", "n=1,c=16,h=20,w=20", "float16"),
               ("softmax", "m=8,n=100", "float16"), ("pool2d", "n=1,c=16,h=9,w=9,kernel=3,stride=2,pad=1", "float16")]


def _asc(op, shape, dtype):
    wl = workload(op, shape, dtype=dtype)
    k = ASC.build(wl)
    return wl, k, get_op(op).make_inputs(wl)


def _close(a, b) -> bool:
    return a.shape == b.shape and np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-2,
                                              atol=1e-2, equal_nan=False)


# ---------------------------------------------------------------- ascend: two accountings


@pytest.mark.parametrize("op,shape,dtype", ASC_KERNELS)
def test_ascend_functional_accounting_equals_timing(op, shape, dtype):
    wl, k, inputs = _asc(op, shape, dtype)
    out, fun = aex.run(k.artifact.plan, k.artifact.program, inputs)
    tim = asc.schedule(k.artifact.program)
    assert fun.cycles == tim.cycles > 0
    assert fun.busy == tim.busy and fun.syncs == tim.syncs
    # the work the execution did is the work the program declares
    for key in ("bytes_by_path", "gm_read_bytes", "gm_write_bytes", "cube_fractals", "vec_elements"):
        assert getattr(fun, key) == getattr(tim, key), key
    assert _close(out, get_op(op).reference(wl, inputs))


def test_ascend_accountings_do_not_share_the_scheduler(monkeypatch):
    """The functional clock never calls the scoreboard, the timing rates or the ISA's cost
    functions: with all of them broken it still counts the same cycles."""
    wl, k, inputs = _asc(*ASC_KERNELS[0])
    want = asc.schedule(k.artifact.program).cycles

    def broken(*a, **kw):
        raise AssertionError("the functional accounting called the timing model")
    monkeypatch.setattr(asc, "Scoreboard", broken)
    monkeypatch.setattr(asc, "_replay", broken)
    monkeypatch.setattr(asc, "_gm_rates", broken)
    monkeypatch.setattr(asc, "_hbm_fraction", broken)
    monkeypatch.setattr(asc, "cost", broken)
    for cls in (DataMove, Load3D, Mmad, Vec, Scalar):
        monkeypatch.setattr(cls, "cost_cycles", broken)
    assert aex.run(k.artifact.plan, k.artifact.program, inputs)[1].cycles == want


def test_dsp_accountings_do_not_share_the_cost_model(monkeypatch):
    """The DSP functional clock never calls the timing model's transfer cost, VPU scheduler or
    scoreboard."""
    wl, k, fprog, inputs = _dsp("ew_chain", "n=2,c=5,h=7,w=9,chain=bn;sigmoid;add", None)
    want = tm.timing(DM, fprog).cycles

    def broken(*a, **kw):
        raise AssertionError("the functional clock called the timing model")
    for mod, name in ((tm, "dma_cycles"), (tm, "Scoreboard"),
                      (tm, "kernel_cost"), (tm, "nest_cost"), (tm, "_run")):
        monkeypatch.setattr(mod, name, broken)
    monkeypatch.setattr(program.Op, "cost_cycles", broken)
    assert fclock.replay(DM, fprog, inputs)[2].cycles == want


# ---------------------------------------------------------------- ascend: mutations


def _first(prog, cls, pred=lambda i: True):
    return next(j for j, ins in enumerate(prog.instrs) if isinstance(ins, cls) and pred(ins))


def test_ascend_shifted_address_changes_the_result():
    """A cube instruction whose L0A operand address is one fractal off (512 B: a wrong tile
    index) multiplies the wrong A fractals: a wrong output."""
    wl, k, inputs = _asc("matmul", "m=40,k=100,n=70", "float16")
    prog = k.artifact.program
    good, _ = aex.run(k.artifact.plan, prog, inputs)
    j = _first(prog, Mmad)
    ins = prog.instrs[j]
    a = ins.a
    shifted = dataclasses.replace(a, id=len(prog.bufs), offset=a.offset + 512)
    mut = dataclasses.replace(ins, a=shifted)
    mut.pipe, mut.reads, mut.writes = ins.pipe, tuple(shifted if b is a else b for b in ins.reads), ins.writes
    prog.instrs[j] = mut
    try:
        bad, _ = aex.run(k.artifact.plan, prog, inputs)
    finally:
        prog.instrs[j] = ins
    assert _close(good, get_op("matmul").reference(wl, inputs)) and not _close(bad, good)


def test_ascend_dropped_flag_is_caught_by_the_cross_check():
    """Dropping the L0A/L0B dependencies of a cube instruction (a missing wait_flag between
    MTE1 and M) lets the timing replay start the cube early; the functional accounting, which sees the
    cube read L0A, does not: the two disagree, and the dropped flag is not silently accepted."""
    wl, k, inputs = _asc("matmul", "m=64,k=256,n=128", "float16")
    prog = k.artifact.program
    t0 = asc.schedule(prog).cycles
    caught = 0
    for j, ins in enumerate(prog.instrs):
        if not isinstance(ins, Mmad):
            continue
        kept = ins.reads
        ins.reads = tuple(b for b in kept if b.level not in ("L0A", "L0B"))
        t = asc.schedule(prog)
        _, fun = aex.run(k.artifact.plan, prog, inputs)
        ins.reads = kept
        assert fun.cycles == t0  # the execution still reads L0A and L0B
        if t.cycles != t0:
            caught += 1
            assert t.cycles < fun.cycles
    assert caught > 0


def test_ascend_dropped_barrier_changes_the_cycles():
    """A pipe_barrier drains every pipe; without it the pipes overlap again."""
    wl, k, inputs = _asc("matmul_bias_relu", "m=64,k=256,n=128", "float16")
    prog = k.artifact.program
    base = asc.schedule(prog).cycles
    j = _first(prog, Mmad)
    b = Barrier()
    b.pipe = "S"
    prog.instrs.insert(j, b)
    with_barrier = asc.schedule(prog).cycles
    assert with_barrier == aex.run(k.artifact.plan, prog, inputs)[1].cycles
    prog.instrs.pop(j)
    assert with_barrier > base == asc.schedule(prog).cycles


def test_ascend_wrong_latency_is_caught_by_the_cross_check():
    """A cube start-up 7 cycles too long in the timing model's figures: the timing clock rises,
    the functional clock (its own tables, read from the target) does not, so the two disagree."""
    wl, k, inputs = _asc("matmul", "m=40,k=100,n=70", "float16")
    prog = k.artifact.program
    base = asc.schedule(prog).cycles
    assert aex.run(k.artifact.plan, prog, inputs)[1].cycles == base
    m0 = prog.machine
    prog.machine = dataclasses.replace(m0, cube_startup=m0.cube_startup + 7)
    try:
        slow = asc.schedule(prog).cycles
        fun = aex.run(k.artifact.plan, prog, inputs)[1].cycles
    finally:
        prog.machine = m0
    assert slow > base == fun


def test_ascend_wrong_byte_count_is_caught_by_the_counters():
    """A transfer that declares the wrong size is timed wrongly; the execution's own byte count
    disagrees with it."""
    wl, k, inputs = _asc("matmul", "m=40,k=100,n=70", "float16")
    prog = k.artifact.program
    base = asc.schedule(prog)
    j = _first(prog, DataMove, lambda i: i.path[0] == "GM")
    prog.instrs[j].nbytes *= 2
    try:
        t = asc.schedule(prog)
        _, fun = aex.run(k.artifact.plan, prog, inputs)
        assert t.cycles != base.cycles
        assert fun.gm_read_bytes == base.gm_read_bytes != t.gm_read_bytes
    finally:
        prog.instrs[j].nbytes //= 2


# ---------------------------------------------------------------- dsp: two accountings

DSP_KERNELS = [("conv2d", "n=2,c=8,h=9,w=9,k=32,r=3,s=3,pad=1", None, True),
               ("conv2d", "n=8,c=32,h=19,w=19,k=32,r=3,s=3,pad=1", "paper", False),
               ("matmul", "m=300,k=260,n=270", None, True),
               ("matmul", "m=64,k=128,n=96", None, False),
               ("softmax", "m=9,n=100", None, True),
               ("pool2d", "n=2,c=3,h=13,w=37,kernel=3,stride=2,pad=1,mode=avg", None, True),
               ("conv2d_bn_relu", "n=2,c=6,h=13,w=37,k=6,groups=6,stride=2,pad=1", None, True),
               ("ew_chain", "n=2,c=5,h=7,w=9,chain=bn;sigmoid;add", None, True),
               ("concat", "n=1,c=16,c1=16,h=8,w=8", None, True)]


def _dsp(op, shape, config):
    wl = workload(op, shape, dtype="float32")
    k = DSP.build(wl, config)
    fprog = dsp_lower(get_template(get_op(op).family, "dsp").apply(wl, DT, k.config), DT, True)
    return wl, k, fprog, get_op(op).make_inputs(wl)


@pytest.mark.parametrize("op,shape,config,exact", DSP_KERNELS)
def test_dsp_functional_accounting_equals_timing(op, shape, config, exact):
    """The functional clock equals the timing model on the same per-core program exactly,
    unless the timing model runs identical cores as one group after their last differing
    barrier (`exact` False: their transfers then hold the shared channel as one block, and a
    group's timestamps are the latest of its members', so the timing clock can only be later:
    functional <= timing in device cycles); and the timing program (repeat blocks,
    steady-state skips, core groups) within 3 % of the whole call, as before."""
    wl, k, fprog, inputs = _dsp(op, shape, config)
    out, counters, fun = fclock.replay(DM, fprog, inputs)
    tim = tm.timing(DM, fprog)
    if exact:
        assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    else:
        assert fun.dsp_cycles < tim.dsp_cycles
    assert fun.cycles == pytest.approx(DSP.measure(k).cycles, rel=0.03)
    assert fun.host_cycles == tm.timing(DM, k.artifact["program"]).host_cycles
    assert _close(out, get_op(op).reference(wl, inputs))


# ---------------------------------------------------------------- dsp: mutations


def test_dsp_shifted_address_changes_the_result():
    wl, k, fprog, inputs = _dsp("conv2d", "n=2,c=8,h=9,w=9,k=32,r=3,s=3,pad=1", None)
    good = fclock.replay(DM, fprog, inputs)[0]
    c, j = next((c, j) for c, ops in enumerate(fprog.cores) for j, op in enumerate(ops)
                if op.kind == "dma" and op.views and op.views[0].level == "DDR" and op.views[0].offset > 0)
    op = fprog.cores[c][j]
    src, dst = op.views
    shifted = View(src.space, src.offset - 1, src.shape, src.strides)  # one element early
    fprog.cores[c][j] = dma_op(DM, shifted, dst, op.reads, op.writes, True, "shifted")
    bad = fclock.replay(DM, fprog, inputs)[0]
    assert _close(good, get_op("conv2d").reference(wl, inputs)) and not _close(bad, good)


def test_dsp_dropped_barrier_changes_the_result_and_the_cycles():
    """With w_path=gsm every core brings its slice of W into GSM, then all wait at a barrier
    and read W whole. Without the barrier a core reads slices no core has written yet (the
    functional result is wrong) and no core waits for the others (the functional accounting,
    one op list per core, counts fewer cycles). Timing mode does not see this barrier: it runs
    identical cores as one group after the first barrier, whose W-slice transfers hold the DDR
    channel as one block and end together, so the barrier adds no wait there (documented
    here so that a change to it is noticed)."""
    wl, k, fprog, inputs = _dsp("conv2d", "n=8,c=32,h=19,w=19,k=32,r=3,s=3,pad=1", None)
    assert k.config["w_path"] == "gsm"
    good, _, t_good = fclock.replay(DM, fprog, inputs)
    cut = DspProgram(**{f.name: getattr(fprog, f.name) for f in dataclasses.fields(DspProgram)})
    cut.cores = [[op for op in ops if op.label != "W in GSM"] for ops in fprog.cores]
    assert sum(map(len, cut.cores)) < sum(map(len, fprog.cores))
    bad, _, t_bad = fclock.replay(DM, cut, inputs)
    assert _close(good, get_op("conv2d").reference(wl, inputs)) and not _close(bad, good)
    assert t_bad.cycles < t_good.cycles
    assert tm.timing(DM, cut).cycles == tm.timing(DM, fprog).cycles


@pytest.mark.parametrize("figure", ["ddr_latency", "dma_startup"])
def test_dsp_wrong_latency_is_caught_by_the_cross_check(figure):
    """A DMA latency 50 cycles too long in the timing model's figures: the timing clock rises
    (on the timing program and on the functional program), the functional clock (its own
    tables, read from the target) does not, so on the same per-core program the two no longer
    agree."""
    wl, k, fprog, inputs = _dsp("conv2d", "n=2,c=8,h=9,w=9,k=32,r=3,s=3,pad=1", None)
    base = tm.timing(DM, k.artifact["program"]).cycles
    wrong = dataclasses.replace(DM, **{figure: getattr(DM, figure) + 50})
    assert tm.timing(wrong, k.artifact["program"]).cycles > base
    fun = fclock.replay(wrong, fprog, inputs)[2].cycles
    assert fun == fclock.replay(DM, fprog, inputs)[2].cycles == tm.timing(DM, fprog).cycles
    assert tm.timing(wrong, fprog).cycles > fun
