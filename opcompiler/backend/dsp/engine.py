"""Executing a lowered DSP program: values (functional) and cycles (timing).

Timing is a scoreboard per core: two in-order pipes (the DMA engine and the VPU) that run in
parallel and wait on each other through buffer tags (a tile is computed after its DMA-in
lands; a buffer is overwritten only after its last reader finished: double buffering is two
tags). DDR and GSM are channels shared by the cluster's cores with their bandwidth: every
transfer holds its channel for bytes / bandwidth, so cores loading at once queue behind each
other (a bandwidth-blind model over-predicts multi-core speedup). Cores reach barriers
together. Identical cores may be simulated as one entry with a multiplicity: they issue the
same transfers at the same times, so the channel is held for all of them.

The scoreboard, the channels, barriers and the steady-state skip are the simulator core's
(`opcompiler.sim.scoreboard`); the DSP ISA adds a transfer's engine and channel cycles, FMAC
busy time and the issued-work counters. `execute` runs a program's values; functional mode's
own clock is `fclock.replay` (its own tables, never this scoreboard); tests hold the two clocks
to each other. `profile` builds the run's typed `Profile`, and `report_keys` the cluster's own
report keys beside it.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from ...errors import OpcFailure
from ...sim.profile import Profile, Timing, bound_of
from ...sim.scoreboard import Channels, Scoreboard, barrier, interleave, merge, run_repeated
from .machine import DspMachine
from .program import F32, Op, Program, Repeat, View, dma_cycles, expand


@dataclass
class Counters:
    """What a run issued, summed over all cores."""

    bytes_by_level: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dma_transfers: int = 0
    fmas: int = 0
    vldst: int = 0
    slds: int = 0
    valu: int = 0
    mk_calls: int = 0

    def add_op(self, op: Op, mult: int = 1, calls: int | None = None) -> None:
        if op.kind == "dma":
            src, dst = op.path.split("->")
            self.bytes_by_level[src] += op.nbytes * mult
            if dst != src:
                self.bytes_by_level[dst] += op.nbytes * mult
            self.dma_transfers += mult
        elif op.cost is not None:
            self.fmas += op.cost.fmas * mult
            self.vldst += op.cost.vldst * mult
            self.slds += op.cost.slds * mult
            self.valu += op.cost.valu * mult
            self.mk_calls += int(op.nruns if calls is None else calls) * mult

    def as_dict(self) -> dict:
        return {"bytes_by_level": dict(self.bytes_by_level), "dma_transfers": self.dma_transfers, "fmas": self.fmas,
                "vldst": self.vldst, "slds": self.slds, "valu": self.valu, "mk_calls": self.mk_calls}


_dma_cycles = dma_cycles  # the transfer cost lives with the ISA (program.Op)


SKIP_REPEATS = True  # tests turn the steady-state skip of repeated stages off to check it is exact
PIPES = ("dma", "vpu", "sync")  # the DMA engine and the VPU run work; "sync" only holds barriers
CHANNELS = ("ddr", "gsm")  # shared by the cluster's cores


class _Sched:
    """The cores (or core groups) on the simulator core's scoreboards, the cluster's shared
    DDR and GSM channels, and what the DSP ISA adds: a transfer's engine and channel cycles
    (`_dma_cycles`), FMAC busy time, the issued-work counters."""

    def __init__(self, m: DspMachine, n: int, mult: list[int]):
        self.m, self.mult = m, mult
        self.busy: dict[str, float] = defaultdict(float)
        self.chan = Channels(CHANNELS, self.busy)
        self.boards = [Scoreboard(PIPES, work=PIPES[:2], busy=self.busy, mult=k) for k in mult[:n]]
        self.static: dict[int, tuple] = {}
        self.counts: dict[int, list] = {}

    @property
    def pipe(self) -> list[dict]:
        return [sb.pipe for sb in self.boards]

    def candidate(self, c: int, op: Op) -> int:
        return self.boards[c].earliest(op.pipe, op.reads, op.writes)

    def run(self, c: int, op: Op) -> None:
        """Issue one non-barrier op of core (group) c at its earliest start."""
        m, sb = self.m, self.boards[c]
        k = sb.mult
        st = self.static.get(id(op))
        if st is None:
            if op.kind == "dma":
                eng, ddr, gsm = _dma_cycles(m, op)
                st = (eng, (("ddr", ddr), ("gsm", gsm)), 0.0)
            else:
                st = (op.cycles, (), op.cost.fmas / m.fmac_units if op.cost is not None else 0.0)
            self.static[id(op)] = st
        cyc, holds, fm = st
        # a transfer holds the shared channels for all k identical cores
        sb.place(op.pipe, op.reads, op.writes, cyc, self.chan, holds, m.dma_startup)
        if not holds:
            self.busy["fmac"] += fm * k
        cnt = self.counts.get(id(op))
        if cnt is None:
            self.counts[id(op)] = [op, k]
        else:
            cnt[1] += k

    def barrier(self, cores: list[int]) -> None:
        barrier([self.boards[c] for c in cores])

    def repeat(self, body: tuple, count: int) -> None:
        """Run `body` `count` times on core group 0 (the steady-state skip is exact)."""
        def issue(op: Op) -> None:
            if op.kind == "barrier":
                self.barrier([0])
            else:
                self.run(0, op)

        def skipped(r: int) -> None:
            for op in body:
                if op.kind != "barrier":
                    self.counts[id(op)][1] += r * self.mult[0]

        run_repeated(self.boards[0], self.chan, body, count, issue, skipped, skip=SKIP_REPEATS)


def timing(m: DspMachine, prog: Program) -> Timing:
    """Schedule every core's ops on its pipes and the shared channels; returns cycles and busy time."""
    n = len(prog.cores)
    sched = _Sched(m, n, prog.multiplicity)
    if n == 1:
        for op in prog.cores[0]:
            if isinstance(op, Repeat):
                sched.repeat(op.body, op.count)
            elif op.kind == "barrier":
                sched.barrier([0])
            else:
                sched.run(0, op)
    else:
        _timing_groups(sched, prog.cores)
    counters = Counters()
    for op, k in sched.counts.values():
        counters.add_op(op, k)
    dsp = max((max(p.values()) for p in sched.pipe), default=0)
    host = sum(cyc for _, cyc, _ in prog.host_pre) + sum(cyc for _, cyc, _ in prog.host_post)
    busy = sched.busy
    busy["host"] = host
    _host_bytes(prog, counters)
    # busy: summed busy cycles per resource (vpu, fmac, dma per core; ddr, gsm channels; host)
    return Timing(cycles=int(dsp + host), host_cycles=int(host), busy=dict(busy),
                  bytes_by_level=counters.bytes_by_level, counters=counters, detail={"dsp_cycles": int(dsp)})


