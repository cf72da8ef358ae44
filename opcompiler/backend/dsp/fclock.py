"""The functional replay's own clock: a second accounting of the DSP cluster's cycles.

Timing mode (`engine.timing`) costs what the timing program declares (`program.dma_cycles`,
each VPU pass's list-scheduled `cycles` from `core` / `vector.kernel_cost`, the `DspMachine`
figures) on the scoreboard, with repeat blocks, steady-state skips and core groups. The
functional replay here times what it *executes*, with nothing of that path:

* its own figures, read from the target description (not from `DspMachine`): the DMA
  engine's start-up, rate and cost per contiguous run, DDR and GSM bandwidth and latency, the
  VPU's issue slots per unit (FMACs, vector load/store, scalar load, vector ALU), their
  latencies, the register file and the loop-exit (branch) latency;
* a transfer costs what it moved: the bytes and contiguous runs of the two views the DMA
  engine executed, on the levels they live in; DDR and GSM are channels the cores share;
* a VPU pass whose instructions execute (`vector.execute`: pooling, grouped convolution,
  element-wise chains, softmax, reductions, data movement) costs its executed loop nests,
  list-scheduled here cycle by cycle on the issue slots with the units' latencies, the
  register dependencies and the register window, with every iteration issued (no
  steady-state skip);
* dependencies and the cluster's order come from `opcompiler.sim.trace` over the per-core op
  lists as executed (one list per core: no repeat blocks, no core groups), never the
  scoreboard.

Two things are not re-derived and are taken as the program declares them, so the clocks
share them: the register-blocked micro-kernels of the direct convolution, the GEMM and the
k-split (`core.mk_out` and friends: their functional bodies evaluate the TIR block, not an
instruction stream, so there is nothing executed to time) and zero fills; and the host's
share (launch, CPU <-> DSP copies). The buffer tags a dependency is on are the program's.

The clocks agree exactly on the same per-core program (`engine.timing` of the functional
program); the timing program's core groups make the reported timing cycles differ from this
by a few % where identical cores' transfers hold a shared channel as one block
(`tests/sim/test_crosscheck.py` states that relation).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod
from typing import Any, Sequence

import numpy as np

from ...sim.profile import Timing
from ...sim.trace import BARRIER, WORK, Event, Trace
from ...target import Target
from . import vector as vx
from .program import Program, View

__all__ = ["DspClock", "clock", "for_machine", "replay", "runs"]

F32 = 4
FMAC_OPS = frozenset({"vadd", "vsub", "vmul", "vfma", "vfnma"})
VALU_OPS = frozenset({"vmax", "vmin", "vmov", "vfloor", "vldexp", "vgetexp", "vgetmant", "vrcpe", "vrot"})


@dataclass(frozen=True, kw_only=True, eq=False)  # hashed by identity (the nest cache keys on it)
class DspClock:
    """Per-instruction latency and bandwidth tables of one DSP cluster (per core unless noted)."""

    dma_bpc: float
    dma_startup: int
    dma_per_run: int
    ddr_bpc: float  # shared by the cluster
    gsm_bpc: float  # shared by the cluster
    ddr_latency: int
    gsm_latency: int
    slots: dict  # unit -> issue slots per cycle
    latency: dict  # unit -> cycles until its result is ready
    registers: int
    branch: int

    def dma(self, src: str, dst: str, nbytes: int, nruns: int) -> tuple[int, int, int]:
        """(engine cycles, DDR channel cycles, GSM channel cycles) of one executed transfer."""
        ends = (src, dst)
        lat = max(self.ddr_latency if "DDR" in ends else 0, self.gsm_latency if "GSM" in ends else 0)
        engine = int(self.dma_startup + lat + nbytes / self.dma_bpc + nruns * self.dma_per_run)
        ddr = int(np.ceil(nbytes / self.ddr_bpc * ends.count("DDR")))
        gsm = int(np.ceil(nbytes / self.gsm_bpc * ends.count("GSM")))
        return engine, ddr, gsm

    # -- VPU passes ----------------------------------------------------------------------------

    def kernel(self, k: vx.VKernel) -> int:
        """Cycles of an executed VPU pass: its loop nests one after the other."""
        return sum(self.nest(n) for n in k.nests)

    def nest(self, n: vx.Nest) -> int:
        if n.count == 0:
            return 0
        key = _signature(n)
        got = _NESTS.get((self, key))
        if got is None:
            got = _NESTS[(self, key)] = self._schedule(n)
        return got

    def _stream(self, ins: vx.VI) -> list[tuple]:
        """(unit, register written or None, registers read, latency) per issue slot it takes."""
        op = ins.op
        if op == "vld":
            extra = max(1, abs(ins.srcs[0].lane)) - 1  # a strided load touches `lane` AM rows
            return [("ldst", None, (), self.latency["vld"])] * extra + [("ldst", ins.dst, (), self.latency["vld"])]
        if op == "sld":
            return [("sld", ins.dst, (), self.latency["sld"])]
        regs = tuple(s for s in ins.srcs if isinstance(s, str))
        if op == "vst":
            return [("ldst", None, regs, self.latency["vld"])]
        unit = "fmac" if op in FMAC_OPS else "valu" if op in VALU_OPS else None
        if unit is None:
            raise ValueError(f"the functional clock has no unit for VPU instruction {op}")
        return [(unit, ins.dst, regs, self.latency[unit])]

    def _schedule(self, n: vx.Nest) -> int:
        """Issue every iteration of the nest in order, each instruction at the first cycle its
        registers are ready and its unit has a free slot; an iteration may not issue before the
        last issue of the iteration `window` earlier (the registers hold `window` iterations in
        flight). Cycles: the last result ready, then the loop exit."""
        written: list = []
        live: set = set()
        for ins in n.pre + n.body + n.post:
            for s in ins.srcs:
                if isinstance(s, str) and s not in written:
                    live.add(s)
            if isinstance(ins.dst, str) and ins.dst not in written:
                written.append(ins.dst)
        window = max(1, (self.registers - len(live - set(written))) // max(len(written), 1))
        seq = [t for ins in n.pre for t in self._stream(ins)]
        seq += [t for ins in n.body for t in self._stream(ins)] * prod(n.inner)
        seq += [t for ins in n.post for t in self._stream(ins)]
        used = {u: {} for u in self.slots}  # unit -> cycle -> slots taken
        nxt = {u: {} for u in self.slots}  # unit -> full cycle -> a later cycle to try
        ready: dict = {}
        end = 0
        lasts: list[int] = []
        for it in range(n.count):
            gate = lasts[it - window] if it >= window else 0
            last = 0
            for unit, dst, srcs, lat in seq:
                t = gate
                for s in srcs:
                    if ready.get(s, 0) > t:
                        t = ready[s]
                t = _free(nxt[unit], t)
                k = used[unit].get(t, 0) + 1
                used[unit][t] = k
                if k == self.slots[unit]:
                    nxt[unit][t] = t + 1
                if dst is not None:
                    ready[dst] = t + lat
                if t + lat > end:
                    end = t + lat
                if t > last:
                    last = t
            lasts.append(last)
        return end + self.branch


def _free(nxt: dict, t: int) -> int:
    """The first cycle >= t not marked full, shortening the chain it followed."""
    path = []
    while t in nxt:
        path.append(t)
        t = nxt[t]
    for p in path:
        nxt[p] = t
    return t


def _signature(n: vx.Nest) -> tuple:
    def one(x: Any) -> Any:
        if isinstance(x, vx.Mem):
            return ("mem", x.lane)
        return x if isinstance(x, str) else None
    code = tuple(tuple((i.op, one(i.dst), tuple(one(s) for s in i.srcs)) for i in part)
                 for part in (n.pre, n.body, n.post))
    return n.count, tuple(n.inner), code


_NESTS: dict[tuple, int] = {}


def runs(src: View, dst: View) -> int:
    """Contiguous runs of a transfer between two strided views: the innermost dimensions laid
    out back to back in both views form one run."""
    block, expect = 1, 1
    for d in range(len(src.shape) - 1, -1, -1):
        if src.strides[d] != expect or dst.strides[d] != expect:
            break
        expect *= src.shape[d]
        block = expect
    size = prod(src.shape)
    return max(1, size // block) if block else 1


# -- the target's figures ------------------------------------------------------------------------

_CACHE: dict[tuple, DspClock] = {}


def clock(target: Target) -> DspClock:
    """The functional clock's tables for `target`, read from the target description."""
    key = (target.name, target.path, target.digest, target.cores, target.memories, target.clock_ghz)
    if key not in _CACHE:
        _CACHE[key] = _read(target)
    return _CACHE[key]


