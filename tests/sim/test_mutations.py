"""Mutation tests of the cross-check between the two clocks: each breaks ONE cost in ONE
accounting (the timing model's or the functional replay's own clock, `fclock`) and asserts
that the two clocks, equal on the unmutated kernel, then differ. A cost both accountings
shared (one function called twice) would change both and pass unnoticed: these tests fail.

ascend-sim: cube (MMAD) cost, vector cost, each data path's bandwidth (GM->L1, GM->UB,
L1->L0A incl. Load3D, L1->L0B, L0C->UB, UB->GM), the shared HBM bandwidth, the set_flag /
wait_flag cost, the pipe barrier, the scalar issue cost.
dsp-sim: DMA engine rate, DDR and GSM bandwidth, per-run cost, the FMAC and vector load/store
issue slots, the FMAC latency, the cluster barrier; the register-blocked micro-kernels of the
direct convolution (output- and weight-stationary), the k-split and their epilogue passes
(slots, latencies, loop exit, register window); the host's share (launch, CPU <-> DSP copies,
host-side replication); the zero fills (padding halos, an empty k-split part's zero tile: the
store width, lanes and slots of the functional clock, the cycles the lowering declares)."""
from __future__ import annotations

import copy
import dataclasses
import functools
from types import MappingProxyType

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import fclock as afc
from opcompiler.backend.ascend import execute as aex, timing as asc
from opcompiler.backend.ascend.program import Barrier, Memory as AscMemory, Mmad, Vec
from opcompiler.backend.dsp import execute as ex, fclock as dfc, timing as tm
from opcompiler.backend.dsp.lower import lower as dsp_lower
from opcompiler.backend.dsp.machine import machine as dsp_machine
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

AT = load_target("ascend-sim")
ASC = get_backend(AT)
AFC = afc.clock(AT)
DT = load_target("dsp-sim")
DM = dsp_machine(DT)
DFC = dfc.clock(DT)
DT_COPY = dataclasses.replace(DT, extra=MappingProxyType({**DT.extra, "data_mode": "copy"}))  # CPU <-> DSP copies
DM_COPY = dsp_machine(DT_COPY)

# ---------------------------------------------------------------- ascend


@functools.lru_cache(maxsize=None)
def _asc(op, shape, dtype, config=None):
    wl = workload(op, shape, dtype=dtype)
    k = ASC.build(wl, dict(config) if config else None)
    return k, get_op(op).make_inputs(wl)


def _asc_clocks(k, inputs, fc=None):
    """(functional clock, timing clock) of core 0's program."""
    prog = k.artifact.program
    if fc is None:
        fun = aex.run(k.artifact.plan, prog, inputs)[1].cycles
    else:
        mem = AscMemory({lv: v.capacity for lv, v in prog.machine.levels.items()},
                         k.artifact.plan.pack([np.asarray(x) for x in inputs]))
        mem.gm[k.artifact.plan.out_name] = np.zeros(k.artifact.plan.out_shape, k.artifact.plan.out_dtype)
        fun = aex.replay(prog, mem, fc).cycles
    return fun, asc.schedule(prog).cycles


