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
from .program import F32, Op, Program, View


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

    def add_op(self, op: Op, mult: int = 1) -> None:
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
            self.mk_calls += int(op.nruns) * mult

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


def _dma_cycles(m: DspMachine, op: Op) -> tuple[int, float, float]:
    """(engine cycles, DDR channel cycles, GSM channel cycles) of one transfer by one core."""
    src, dst = op.path.split("->")
    ddr = op.nbytes / m.ddr_bytes_per_cycle * ((src == "DDR") + (dst == "DDR"))
    gsm = op.nbytes / m.gsm_bytes_per_cycle * ((src == "GSM") + (dst == "GSM"))
    lat = max(m.ddr_latency if "DDR" in (src, dst) else 0, m.gsm_latency if "GSM" in (src, dst) else 0)
    eng = m.dma_startup + lat + op.nbytes / m.dma_bytes_per_cycle + op.nruns * m.dma_row_cycles
    return int(eng), ddr, gsm


def _static(m: DspMachine, op: Op) -> tuple:
    """Per-op figures the scheduler needs, computed once per Op object."""
    if op.kind == "dma":
        eng, ddr, gsm = _dma_cycles(m, op)
        return (True, eng, ddr, gsm, 0.0)
    fm = op.cost.fmas / m.fmac_units if op.cost is not None else 0.0
    return (False, op.cycles, 0.0, 0.0, fm)


def timing(m: DspMachine, prog: Program) -> Timing:
    """Schedule every core's ops on its pipes and the shared channels; returns cycles and busy time."""
    n = len(prog.cores)
    mult = prog.multiplicity
    pipe_free = [{"dma": 0, "vpu": 0, "sync": 0} for _ in range(n)]
    ready: list[dict] = [dict() for _ in range(n)]  # tag -> cycle its last write completes
    read_end: list[dict] = [dict() for _ in range(n)]  # tag -> cycle its last read completes
    idx = [0] * n
    busy: dict[str, float] = defaultdict(float)
    chan = {"ddr": 0.0, "gsm": 0.0}
    counters = Counters()
    static: dict[int, tuple] = {}
    per_op_counts: dict[int, list] = {}
    heap: list[tuple[int, int]] = [(0, c) for c in range(n) if prog.cores[c]]
    heapq.heapify(heap)
    at_barrier: dict[int, int] = {}
    total_mult = sum(mult[c] for c in range(n) if prog.cores[c])
    startup = m.dma_startup

    def candidate(c: int, op: Op) -> int:
        t = pipe_free[c][op.pipe]
        r, w = ready[c], read_end[c]
        for tag in op.reads:
            v = r.get(tag, 0)
            if v > t:
                t = v
        for tag in op.writes:
            v = max(r.get(tag, 0), w.get(tag, 0))
            if v > t:
                t = v
        return t

    while heap:
        _, c = heapq.heappop(heap)
        ops = prog.cores[c]
        op = ops[idx[c]]
        k = mult[c]
        if op.kind == "barrier":
            pf = pipe_free[c]
            at_barrier[c] = max(pf["dma"], pf["vpu"], pf["sync"])
            if sum(mult[j] for j in at_barrier) < total_mult:
                continue
            t = max(at_barrier.values())
            for j in list(at_barrier):
                pipe_free[j]["dma"] = pipe_free[j]["vpu"] = pipe_free[j]["sync"] = t
                idx[j] += 1
                if idx[j] < len(prog.cores[j]):
                    heapq.heappush(heap, (candidate(j, prog.cores[j][idx[j]]), j))
            at_barrier.clear()
            continue
        st = static.get(id(op))
        if st is None:
            st = static[id(op)] = _static(m, op)
        start = candidate(c, op)
        is_dma, cyc, ddr, gsm, fm = st
        end = start + cyc
        if is_dma:
            # the shared channels carry this transfer for all k identical cores
            if ddr:
                s0 = chan["ddr"] if chan["ddr"] > start + startup else start + startup
                chan["ddr"] = s0 + ddr * k
                busy["ddr"] += ddr * k
                e = -int(-chan["ddr"] // 1)
                if e > end:
                    end = e
            if gsm:
                s0 = chan["gsm"] if chan["gsm"] > start + startup else start + startup
                chan["gsm"] = s0 + gsm * k
                busy["gsm"] += gsm * k
                e = -int(-chan["gsm"] // 1)
                if e > end:
                    end = e
            busy["dma"] += (end - start) * k
        else:
            busy["vpu"] += cyc * k
            busy["fmac"] += fm * k
        pipe_free[c][op.pipe] = end
        for tag in op.writes:
            ready[c][tag] = end
        rc = read_end[c]
        for tag in op.reads:
            if rc.get(tag, 0) < end:
                rc[tag] = end
        cnt = per_op_counts.get(id(op))
        if cnt is None:
            per_op_counts[id(op)] = [op, k]
        else:
            cnt[1] += k
        idx[c] += 1
        if idx[c] < len(ops):
            heapq.heappush(heap, (candidate(c, ops[idx[c]]), c))
    for op, k in per_op_counts.values():
        counters.add_op(op, k)
    dsp = max((max(p.values()) for p in pipe_free), default=0)
    host = sum(cyc for _, cyc, _ in prog.host_pre) + sum(cyc for _, cyc, _ in prog.host_post)
    busy["host"] = host
    _host_bytes(prog, counters)
    return Timing(cycles=int(dsp + host), dsp_cycles=int(dsp), host_cycles=int(host), busy=dict(busy),
                  counters=counters)


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
                op.fn(mem)
                counters.add_op(op)
    _host_bytes(prog, counters)
    return ddr[prog.output].reshape(prog.out_shape).copy(), counters


def _host_bytes(prog: Program, counters: Counters) -> None:
    for _, _, nbytes in prog.host_pre + prog.host_post:
        if nbytes:
            counters.bytes_by_level["host_copy"] += nbytes