def _read(target: Target) -> DspClock:
    vpe, dma = target.unit("vpe"), target.unit("dma")
    mem = {lv.name: lv for lv in target.memories}
    hz = target.clock_ghz * 1e9
    return DspClock(
        dma_bpc=float(dma["bytes_per_cycle"]), dma_startup=int(dma["startup_cycles"]),
        dma_per_run=int(dma.get("row_cycles", 0)),
        ddr_bpc=mem["DDR"].bandwidth_gbps * 1e9 / hz, gsm_bpc=mem["GSM"].bandwidth_gbps * 1e9 / hz,
        ddr_latency=mem["DDR"].latency_cycles, gsm_latency=mem["GSM"].latency_cycles,
        slots={"fmac": int(vpe["fmac_units"]), "ldst": int(vpe["vector_ldst_per_cycle"]),
               "sld": int(vpe["scalar_loads_per_cycle"]), "valu": int(vpe.get("valu_per_cycle", 1))},
        latency={"fmac": int(vpe["fmac_latency"]), "valu": int(vpe.get("valu_latency", 2)),
                 "vld": max(1, mem["AM"].latency_cycles), "sld": max(1, mem["SM"].latency_cycles)},
        registers=int(vpe["registers"]), branch=int(vpe.get("branch_latency", 7)))