CUBE = ("matmul_bias_relu", "m=256,k=512,n=256", "float16")
CONV = ("conv2d", "n=1,c=64,h=28,w=28,k=64,r=3,s=3,stride=1,pad=1", "float16")  # Load3D into L0A
VEC = ("add_relu", "n=1,c=16,h=20,w=20", "float16")
WIDE = ("conv2d", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1", "float16")  # all 32 cores share HBM


@pytest.mark.parametrize("kern", [CUBE, CONV, VEC, WIDE])
def test_ascend_clocks_agree_before_any_mutation(kern):
    k, x = _asc(*kern)
    fun, tim = _asc_clocks(k, x)
    assert fun == tim > 0
    assert _asc_clocks(k, x, AFC) == (fun, tim)


def _plus_one(cls, monkeypatch):
    orig = cls.cost_cycles
    monkeypatch.setattr(cls, "cost_cycles", lambda self, m, r=0.0, w=0.0: orig(self, m, r, w) + 1)


@pytest.mark.parametrize("what,cls,kern", [("cube", Mmad, CUBE), ("vector", Vec, VEC)])
def test_ascend_timing_cost_mutation_is_caught(monkeypatch, what, cls, kern):
    """One cycle more per MMAD (per vector instruction) in the timing model only."""
    k, x = _asc(*kern)
    fun0, tim0 = _asc_clocks(k, x)
    _plus_one(cls, monkeypatch)
    fun, tim = _asc_clocks(k, x)
    assert fun == fun0 and tim != fun


@pytest.mark.parametrize("what,change,kern", [
    ("cube", {"cube_startup": AFC.cube_startup + 1}, CUBE),
    ("cube", {"fractals_per_cycle": 0.5}, CUBE),
    ("vector", {"vec_startup": AFC.vec_startup + 1}, VEC),
    ("vector", {"vec_per_repeat": AFC.vec_per_repeat + 1}, VEC),
    ("flag", {"sync": AFC.sync + 1}, CUBE),
    ("issue", {"issue": AFC.issue + 1}, CUBE),
    ("HBM", {"hbm_bpc": AFC.hbm_bpc / 4}, WIDE),
])
def test_ascend_functional_cost_mutation_is_caught(what, change, kern):
    """The same costs broken in the functional clock only."""
    k, x = _asc(*kern)
    fun, tim = _asc_clocks(k, x, dataclasses.replace(AFC, **change))
    assert fun != tim == _asc_clocks(k, x)[1]


PATHS = [(("GM", "L1"), CUBE), (("GM", "UB"), VEC), (("L1", "L0A"), CUBE), (("L1", "L0A"), CONV),
         (("L1", "L0B"), CUBE), (("L0C", "UB"), CUBE), (("UB", "GM"), CUBE)]


@pytest.mark.parametrize("path,kern", PATHS)
def test_ascend_path_bandwidth_mutation_is_caught(path, kern):
    """Each data path's bandwidth, 10 % lower in one accounting, then in the other."""
    k, x = _asc(*kern)
    prog = k.artifact.program
    assert asc.schedule(prog).bytes_by_path.get(f"{path[0]}->{path[1]}", 0) > 0
    m0 = prog.machine
    p = m0.paths[path]
    prog.machine = dataclasses.replace(m0, paths={**m0.paths, path: dataclasses.replace(
        p, bytes_per_cycle=p.bytes_per_cycle * 0.9)})
    try:
        fun, tim = _asc_clocks(k, x)
    finally:
        prog.machine = m0
    assert fun == _asc_clocks(k, x)[0] and tim != fun
    bpc, lat, burst = AFC.paths[path]
    fun, tim = _asc_clocks(k, x, dataclasses.replace(AFC, paths={**AFC.paths, path: (bpc * 0.9, lat, burst)}))
    assert fun != tim


@pytest.mark.parametrize("change", [{"sync_cycles": 5}, {"offchip_gbps": 300.0}, {"issue_cycles": 3}])
def test_ascend_timing_machine_mutation_is_caught(change):
    """The flag cost, the HBM bandwidth, the issue cost changed in the timing model's figures."""
    k, x = _asc(*WIDE)
    prog = k.artifact.program
    m0 = prog.machine
    prog.machine = dataclasses.replace(m0, **change)
    try:
        fun, tim = _asc_clocks(k, x)
    finally:
        prog.machine = m0
    assert fun == _asc_clocks(k, x)[0] and tim != fun


def test_ascend_barrier_cost_mutation_is_caught(monkeypatch):
    """A pipe barrier that costs 10 cycles more in the timing model only."""
    k, x = _asc(*CUBE)
    prog = k.artifact.program
    j = next(i for i, ins in enumerate(prog.instrs) if isinstance(ins, Mmad))
    b = Barrier()
    b.pipe = "S"
    prog.instrs.insert(j, b)
    try:
        fun0, tim0 = _asc_clocks(k, x)
        orig = asc.barrier

        def slow(boards):
            orig(boards)
            for sb in boards:
                sb.wait_until(sb.now() + 10)
        monkeypatch.setattr(asc, "barrier", slow)
        fun, tim = _asc_clocks(k, x)
    finally:
        prog.instrs.pop(j)
    assert fun0 == tim0 and fun == fun0 and tim == tim0 + 10


# ---------------------------------------------------------------- dsp

VK = ("ew_chain", "n=2,c=5,h=7,w=9,chain=bn;sigmoid;add")  # VPU passes of vector instructions
BIG = ("ew_chain", "n=4,c=32,h=19,w=19,chain=bn;sigmoid;add")  # bound by the shared DDR channel
SOFT = ("softmax", "m=9,n=100")
POOL = ("pool2d", "n=2,c=3,h=13,w=37,kernel=3,stride=2,pad=1,mode=avg")  # strided AM loads
CONVD = ("conv2d", "n=2,c=8,h=9,w=9,k=32,r=3,s=3,pad=1")  # DDR -> GSM -> AM, 8 cores, barriers
GEMM = ("matmul", "m=300,k=260,n=270")
GCONV = ("conv2d_bn_relu", "n=2,c=6,h=13,w=37,k=6,groups=6,stride=2,pad=1")  # grouped: vector passes


def _dsp_fprog(op, shape, config=None, mode="shared"):
    target = DT_COPY if mode == "copy" else DT
    wl = workload(op, shape, dtype="float32")
    k = get_backend(target).build(wl, dict(config) if config else None)
    return (dsp_lower(get_template(get_op(op).family, "dsp").apply(wl, target, k.config), target, True),
            get_op(op).make_inputs(wl))


@functools.lru_cache(maxsize=None)
def _dsp(op, shape, config=None, mode="shared"):
    return _dsp_fprog(op, shape, config, mode)


def _dsp_clocks(fprog, x, fc=DFC, m=DM):
    """(functional clock, timing clock) of the same per-core program, device cycles."""
    return dfc.replay(DM, fprog, x, fc)[2].dsp_cycles, tm.timing(m, fprog).dsp_cycles


@functools.lru_cache(maxsize=None)
def _passes(op, shape):
    """The VPU passes (vector-instruction kernels) a functional run of the kernel executed."""
    fprog, x = _dsp(op, shape)
    seen: list = []
    ex.OBSERVERS.append(seen.append)
    try:
        ex.execute(DM, fprog, x)
    finally:
        ex.OBSERVERS.remove(seen.append)
    assert seen
    return tuple(seen)


def _vpu_clocks(kern, fc=DFC):
    """(functional clock, timing model) of every executed VPU pass, summed: the passes of these
    memory-bound kernels hide behind their DMA, so the two VPU models are held to each other
    pass by pass."""
    ks = _passes(*kern)
    return sum(fc.kernel(k) for k in ks), sum(tm.kernel_cost(DM, k).cycles for k in ks)


@pytest.mark.parametrize("kern", [VK, SOFT, POOL, GCONV, CONVD, GEMM, BIG])
def test_dsp_clocks_agree_before_any_mutation(kern):
    fprog, x = _dsp(*kern)
    fun, tim = _dsp_clocks(fprog, x)
    assert fun == tim > 0
    if kern not in (CONVD, GEMM):  # register-blocked micro-kernels: no vector-instruction passes
        f, t = _vpu_clocks(kern)
        assert f == t > 0


@pytest.mark.parametrize("figure,kern", [("dma_bytes_per_cycle", VK), ("ddr_bytes_per_cycle", BIG),
                                         ("gsm_bytes_per_cycle", CONVD), ("dma_row_cycles", SOFT),
                                         ("dma_startup", VK), ("ddr_latency", VK)])
def test_dsp_timing_dma_mutation_is_caught(figure, kern):
    """A DMA figure 10 % (or 1 cycle) off in the timing model's machine only."""
    fprog, x = _dsp(*kern)
    v = getattr(DM, figure)
    wrong = dataclasses.replace(DM, **{figure: v * 0.9 if isinstance(v, float) else v + 1})
    fun, tim = _dsp_clocks(fprog, x, m=wrong)
    assert fun == _dsp_clocks(fprog, x)[0] and tim != fun


@pytest.mark.parametrize("change,kern", [({"dma_bpc": DFC.dma_bpc * 0.9}, VK), ({"ddr_bpc": DFC.ddr_bpc * 0.9}, BIG),
                                         ({"gsm_bpc": DFC.gsm_bpc * 0.9}, CONVD),
                                         ({"dma_per_run": DFC.dma_per_run + 1}, SOFT),
                                         ({"dma_startup": DFC.dma_startup + 1}, VK),
                                         ({"ddr_latency": DFC.ddr_latency + 1}, VK)])
def test_dsp_functional_dma_mutation_is_caught(change, kern):
    """The same DMA figures broken in the functional clock only."""
    fprog, x = _dsp(*kern)
    fun, tim = _dsp_clocks(fprog, x, fc=dataclasses.replace(DFC, **change))
    assert fun != tim == _dsp_clocks(fprog, x)[1]


VPU_CHANGES = [({"slots": {**DFC.slots, "fmac": 2}}, VK), ({"slots": {**DFC.slots, "fmac": 2}}, GCONV),
               ({"slots": {**DFC.slots, "ldst": 1}}, VK),
               ({"slots": {**DFC.slots, "ldst": 1}}, POOL), ({"latency": {**DFC.latency, "fmac": 7}}, SOFT),
               ({"latency": {**DFC.latency, "vld": 5}}, VK), ({"branch": 8}, VK)]


@pytest.mark.parametrize("change,kern", VPU_CHANGES)
def test_dsp_functional_vpu_mutation_is_caught(change, kern):
    """FMAC and vector load/store slots, FMAC and load latency, loop exit: broken in the
    functional clock only, the executed passes no longer cost what the timing model says."""
    f, t = _vpu_clocks(kern, dataclasses.replace(DFC, **change))
    assert f != t == _vpu_clocks(kern)[1]


@pytest.mark.parametrize("unit,cap,kern", [("fmac", 2, VK), ("fmac", 2, GCONV), ("ldst", 1, VK), ("ldst", 1, POOL)])
def test_dsp_timing_slot_mutation_is_caught(monkeypatch, unit, cap, kern):
    """The timing model's VPU scheduler with one FMAC (load/store) slot fewer: its pass costs
    move, the functional clock's do not."""
    orig = tm._VpuSched.__init__

    def fewer(self, m):
        orig(self, m)
        self.caps[unit] = cap
    monkeypatch.setattr(tm._VpuSched, "__init__", fewer)
    monkeypatch.setattr(tm, "_COST", {})
    f, t = _vpu_clocks(kern)
    assert f == _vpu_clocks(kern, DFC)[0] and t != f


def test_dsp_barrier_cost_mutation_is_caught(monkeypatch):
    """A cluster barrier that costs 10 cycles more in the timing model only."""
    fprog, x = _dsp(*CONVD)
    assert any(op.kind == "barrier" for ops in fprog.cores for op in ops)
    fun0, tim0 = _dsp_clocks(fprog, x)
    orig = tm.barrier

    def slow(boards):
        orig(boards)
        for sb in boards:
            sb.wait_until(sb.now() + 10)
    monkeypatch.setattr(tm, "barrier", slow)
    fun, tim = _dsp_clocks(fprog, x)
    assert fun0 == tim0 and fun == fun0 and tim > tim0


# ---------------------------------------------------------------- dsp: micro-kernels, host share

_KS = (("split", "k"), ("w_path", "ddr"), ("out_path", "ddr"), ("order", "out"), ("dbuf", 1), ("cols", 1))
MK_OUT = ("conv2d_bias_relu", "n=1,c=64,h=14,w=14,k=128,r=3,s=3,pad=1,layout=NHWC", None)  # mk_out + bias, relu
MK_WS = ("conv2d_bn_add_relu", "n=3,c=13,h=9,w=9,k=64,r=3,s=3,pad=1,layout=NHWC",  # mk_ws + mk_ew epilogue,
         (("order", "ws"), ("pw", 1), ("dbuf", 0), ("w_path", "host_copies"), ("out_path", "gsm"),
          ("split", "batch"), ("rows", 4)))  # host-side W replication
MK_KS = ("matmul_bias_relu", "m=7,k=100,n=65", _KS + (("kv", 2), ("pw", 3), ("rows", 4)))  # k-split: mk_out + mk_ew
MK_KERNELS = [MK_OUT, MK_WS, MK_KS]
COPY = ("conv2d", "n=2,c=8,h=9,w=9,k=32,r=3,s=3,pad=1", None, "copy")  # CPU <-> DSP copies


def _mk_ops(fprog):
    """The VPU ops of a program, each of micro-kernel calls only (what this part mutates)."""
    ops = [op for ops in fprog.cores for op in ops if op.kind == "vpu"]
    assert ops and all(op.cost is not None and op.cost.calls for op in ops)
    return ops


def _mk_clocks(fprog, fc=DFC):
    """(functional clock, timing model) of every micro-kernel pass of the program, summed."""
    ops = _mk_ops(fprog)
    return sum(fc.call(c) for op in ops for c in op.cost.calls), sum(op.cycles for op in ops)


def _whole_clocks(fprog, x, fc=DFC, m=DM):
    """(functional clock, timing clock) of the same per-core program, whole call (host included)."""
    return dfc.replay(m, fprog, x, fc)[2].cycles, tm.timing(m, fprog).cycles


@pytest.mark.parametrize("kern", MK_KERNELS)
def test_dsp_micro_kernel_clocks_agree_before_any_mutation(kern):
    """Every call's cycles on the two accountings (`timing.mk_*` and the functional clock's own
    stream), and the whole call."""
    fprog, x = _dsp(*kern)
    calls = {c for op in _mk_ops(fprog) for c in op.cost.calls}
    assert {c[0] for c in calls} == ({"out"} if kern is MK_OUT else {"ws", "ew"} if kern is MK_WS else {"out", "ew"})
    mk = {"out": tm.mk_out, "ws": tm.mk_ws, "ew": tm.mk_ew}
    for c in calls:
        assert DFC.call(c) == mk[c[0]](DM, *c[1:]).cycles > 0, c
    fun, tim = _whole_clocks(fprog, x)
    assert fun == tim > 0


MK_CHANGES = [{"slots": {**DFC.slots, "fmac": 1}}, {"slots": {**DFC.slots, "ldst": 1}},
              {"slots": {**DFC.slots, "sld": 1}}, {"latency": {**DFC.latency, "fmac": 7}},
              {"latency": {**DFC.latency, "vld": 5}}, {"latency": {**DFC.latency, "valu": 3}},
              {"branch": DFC.branch + 1}, {"registers": 16}]


@pytest.mark.parametrize("kern", MK_KERNELS)
@pytest.mark.parametrize("change", MK_CHANGES)
def test_dsp_functional_micro_kernel_mutation_is_caught(change, kern):
    """A slot, a latency, the loop exit or the register file broken in the functional clock
    only: the micro-kernel calls it executed no longer cost what the timing model declares."""
    if kern is MK_KS and (change.get("latency", DFC.latency)["valu"] != DFC.latency["valu"]
                          or change.get("slots", DFC.slots)["sld"] != DFC.slots["sld"]):
        # its 3 x 2 block waits on the FMAC latency, not on 3 scalar loads a step; its relu is
        # one VALU op per vector behind a DMA (both covered by MK_OUT and MK_WS)
        pytest.skip("not on the k-split block's critical path")
    fprog, x = _dsp(*kern)
    fc = dataclasses.replace(DFC, **change)
    f, t = _mk_clocks(fprog, fc)
    assert f != t == _mk_clocks(fprog)[1]
    if kern is not MK_KS:  # the k-split's passes hide behind its DMA
        fun, tim = _dsp_clocks(fprog, x, fc=fc)
        assert fun != tim == _dsp_clocks(fprog, x)[1]


def _rebuilt_with(monkeypatch, kern, patch):
    """The kernel's functional program lowered afresh with the timing model's micro-kernel
    scheduler changed by `patch` (the memoized costs cleared before and after)."""
    mks = (tm.mk_out, tm.mk_ws, tm.mk_ew)
    for f in mks:
        f.cache_clear()
    try:
        with monkeypatch.context() as mp:
            patch(mp)
            mp.setattr(tm, "_COST", {})
            return _dsp_fprog(*kern)[0]
    finally:
        for f in mks:
            f.cache_clear()


def _fewer(unit, cap):
    def patch(mp):
        orig = tm._VpuSched.__init__

        def init(self, m):
            orig(self, m)
            self.caps[unit] = cap
        mp.setattr(tm._VpuSched, "__init__", init)
    return patch


def _later_exit(mp):
    orig = tm._run
    mp.setattr(tm, "_run", lambda *a, **k: dataclasses.replace(orig(*a, **k), cycles=orig(*a, **k).cycles + 1))


@pytest.mark.parametrize("kern", MK_KERNELS)
@pytest.mark.parametrize("what,patch", [("one FMAC", _fewer("fmac", 1)), ("one load/store slot", _fewer("ldst", 1)),
                                        ("a cycle more per call", _later_exit)])
def test_dsp_timing_micro_kernel_mutation_is_caught(monkeypatch, kern, what, patch):
    """The timing model's micro-kernel costs (`timing.mk_*`) broken, the program lowered again:
    its declared VPU cycles move, the functional clock's (from the calls it executed) do not."""
    fprog0, x = _dsp(*kern)
    fun0, tim0 = _dsp_clocks(fprog0, x)
    fprog = _rebuilt_with(monkeypatch, kern, patch)
    assert [c for op in _mk_ops(fprog) for c in op.cost.calls] == [c for op in _mk_ops(fprog0) for c in op.cost.calls]
    f, t = _mk_clocks(fprog)
    assert f == _mk_clocks(fprog0)[0] == _mk_clocks(fprog0)[1] and t != f
    fun, tim = _dsp_clocks(fprog, x)
    assert fun0 == tim0 and fun == fun0 and (tim != fun or kern is MK_KS)  # the k-split's passes hide behind its DMA
    assert _dsp_clocks(_dsp_fprog(*kern)[0], x) == (fun0, tim0)  # nothing of the mutation is left


@pytest.mark.parametrize("kern,m", [(MK_OUT, DM), (MK_WS, DM), (COPY, DM_COPY)])
def test_dsp_host_clocks_agree_before_any_mutation(kern, m):
    fprog, x = _dsp(*kern)
    steps = {what.split(" ")[0] for what, _, _ in fprog.host_pre + fprog.host_post}
    assert steps == ({"launch"} if kern is MK_OUT else {"launch", "replicate"} if kern is MK_WS else {"launch", "copy"})
    assert all(DFC.host(what, b) == cyc for what, cyc, b in fprog.host_pre + fprog.host_post)
    fun, tim = _whole_clocks(fprog, x, m=m)
    assert fun == tim and fun - _dsp_clocks(fprog, x, m=m)[0] == sum(c for _, c, _ in fprog.host_pre + fprog.host_post)


@pytest.mark.parametrize("step,kern,m", [("launch", MK_OUT, DM), ("replicate", MK_WS, DM), ("copy", COPY, DM_COPY)])
def test_dsp_timing_host_mutation_is_caught(step, kern, m):
    """The host step's cycles the timing side declares (what a wrong host figure of the timing
    model's machine gives) one cycle off: the functional clock, from the target's figures and
    the bytes the step moves, does not follow."""
    fprog, x = _dsp(*kern)
    wrong = dataclasses.replace(fprog, **{part: [(w, c + 1 if w.startswith(step) else c, b) for w, c, b in getattr(fprog, part)]
                                          for part in ("host_pre", "host_post")})
    fun, tim = _whole_clocks(wrong, x, m=m)
    assert fun == _whole_clocks(fprog, x, m=m)[0] and tim != fun


@pytest.mark.parametrize("change,kern,m", [({"launch": DFC.launch + 1}, MK_OUT, DM),
                                           ({"host_overhead": DFC.host_overhead + 1}, MK_WS, DM),
                                           ({"host_overhead": DFC.host_overhead + 1}, COPY, DM_COPY),
                                           ({"host_bpc": DFC.host_bpc * 0.9}, COPY, DM_COPY),
                                           ({"replicate_bpc": DFC.host_bpc * 2}, MK_WS, DM)])
def test_dsp_functional_host_mutation_is_caught(change, kern, m):
    """The launch, a copy's start-up and rate, a replication's own rate: broken in the
    functional clock only."""
    fprog, x = _dsp(*kern)
    fun, tim = _whole_clocks(fprog, x, dataclasses.replace(DFC, **change), m=m)
    assert fun != tim == _whole_clocks(fprog, x, m=m)[1]


# ---------------------------------------------------------------- dsp: zero fills

PADDED = CONVD  # padding halos zeroed in SM: scalar stores
KS_EMPTY = ("matmul", "m=3,k=5,n=70", _KS + (("kv", 1), ("pw", 1), ("rows", 1)))  # K < cores: empty parts' zero tiles


def _fills(fprog):
    fills = [op for ops in fprog.cores for op in ops if op.kind == "fill"]
    assert fills
    return fills


def _fill_clocks(fprog, fc=DFC):
    """(functional clock, timing side's declaration) of every zero fill of the program, summed."""
    fills = _fills(fprog)
    return sum(fc.fill(*op.zeros) for op in fills), sum(op.cycles for op in fills)


@pytest.mark.parametrize("kern,stores", [(PADDED, "scalar"), (MK_OUT, "scalar"), (KS_EMPTY, "vector")])
def test_dsp_fill_clocks_agree_before_any_mutation(kern, stores):
    """Each fill's cycles from what it writes (`fclock.fill`) are the cycles the lowering declared."""
    fprog, x = _dsp(*kern)
    fills = _fills(fprog)
    assert {op.zeros[2] for op in fills} == {stores}
    assert all(DFC.fill(*op.zeros) == op.cycles > 0 for op in fills)
    fun, tim = _dsp_clocks(fprog, x)
    assert fun == tim > 0


@pytest.mark.parametrize("change,kern", [({"word": DFC.word // 2}, PADDED), ({"word": DFC.word // 2}, MK_OUT),
                                         ({"lanes": DFC.lanes // 2}, KS_EMPTY)])
def test_dsp_functional_fill_mutation_is_caught(change, kern):
    """The scalar store's width, the lanes of a vector store (figures only the fills use): broken
    in the functional clock only, the fills no longer cost what the lowering declared. The fills
    mostly overlap the transfers, so the whole call shows it where a fill is on the critical path
    (the bias conv's first tile)."""
    fprog, x = _dsp(*kern)
    fc = dataclasses.replace(DFC, **change)
    f, t = _fill_clocks(fprog, fc)
    assert f != t == _fill_clocks(fprog)[1]
    fun, tim = _dsp_clocks(fprog, x, fc=fc)
    assert tim == _dsp_clocks(fprog, x)[1] and (fun != tim or kern is not MK_OUT)


def _declared(fprog, change):
    """The program with every zero fill's declared cycles (what the timing side takes) changed."""
    def one(op):
        if op.kind != "fill":
            return op
        new = copy.copy(op)
        new.cycles = change(op.cycles)
        return new
    return dataclasses.replace(fprog, cores=[[one(op) for op in ops] for ops in fprog.cores])


@pytest.mark.parametrize("kern,change,whole", [(PADDED, lambda c: c + 1, False), (MK_OUT, lambda c: c + 1, False),
                                               (MK_OUT, lambda c: 2 * c, True), (KS_EMPTY, lambda c: c + 1, False)])
def test_dsp_timing_fill_mutation_is_caught(kern, change, whole):
    """The zero fills' declared cycles one more (or twice: the lowering's store width halved):
    the timing clock moves, the functional clock (from what the fills write) does not; the
    whole call shows it where a fill is on the critical path."""
    fprog, x = _dsp(*kern)
    fun0, tim0 = _dsp_clocks(fprog, x)
    wrong = _declared(fprog, change)
    f, t = _fill_clocks(wrong)
    assert f == _fill_clocks(fprog)[0] and t != f
    fun, tim = _dsp_clocks(wrong, x)
    assert fun0 == tim0 and fun == fun0 and (tim != fun or not whole)