def _op_sig(o: Op) -> tuple:
    return (o.kind, o.pipe, o.cycles, o.reads, o.writes, o.nbytes, o.path, o.nruns, o.cost)


def _sig(ops: list) -> tuple:
    """What the timing of an op list depends on (not addresses, not object identity)."""
    return tuple(_op_sig(o) if not isinstance(o, Repeat) else (tuple(map(_op_sig, o.body)), o.count) for o in ops)


def _timing_groups(sched: _Sched, cores: list[list]) -> None:
    """Several core groups. When they differ only before a common barrier (e.g. the slice of W
    each core brings into GSM), run that part interleaved, then merge them into one group."""
    cut = []
    for ops in cores:
        b = next((i for i, o in enumerate(ops) if not isinstance(o, Repeat) and o.kind == "barrier"), None)
        cut.append(b)
    if all(b is not None for b in cut) and len({_sig(ops[b + 1:]) for ops, b in zip(cores, cut)}) == 1:
        _timing_heap(sched, [expand(ops[:b + 1]) for ops, b in zip(cores, cut)])
        merged = _Sched(sched.m, 1, [sum(sched.mult)])
        one = merge(sched.boards, sum(sched.mult))
        merged.boards, merged.busy = [one], sched.busy
        merged.chan, merged.static, merged.counts = sched.chan, sched.static, sched.counts
        for op in cores[0][cut[0] + 1:]:
            if isinstance(op, Repeat):
                merged.repeat(op.body, op.count)
            elif op.kind == "barrier":
                merged.barrier([0])
            else:
                merged.run(0, op)
        for sb in sched.boards:
            sb.pipe = dict(one.pipe)
        return
    _timing_heap(sched, [expand(ops) for ops in cores])


def _timing_heap(sched: _Sched, cores: list[list[Op]]) -> None:
    """Several core groups: issue ops in the order of their earliest start across the groups."""
    interleave(cores, sched.mult, sched.candidate, sched.run, sched.barrier, lambda op: op.kind == "barrier")


