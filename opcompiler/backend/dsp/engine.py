"""Executing a lowered DSP program: values (functional) and cycles (timing).

Timing is a scoreboard per core: two in-order pipes (the DMA engine and the VPU) that run in
parallel and wait on each other through buffer tags (a tile is computed after its DMA-in
lands; a buffer is overwritten only after its last reader finished: double buffering is two
tags). DDR and GSM are channels shared by the cluster's cores with their bandwidth: every
transfer holds its channel for bytes / bandwidth, so cores loading at once queue behind each
other (a bandwidth-blind model over-predicts multi-core speedup). Cores reach barriers
together. Identical cores may be simulated as one entry with a multiplicity: they issue the
same transfers at the same times, so the channel is held for all of them.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...errors import OpcFailure
from .machine import DspMachine
from .program import F32, Op, Program, Repeat, View, expand


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


@dataclass
class Timing:
    cycles: int  # whole call: host part + DSP part
    dsp_cycles: int
    host_cycles: int
    busy: dict[str, float]  # summed busy cycles per resource (vpu, fmac, dma per core; ddr, gsm channels)
    counters: Counters


def _dma_cycles(m: DspMachine, op: Op) -> tuple[int, int, int]:
    """(engine cycles, DDR channel cycles, GSM channel cycles) of one transfer by one core."""
    src, dst = op.path.split("->")
    ddr = op.nbytes / m.ddr_bytes_per_cycle * ((src == "DDR") + (dst == "DDR"))
    gsm = op.nbytes / m.gsm_bytes_per_cycle * ((src == "GSM") + (dst == "GSM"))
    lat = max(m.ddr_latency if "DDR" in (src, dst) else 0, m.gsm_latency if "GSM" in (src, dst) else 0)
    eng = m.dma_startup + lat + op.nbytes / m.dma_bytes_per_cycle + op.nruns * m.dma_row_cycles
    return int(eng), int(np.ceil(ddr)), int(np.ceil(gsm))


SKIP_REPEATS = True  # tests turn the steady-state skip of repeated stages off to check it is exact


class _Sched:
    """Scoreboard state of the cores (or core groups) and the shared channels; integer cycles."""

    def __init__(self, m: DspMachine, n: int, mult: list[int]):
        self.m, self.mult = m, mult
        self.pipe = [{"dma": 0, "vpu": 0, "sync": 0} for _ in range(n)]
        self.ready: list[dict] = [dict() for _ in range(n)]  # tag -> cycle its last write completes
        self.read_end: list[dict] = [dict() for _ in range(n)]  # tag -> cycle its last read completes
        self.chan = {"ddr": 0, "gsm": 0}
        self.busy: dict[str, float] = defaultdict(float)
        self.static: dict[int, tuple] = {}
        self.counts: dict[int, list] = {}

    def candidate(self, c: int, op: Op) -> int:
        t = self.pipe[c][op.pipe]
        r, w = self.ready[c], self.read_end[c]
        for tag in op.reads:
            v = r.get(tag, 0)
            if v > t:
                t = v
        for tag in op.writes:
            v = max(r.get(tag, 0), w.get(tag, 0))
            if v > t:
                t = v
        return t

    def run(self, c: int, op: Op) -> None:
        """Issue one non-barrier op of core (group) c at its earliest start."""
        m, k = self.m, self.mult[c]
        st = self.static.get(id(op))
        if st is None:
            if op.kind == "dma":
                eng, ddr, gsm = _dma_cycles(m, op)
                st = (True, eng, ddr, gsm, 0.0)
            else:
                st = (False, op.cycles, 0, 0, op.cost.fmas / m.fmac_units if op.cost is not None else 0.0)
            self.static[id(op)] = st
        start = self.candidate(c, op)
        is_dma, cyc, ddr, gsm, fm = st
        end = start + cyc
        busy = self.busy
        if is_dma:
            # the shared channels carry this transfer for all k identical cores
            for ch, ccyc in (("ddr", ddr), ("gsm", gsm)):
                if ccyc:
                    s0 = max(self.chan[ch], start + m.dma_startup)
                    self.chan[ch] = s0 + ccyc * k
                    busy[ch] += ccyc * k
                    end = max(end, self.chan[ch])
            busy["dma"] += (end - start) * k
        else:
            busy["vpu"] += cyc * k
            busy["fmac"] += fm * k
        self.pipe[c][op.pipe] = end
        rd = self.ready[c]
        for tag in op.writes:
            rd[tag] = end
        rc = self.read_end[c]
        for tag in op.reads:
            if rc.get(tag, 0) < end:
                rc[tag] = end
        cnt = self.counts.get(id(op))
        if cnt is None:
            self.counts[id(op)] = [op, k]
        else:
            cnt[1] += k

    def barrier(self, cores: list[int]) -> None:
        t = max(max(self.pipe[c].values()) for c in cores)
        for c in cores:
            p = self.pipe[c]
            p["dma"] = p["vpu"] = p["sync"] = t

    # -- steady state of a repeated block (single core group) ------------------------------

    def _vector(self) -> list:
        p, ch = self.pipe[0], self.chan
        return ([p["dma"], p["vpu"], p["sync"], ch["ddr"], ch["gsm"]] + [("r", t, v) for t, v in self.ready[0].items()]
                + [("w", t, v) for t, v in self.read_end[0].items()])

    def repeat(self, body: tuple, count: int) -> None:
        """Run `body` `count` times; once three repetitions advanced every live timestamp by the
        same amount, the state is periodic and the remaining repetitions are added exactly."""
        deltas: list = []
        done = 0
        while done < count:
            before = (self._vector(), dict(self.busy))
            for op in body:
                if op.kind == "barrier":
                    self.barrier([0])
                else:
                    self.run(0, op)
            done += 1
            if not SKIP_REPEATS or count - done < 2:
                continue
            d = _shift(before[0], self._vector())
            deltas.append(d)
            if d is not None and len(deltas) >= 3 and deltas[-2] == d and deltas[-3] == d:
                r = count - done
                self._advance(r * d)
                for key, v in self.busy.items():
                    self.busy[key] = v + r * (v - before[1].get(key, 0.0))
                for op in body:
                    if op.kind != "barrier":
                        self.counts[id(op)][1] += r * self.mult[0]
                done = count

    def _advance(self, dt: int) -> None:
        p = self.pipe[0]
        now = min(p["dma"], p["vpu"])
        for key in p:
            if p[key] >= now:
                p[key] += dt
        for ch in self.chan:
            if self.chan[ch] >= now:
                self.chan[ch] += dt
        for d in (self.ready[0], self.read_end[0]):
            for t, v in d.items():
                if v >= now:
                    d[t] = v + dt


def _shift(a: list, b: list) -> int | None:
    """The common advance of all timestamps from state a to state b, if the move is a pure time
    shift (timestamps that did not move lie in the past and cannot bind again)."""
    if len(a) != len(b):
        return None
    va = [x if not isinstance(x, tuple) else x[2] for x in a]
    vb = [x if not isinstance(x, tuple) else x[2] for x in b]
    if any(isinstance(x, tuple) and (x[:2] != y[:2]) for x, y in zip(a, b)):
        return None
    moved = {y - x for x, y in zip(va, vb) if y != x}
    if len(moved) != 1:
        return None
    d = moved.pop()
    floor = min(vb[0], vb[1])  # nothing starts before the pipes are free
    if any(y == x and y > floor - d for x, y in zip(va, vb)):
        return None  # a timestamp that did not move could still bind
    return d


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
    return Timing(cycles=int(dsp + host), dsp_cycles=int(dsp), host_cycles=int(host), busy=dict(busy),
                  counters=counters)


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
        n = len(cores)
        merged = _Sched(sched.m, 1, [sum(sched.mult)])
        merged.pipe[0] = {k: max(sched.pipe[c][k] for c in range(n)) for k in sched.pipe[0]}
        for attr in ("ready", "read_end"):
            d: dict = {}
            for c in range(n):
                for t, v in getattr(sched, attr)[c].items():
                    d[t] = max(d.get(t, 0), v)
            getattr(merged, attr)[0] = d
        merged.chan, merged.busy, merged.static, merged.counts = sched.chan, sched.busy, sched.static, sched.counts
        for op in cores[0][cut[0] + 1:]:
            if isinstance(op, Repeat):
                merged.repeat(op.body, op.count)
            elif op.kind == "barrier":
                merged.barrier([0])
            else:
                merged.run(0, op)
        sched.pipe = [dict(merged.pipe[0]) for _ in range(n)]
        return
    _timing_heap(sched, [expand(ops) for ops in cores])


def _timing_heap(sched: _Sched, cores: list[list[Op]]) -> None:
    """Several core groups: issue ops in the order of their earliest start across the groups."""
    n = len(cores)
    idx = [0] * n
    heap: list[tuple[int, int]] = [(0, c) for c in range(n) if cores[c]]
    heapq.heapify(heap)
    at_barrier: set[int] = set()
    total = sum(sched.mult[c] for c in range(n) if cores[c])
    while heap:
        _, c = heapq.heappop(heap)
        op = cores[c][idx[c]]
        if op.kind == "barrier":
            at_barrier.add(c)
            if sum(sched.mult[j] for j in at_barrier) < total:
                continue
            sched.barrier(sorted(at_barrier))
            for j in sorted(at_barrier):
                idx[j] += 1
                if idx[j] < len(cores[j]):
                    heapq.heappush(heap, (sched.candidate(j, cores[j][idx[j]]), j))
            at_barrier.clear()
            continue
        sched.run(c, op)
        idx[c] += 1
        if idx[c] < len(cores[c]):
            heapq.heappush(heap, (sched.candidate(c, cores[c][idx[c]]), c))


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


def execute(m: DspMachine, prog: Program, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, Counters]:
    """Run the program on real values; cores run phase by phase between barriers."""
    ddr = {name: np.full(int(np.prod(shape)), np.nan, np.float32) for name, shape in prog.ddr_tensors.items()}
    for name, x in zip(prog.inputs, inputs):
        ddr[name][...] = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    for prep in prog.prepare:
        prep(ddr)
    mem = Memory(m, ddr, len(prog.cores))
    counters = Counters()
    pos = [0] * len(prog.cores)
    while any(p < len(ops) for p, ops in zip(pos, prog.cores)):
        for c, ops in enumerate(prog.cores):
            mem.core = c
            while pos[c] < len(ops):
                op = ops[pos[c]]
                pos[c] += 1
                if op.kind == "barrier":
                    break
                if op.fn is None:
                    raise OpcFailure(f"op {op.kind} {op.label} has no functional body (built for timing only)")
                done = op.fn(mem)  # a VPU pass returns the micro-kernel calls it executed
                counters.add_op(op, 1, done if isinstance(done, int) else None)
    _host_bytes(prog, counters)
    return ddr[prog.output].reshape(prog.out_shape).copy(), counters


def _host_bytes(prog: Program, counters: Counters) -> None:
    for _, _, nbytes in prog.host_pre + prog.host_post:
        if nbytes:
            counters.bytes_by_level["host_copy"] += nbytes