_BOUND: dict[int, tuple[object, DspClock]] = {}


def bind(machine: object, target: Target) -> None:
    """Remember which target description a `DspMachine` was read from."""
    _BOUND[id(machine)] = (machine, clock(target))


def for_machine(machine) -> DspClock:
    """The clock of the target a machine was read from: the bound file, or the shipped target
    of that name (a machine whose figures a test changed still replays on the file's)."""
    got = _BOUND.get(id(machine))
    if got is not None and got[0] is machine:
        return got[1]
    from .machine import source_target

    src = source_target(machine)
    if src is not None:
        return clock(src)
    from ...target import load_target

    return clock(load_target(machine.name))


# -- the replay ----------------------------------------------------------------------------------


def replay(m, prog: Program, inputs: Sequence[np.ndarray], fc: DspClock | None = None):
    """Functional mode with its own clock: `engine.execute` runs the (functional) program,
    every op each core executed is recorded in the order it ran (cores phase by phase between
    barriers) with the VPU loop nests it executed, and each is costed by this clock's tables;
    `sim.trace` derives the dependencies and evaluates them with the shared DDR and GSM
    channels. Returns (output, counters, Timing)."""
    from .engine import execute

    fc = fc or for_machine(m)
    ran: list[list] = [[] for _ in prog.cores]  # per core: None (a barrier) or [op, executed kernels]
    current: list = [None]

    def record(c: int, op) -> None:
        if op.kind == "barrier":
            ran[c].append(None)
            current[0] = None
            return
        entry = [op, []]
        ran[c].append(entry)
        current[0] = entry

    def seen(k: vx.VKernel) -> None:
        if current[0] is not None:
            current[0][1].append(k)

    vx.OBSERVERS.append(seen)
    try:
        out, counters = execute(m, prog, inputs, record)
    finally:
        vx.OBSERVERS.remove(seen)
    tr = Trace(len(prog.cores))
    for c, entries in enumerate(ran):
        for e in entries:
            tr.record(c, Event(BARRIER) if e is None else _event(fc, *e))
    acc = tr.account()
    host = sum(cyc for _, cyc, _ in prog.host_pre) + sum(cyc for _, cyc, _ in prog.host_post)
    busy = dict(acc.busy)
    busy["host"] = host
    t = Timing(cycles=int(acc.cycles + host), host_cycles=int(host), busy=busy,
               bytes_by_level=counters.bytes_by_level, counters=counters, detail={"dsp_cycles": int(acc.cycles)})
    return out, counters, t


def _event(fc: DspClock, op, kernels: list) -> Event:
    reads, writes = tuple(op.reads), tuple(op.writes)
    if op.kind == "dma":
        src, dst = op.views
        eng, ddr, gsm = fc.dma(src.level, dst.level, src.size * F32, runs(src, dst))
        return Event(WORK, op.pipe, reads, writes, eng, (("ddr", ddr), ("gsm", gsm)), fc.dma_startup)
    cyc = sum(fc.kernel(k) for k in kernels) if kernels else op.cycles  # see the module docstring
    return Event(WORK, op.pipe, reads, writes, cyc)