class Memory:
    """The simulated memories: DDR regions by name, one GSM, per-core AM and SM (flat fp32)."""

    def __init__(self, m: DspMachine, ddr: dict[str, np.ndarray], ncores: int):
        self.ddr = ddr
        self.gsm = np.full(m.cap("GSM") // F32, np.nan, np.float32)
        # fresh on-chip memory holds garbage, not zeros: a kernel must initialize what it reads
        self.am = [np.full(m.cap("AM") // F32, np.nan, np.float32) for _ in range(ncores)]
        self.sm = [np.full(m.cap("SM") // F32, np.nan, np.float32) for _ in range(ncores)]
        self.core = 0

    def flat(self, space: tuple) -> np.ndarray:
        lv = space[0]
        if lv == "DDR":
            return self.ddr[space[1]]
        if lv == "GSM":
            return self.gsm
        return (self.am if lv == "AM" else self.sm)[self.core]

    def view(self, v: View) -> np.ndarray:
        arr = self.flat(v.space)
        last = v.offset + sum((s - 1) * st for s, st in zip(v.shape, v.strides)) if v.size else v.offset
        if v.offset < 0 or last >= arr.size:
            raise OpcFailure(f"access outside {v.space[0]}: offset {v.offset}, last {last}, size {arr.size}")
        return np.lib.stride_tricks.as_strided(arr[v.offset:], v.shape, tuple(s * F32 for s in v.strides))


PROGRESS_DELAY_S = 1.0  # a functional run still going after this long shows a progress bar (on a terminal)


def execute(m: DspMachine, prog: Program, inputs: Sequence[np.ndarray],
            record: Callable[[int, Op], None] | None = None) -> tuple[np.ndarray, Counters]:
    """Run the program on real values; cores run phase by phase between barriers (`record`,
    if given, sees every op a core executed and every barrier it reached)."""
    ddr = {name: np.full(int(np.prod(shape)), np.nan, np.float32) for name, shape in prog.ddr_tensors.items()}
    for name, x in zip(prog.inputs, inputs):
        ddr[name][...] = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    for prep in prog.prepare:
        prep(ddr)
    mem = Memory(m, ddr, len(prog.cores))
    counters = Counters()
    pos = [0] * len(prog.cores)
    total = sum(len(ops) for ops in prog.cores)
    # a large kernel takes seconds to minutes to execute (the 4096^3 GEMM's default issues 85,544
    # ops; MiniGo CONV3_RES at batch 768 issues 7,688 that take 18 s): a bar on a terminal once the
    # run has taken PROGRESS_DELAY_S (tqdm's delay), nothing when stderr is not a terminal
    bar = tqdm(total=total, desc="dsp-sim functional", unit="op", leave=False, delay=PROGRESS_DELAY_S,
               disable=None if sys.stderr.isatty() else True, file=sys.stderr)
    try:
        _execute_phases(prog, mem, counters, pos, record, bar)
    finally:
        bar.close()
    _host_bytes(prog, counters)
    return ddr[prog.output].reshape(prog.out_shape).copy(), counters


def _execute_phases(prog: Program, mem: Memory, counters: Counters, pos: list[int],
                    record: Callable[[int, Op], None] | None, bar: tqdm) -> None:
    """Every core's ops, core by core up to its next barrier, until all are done."""
    while any(p < len(ops) for p, ops in zip(pos, prog.cores)):
        for c, ops in enumerate(prog.cores):
            mem.core = c
            start = pos[c]
            while pos[c] < len(ops):
                op = ops[pos[c]]
                pos[c] += 1
                if record is not None:
                    record(c, op)
                if op.kind == "barrier":
                    break
                if op.fn is None:
                    raise OpcFailure(f"op {op.kind} {op.label} has no functional body (built for timing only)")
                done = op.execute(mem)  # a VPU pass returns the micro-kernel calls it executed
                counters.add_op(op, 1, done if isinstance(done, int) else None)
            bar.update(pos[c] - start)


def _host_bytes(prog: Program, counters: Counters) -> None:
    for _, _, nbytes in prog.host_pre + prog.host_post:
        if nbytes:
            counters.bytes_by_level["host_copy"] += nbytes


# ------------------------------------------------------------------ the report


def profile(m: DspMachine, prog: Program, t: Timing) -> Profile:
    """The typed report: the cluster's fp32 peak, busy shares (per-core resources over all
    cores, the shared channels and the host over the whole call), DDR traffic as the
    roofline's off-chip bytes, and the bounding resource."""
    cyc = max(t.cycles, 1)
    share = {
        "host (launch + copies)": t.host_cycles / cyc,
        "FMAC": t.busy.get("fmac", 0.0) / (m.cores * cyc),
        "VPU issue": t.busy.get("vpu", 0.0) / (m.cores * cyc),
        "DDR bandwidth": t.busy.get("ddr", 0.0) / cyc,
        "GSM bandwidth": t.busy.get("gsm", 0.0) / cyc,
        "DMA engines": t.busy.get("dma", 0.0) / (m.cores * cyc),
    }
    # the one bound rule; the VPU's issue slots carry the FMACs' operations: when the FMACs are
    # almost as busy, they bound the kernel, else the VPU's issue does (FMAC latency, loads)
    bound = bound_of(share, labels={"VPU issue": "VPU issue (FMAC latency / loads)"}, feeds={"VPU issue": "FMAC"})
    return Profile(cycles=t.cycles, clock_hz=m.clock_hz, flops=prog.flops, peak_flops=m.peak_flops * m.cores,
                   busy=dict(t.busy), busy_ratio=share, bytes_by_level=dict(t.counters.bytes_by_level),
                   offchip_bytes=t.counters.bytes_by_level.get("DDR", 0),
                   offchip_gbps=m.ddr_bytes_per_cycle * m.clock_hz / 1e9, bound=bound)


def report_keys(m: DspMachine, prog: Program, t: Timing, p: Profile) -> dict:
    """The cluster's own report keys, beside the profile's (`opcompiler.sim.profile.report`)."""
    seconds = t.cycles / m.clock_hz
    share = p.busy_ratio
    return {
        "gflops": prog.flops / seconds / 1e9 if seconds else 0.0,
        "busy_ratios": {k: round(v, 4) for k, v in share.items()},
        "fmac_utilization": share["FMAC"],
        "counters": t.counters.as_dict(),
        "dsp_cycles": t.dsp_cycles, "host_cycles": t.host_cycles,
        "data_mode": m.data_mode, "cores_used": prog.cores_used,
    }
