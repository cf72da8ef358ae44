"""The DSP's timing model: every cost of the cycle model, and the multi-core timing replay.

* A transfer (`dma_cycles`): the DMA engine's start-up, latency, rate and per-run cost, and the
  cycles it holds the shared DDR / GSM channels.
* A VPU micro-kernel (`mk_out`, `mk_ws`, `mk_ew`, `sum_costs`: `MkCost`): one call of the
  kernel's innermost block as an instruction stream (vector loads / stores between AM and the
  registers, scalar loads from SM broadcast to the lanes, vector FMAs into accumulators),
  list-scheduled cycle by cycle on the VPU's issue slots (FMACs, load/store, scalar-load, vector
  ALU) with each instruction's latency and its register dependencies, so a block with too few
  independent accumulators stalls on the FMAC latency. Register capacity bounds how many
  iterations may be in flight; a block that cannot hold its live registers does not build. The
  stream of a given signature is memoized; the loop of identical iterations is simulated until
  its per-iteration cost repeats, then the rest is skipped and accounted for exactly
  (`SKIP_PERIODS`).
* A vector kernel (`nest_cost`, `kernel_cost`): the same list scheduling of a `VKernel`'s
  instruction stream (`program.VI`).
* The replay (`timing`): a scoreboard per core, two in-order pipes (the DMA engine and the VPU)
  that run in parallel and wait on each other through buffer tags; DDR and GSM are channels
  shared by the cluster's cores with their bandwidth (every transfer holds its channel for
  bytes / bandwidth, so cores loading at once queue behind each other). Cores reach barriers
  together. Identical cores may be simulated as one entry with a multiplicity. The scoreboard,
  the channels, barriers and the steady-state skip are the simulator core's
  (`opcompiler.sim.scoreboard`).

`profile` builds the run's typed `Profile`, and `report_keys` the cluster's own report keys
beside it. The functional run is `execute`; its own clock is `fclock.replay` (its own tables,
never this model's); tests hold the two clocks to each other.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import prod
from typing import Callable

import numpy as np

from ...errors import CapacityError
from ...sim.profile import Profile, Timing, bound_of
from ...sim.program import Repeat, expand
from ...sim.scoreboard import Channels, Scoreboard, barrier, interleave, merge, run_repeated
from .machine import DspMachine
from .program import VI, Counters, Mem, Nest, Op, Program, VKernel, host_bytes, slots, unit


# ------------------------------------------------------------------ a VPU micro-kernel

Instr = tuple[str, object, tuple, int]  # (unit, destination register or None, source registers, latency)
SKIP_PERIODS = True  # tests turn the steady-state skip off to check it is exact


@dataclass(frozen=True)
class MkCost:
    """Cycles of one invocation and what it issued."""

    cycles: int
    fmas: int  # vector FMA instructions (each 32 lanes x 2 flops when all lanes are active)
    vldst: int  # AM <-> register vector loads and stores
    slds: int  # SM scalar loads (broadcast)
    valu: int
    # what was called, one (kind, shape) per call: the functional clock (`fclock`) costs these
    calls: tuple = field(default=(), compare=False, repr=False)


class _VpuSched:
    """Greedy list scheduler: each instruction issues at the first cycle where its operands are
    ready, its unit has a free slot, and its iteration's register window is open."""

    def __init__(self, m: DspMachine):
        self.caps = {"fmac": m.fmac_units, "ldst": m.ldst_per_cycle, "sld": m.sld_per_cycle, "valu": m.valu_per_cycle}
        self.slots: dict[str, defaultdict] = {u: defaultdict(int) for u in self.caps}
        # full cycles of a unit point past themselves (path-compressed), so finding the first
        # cycle >= t with a free slot skips a run of full cycles in near-constant time
        self.full: dict[str, dict[int, int]] = {u: {} for u in self.caps}
        self.ready: dict[object, int] = {}
        self.done = 0
        self.count: dict[str, int] = defaultdict(int)

    def issue(self, ins: Instr, gate: int) -> int:
        unit, dst, srcs, lat = ins
        t = gate
        for s in srcs:
            r = self.ready.get(s, 0)
            if r > t:
                t = r
        sl, cap, full = self.slots[unit], self.caps[unit], self.full[unit]
        if t in full:  # the first cycle >= t with a free slot of the unit
            root = full[t]
            while root in full:
                root = full[root]
            while t in full and full[t] != root:
                full[t], t = root, full[t]
            t = root
        sl[t] += 1
        if sl[t] >= cap:
            full[t] = t + 1
        if dst is not None:
            self.ready[dst] = t + lat
        self.done = max(self.done, t + lat)
        self.count[unit] += 1
        return t


def _run(m: DspMachine, prologue: list[Instr], body: Callable[[int], list[Instr]], n_iter: int,
         epilogue: Callable[[int], list[Instr]], depth: int, period: int = 1) -> MkCost:
    s = _VpuSched(m)
    for ins in prologue:
        s.issue(ins, 0)
    last: list[int] = []  # last issue cycle of each executed iteration
    extra_cycles, skipped_counts = 0, defaultdict(int)
    i = 0
    logical = 0  # iteration index used for register names (continuous across a skip)
    while i < n_iter:
        gate = last[logical - depth] if logical >= depth else 0
        instrs = body(logical)
        t_last = 0
        for ins in instrs:
            t_last = max(t_last, s.issue(ins, gate))
        last.append(t_last)
        i += 1
        logical += 1
        # periodic steady state: once the advance over p iterations (p a multiple of the body's
        # own period) has been the same for a long window, the pattern repeats: whole periods
        # are skipped and accounted for exactly
        if SKIP_PERIODS and extra_cycles == 0 and logical % 4 == 0 and n_iter - i > 8:
            for p in sorted({q * period for q in (1, 2, 3, 4, 6, depth, 2 * depth)}):
                window = max(3 * p, 2 * depth + 8)
                if logical <= window + p or n_iter - i <= p:
                    continue
                adv = {last[-k] - last[-k - p] for k in range(1, window + 1)}
                if len(adv) == 1:
                    periods = (n_iter - i) // p - 1
                    if periods > 0:
                        extra_cycles = periods * adv.pop()
                        for k in range(p):
                            for ins in body(logical - 1 - k):
                                skipped_counts[ins[0]] += periods
                        i += periods * p
                    break
    for ins in epilogue(logical):
        s.issue(ins, last[-1] if last else 0)
    c = {u: s.count[u] + skipped_counts[u] for u in s.caps}
    cycles = s.done + extra_cycles + m.branch_latency  # loop exit / call return is not overlapped
    return MkCost(cycles=cycles, fmas=c["fmac"], vldst=c["ldst"], slds=c["sld"], valu=c["valu"])


# per-channel parameter vectors an epilogue holds in registers
EPI_REGS = {"bias": 1, "bn": 2, "res": 0, "relu": 0, "hswish": 0}
# temporary registers an epilogue step needs per vector while it runs (`steps.ChainStep.temps`): HardSwish
# keeps x until its last multiply, the clip chain runs in a temporary
EPI_TEMPS = {"bias": 0, "bn": 0, "res": 0, "relu": 0, "hswish": 1}


def _hswish_instrs(m: DspMachine, x: object, src: tuple, t: object) -> list[Instr]:
    """HardSwish of the vector in `src` (one register) into register `x`: x * (max(min(x + 3, 6), 0) * 1/6),
    the clip chain in the temporary `t`: vadd 3 (FMAC), vmin 6, vmax 0 (vector ALU), vmul 1/6 (FMAC),
    then src * t (FMAC), each waiting on the one before."""
    return [("fmac", t, src, m.fmac_latency), ("valu", t, (t,), m.valu_latency), ("valu", t, (t,), m.valu_latency),
            ("fmac", t, (t,), m.fmac_latency), ("fmac", x, src + (t,), m.fmac_latency)]


def _epi_instrs(m: DspMachine, acc: object, epi: tuple[str, ...], kv_index: int) -> list[Instr]:
    out: list[Instr] = []
    for e in epi:
        if e == "bias":
            out.append(("fmac", acc, (acc, ("bias", kv_index)), m.fmac_latency))
        elif e == "bn":
            out.append(("fmac", acc, (acc, ("scale", kv_index), ("shift", kv_index)), m.fmac_latency))
        elif e == "res":  # the residual's vector of this pixel loaded from its AM tile, then added
            out.append(("ldst", ("res", acc), (), m.vld_latency))
            out.append(("fmac", acc, (acc, ("res", acc)), m.fmac_latency))
        elif e == "relu":
            out.append(("valu", acc, (acc,), m.valu_latency))
        elif e == "hswish":
            out += _hswish_instrs(m, acc, (acc,), ("hswish", acc))
    return out


def _check_regs(m: DspMachine, live: int, per_iter: int, what: str) -> int:
    depth = (m.registers - live) // max(per_iter, 1)
    if depth < 1:
        need = (live + per_iter) * m.lanes // 2 * 8  # 64-bit registers x VPEs
        raise CapacityError(what, "vector registers", need, m.registers * m.lanes // 2 * 8,
                            f"{live} live + {per_iter} per iteration > {m.registers} registers")
    return depth


@lru_cache(maxsize=4096)
def mk_out(m: DspMachine, pw: int, kv: int, steps: int, epi: tuple[str, ...] = ()) -> MkCost:
    """Output-stationary register block: pw pixels x kv vectors of output channels accumulate in
    registers over `steps` reduction steps (R*S*C); per step kv weight vectors are loaded from AM
    and pw input scalars are loaded from SM and broadcast; then the epilogue and the stores."""
    live = pw * kv + sum(EPI_REGS[e] for e in epi) * kv
    # the epilogue's temporaries take registers the loop's weight and input registers free
    depth = _check_regs(m, live, max(kv + pw, sum(EPI_TEMPS[e] for e in epi)), f"register block {pw}x{kv}")
    pro: list[Instr] = [("ldst", (e, v), (), m.vld_latency) for e in epi if EPI_REGS[e] for v in range(kv)
                        for _ in range(EPI_REGS[e])]

    def body(i: int) -> list[Instr]:
        ins: list[Instr] = [("ldst", ("w", i, v), (), m.vld_latency) for v in range(kv)]
        ins += [("sld", ("x", i, p), (), m.sld_latency) for p in range(pw)]
        for p in range(pw):
            for v in range(kv):
                acc = ("acc", p, v)
                src = (("w", i, v), ("x", i, p)) + ((acc,) if i else ())
                ins.append(("fmac", acc, src, m.fmac_latency))
        return ins

    def epilogue(_: int) -> list[Instr]:
        ins: list[Instr] = []
        for p in range(pw):
            for v in range(kv):
                ins += _epi_instrs(m, ("acc", p, v), epi, v)
                ins.append(("ldst", None, (("acc", p, v),), m.vld_latency))
        return ins

    return replace(_run(m, pro, body, steps, epilogue, depth), calls=(("out", pw, kv, steps, epi),))


@lru_cache(maxsize=4096)
def mk_ws(m: DspMachine, npix: int, kv: int, r: int, s: int, wo: int, rmw: bool) -> MkCost:
    """Weight-stationary pass of seed 004 Algorithm 3: the R*S x kv weight vectors of one input
    channel sit in registers; for each of `npix` output pixels (rows of `wo`) the partial sums
    are loaded from AM (unless this is the first channel), the R x S input scalars are
    broadcast and multiplied in, and the partial sums are stored back to AM. Moving along a
    row reuses the broadcast columns of the previous pixel (register rotation): each pixel
    loads one new column of R scalars, a row start loads S."""
    taps = r * s
    depth = _check_regs(m, taps * kv + (s - 1) * r, kv + r, f"weight-stationary block {taps}x{kv}")
    pro: list[Instr] = [("ldst", ("w", t, v), (), m.vld_latency) for t in range(taps) for v in range(kv)]

    def body(i: int) -> list[Instr]:
        row, col = divmod(i, wo)
        ins: list[Instr] = [("ldst", ("acc", i, v), (), m.vld_latency) for v in range(kv)] if rmw else []
        cols = range(col, col + s) if col == 0 else (col + s - 1,)
        ins += [("sld", ("x", row, cc, rr), (), m.sld_latency) for cc in cols for rr in range(r)]
        for rr in range(r):
            for ss in range(s):
                t = rr * s + ss
                for v in range(kv):
                    acc = ("acc", i, v)
                    src = (("w", t, v), ("x", row, col + ss, rr)) + ((acc,) if (rmw or t) else ())
                    ins.append(("fmac", acc, src, m.fmac_latency))
        ins += [("ldst", None, (("acc", i, v),), m.vld_latency) for v in range(kv)]
        return ins

    return replace(_run(m, pro, body, npix, lambda _: [], depth, period=wo), calls=(("ws", npix, kv, r, s, wo, rmw),))


@lru_cache(maxsize=4096)
def mk_ew(m: DspMachine, nvec: int, n_in: int, fm: int, va: int, params: int, hs: int = 0) -> MkCost:
    """Element-wise pass over `nvec` vectors: n_in vector loads, `fm` FMAC ops (add, scale+shift),
    `va` vector-ALU ops (max for ReLU) and `hs` HardSwish steps (`_hswish_instrs`, one temporary
    register each) chained per vector, one store."""
    depth = _check_regs(m, params, n_in + 1 + hs, "element-wise block")
    pro: list[Instr] = [("ldst", ("p", j), (), m.vld_latency) for j in range(params)]

    def body(i: int) -> list[Instr]:
        ins: list[Instr] = [("ldst", ("x", i, j), (), m.vld_latency) for j in range(n_in)]
        prev = tuple(("x", i, j) for j in range(n_in))
        for _ in range(fm):
            ins.append(("fmac", ("y", i), prev + tuple(("p", j) for j in range(params)), m.fmac_latency))
            prev = (("y", i),)
        for _ in range(va):
            ins.append(("valu", ("y", i), prev, m.valu_latency))
            prev = (("y", i),)
        for _ in range(hs):
            ins += _hswish_instrs(m, ("y", i), prev, ("t", i))
            prev = (("y", i),)
        ins.append(("ldst", None, prev, m.vld_latency))
        return ins

    sig = ("ew", nvec, n_in, fm, va, params) + ((hs,) if hs else ())
    return replace(_run(m, pro, body, nvec, lambda _: [], depth), calls=(sig,))


def sum_costs(costs: list[tuple[MkCost, int]]) -> MkCost:
    return MkCost(cycles=sum(c.cycles * k for c, k in costs), fmas=sum(c.fmas * k for c, k in costs),
                  vldst=sum(c.vldst * k for c, k in costs), slds=sum(c.slds * k for c, k in costs),
                  valu=sum(c.valu * k for c, k in costs), calls=tuple(x for c, k in costs for x in c.calls * k))


# ------------------------------------------------------------------ a transfer


def dma_cycles(m: DspMachine, op: Op) -> tuple[int, int, int]:
    """(engine cycles, DDR channel cycles, GSM channel cycles) of one transfer by one core."""
    src, dst = op.path.split("->")
    ddr = op.nbytes / m.ddr_bytes_per_cycle * ((src == "DDR") + (dst == "DDR"))
    gsm = op.nbytes / m.gsm_bytes_per_cycle * ((src == "GSM") + (dst == "GSM"))
    lat = max(m.ddr_latency if "DDR" in (src, dst) else 0, m.gsm_latency if "GSM" in (src, dst) else 0)
    eng = m.dma_startup + lat + op.nbytes / m.dma_bytes_per_cycle + op.nruns * m.dma_row_cycles
    return int(eng), int(np.ceil(ddr)), int(np.ceil(gsm))


# ------------------------------------------------------------------ a vector kernel


def _instrs(m: DspMachine, ins: VI) -> list[Instr]:
    """The instruction as the core scheduler sees it: (unit, destination, register sources, latency)."""
    u = unit(ins)
    if ins.op == "vld":
        lat = m.vld_latency
        return [("ldst", None, (), lat)] * (slots(ins) - 1) + [("ldst", ins.dst, (), lat)]
    if ins.op == "sld":
        return [("sld", ins.dst, (), m.sld_latency)]
    regs = tuple(s for s in ins.srcs if isinstance(s, str))
    if ins.op == "vst":
        return [("ldst", None, regs, m.vld_latency)]
    return [(u, ins.dst, regs, m.fmac_latency if u == "fmac" else m.valu_latency)]


def _ins_sig(ins: VI) -> tuple:
    def one(x):
        if isinstance(x, Mem):
            return ("M", x.level, x.lane)
        return x if isinstance(x, str) else "imm"
    return (ins.op, one(ins.dst), tuple(one(s) for s in ins.srcs))


def nest_signature(n: Nest) -> tuple:
    """What a nest's timing depends on (not its addresses)."""
    return (n.count, n.inner, tuple(map(_ins_sig, n.pre)), tuple(map(_ins_sig, n.body)), tuple(map(_ins_sig, n.post)))


def registers(n: Nest) -> tuple[int, int]:
    """(live-in registers read before any write in the nest, registers written per iteration)."""
    written: set = set()
    live: set = set()
    for ins in n.pre + n.body + n.post:
        for s in ins.srcs:
            if isinstance(s, str) and s not in written:
                live.add(s)
        if isinstance(ins.dst, str):
            written.add(ins.dst)
    return len(live - written), len(written)


_COST: dict[tuple, MkCost] = {}


def nest_cost(m: DspMachine, n: Nest, what: str = "VPU nest") -> MkCost:
    key = (m, nest_signature(n))
    if key not in _COST:
        if n.count == 0:
            _COST[key] = MkCost(cycles=0, fmas=0, vldst=0, slds=0, valu=0)
        else:
            live, per_iter = registers(n)
            if live + per_iter > m.registers:
                raise CapacityError(what, "vector registers", (live + per_iter) * m.lanes * 4, m.registers * m.lanes * 4,
                                    f"{live} live + {per_iter} per iteration > {m.registers} registers")
            depth = _check_regs(m, live, per_iter, what)
            seq: list[Instr] = [t for ins in n.pre for t in _instrs(m, ins)]
            body = [t for ins in n.body for t in _instrs(m, ins)]
            seq += body * prod(n.inner)
            seq += [t for ins in n.post for t in _instrs(m, ins)]
            _COST[key] = _run(m, [], lambda _i: seq, n.count, lambda _i: [], depth)
    return _COST[key]


def kernel_cost(m: DspMachine, k: VKernel) -> MkCost:
    """Cycles of the pass: its nests one after the other (each a loop with its exit)."""
    costs = [nest_cost(m, n, f"{k.label} nest {i}") for i, n in enumerate(k.nests)]
    return MkCost(cycles=sum(c.cycles for c in costs), fmas=sum(c.fmas for c in costs),
                  vldst=sum(c.vldst for c in costs), slds=sum(c.slds for c in costs), valu=sum(c.valu for c in costs))


# ------------------------------------------------------------------ the replay


SKIP_REPEATS = True  # tests turn the steady-state skip of repeated stages off to check it is exact
PIPES = ("dma", "vpu", "sync")  # the DMA engine and the VPU run work; "sync" only holds barriers
CHANNELS = ("ddr", "gsm")  # shared by the cluster's cores


class _Sched:
    """The cores (or core groups) on the simulator core's scoreboards, the cluster's shared
    DDR and GSM channels, and what the DSP ISA adds: a transfer's engine and channel cycles
    (`dma_cycles`), FMAC busy time, the issued-work counters."""

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
                eng, ddr, gsm = dma_cycles(m, op)
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
        _run_one(sched, prog.cores[0])
    else:
        _timing_groups(sched, prog.cores)
    counters = Counters()
    for op, k in sched.counts.values():
        counters.add_op(op, k)
    dsp = max((max(p.values()) for p in sched.pipe), default=0)
    host = sum(cyc for _, cyc, _ in prog.host_pre) + sum(cyc for _, cyc, _ in prog.host_post)
    busy = sched.busy
    busy["host"] = host
    host_bytes(prog, counters)
    # busy: summed busy cycles per resource (vpu, fmac, dma per core; ddr, gsm channels; host)
    return Timing(cycles=int(dsp + host), host_cycles=int(host), busy=dict(busy),
                  bytes_by_level=counters.bytes_by_level, counters=counters, detail={"dsp_cycles": int(dsp)})


def _run_one(sched: _Sched, ops: list) -> None:
    """Schedule the ops of one core group (`sched`'s group 0) in order."""
    for op in ops:
        if isinstance(op, Repeat):
            sched.repeat(op.body, op.count)
        elif op.kind == "barrier":
            sched.barrier([0])
        else:
            sched.run(0, op)


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
        _run_one(merged, cores[0][cut[0] + 1:])
        for sb in sched.boards:
            sb.pipe = dict(one.pipe)
        return
    _timing_heap(sched, [expand(ops) for ops in cores])


def _timing_heap(sched: _Sched, cores: list[list[Op]]) -> None:
    """Several core groups: issue ops in the order of their earliest start across the groups."""
    interleave(cores, sched.mult, sched.candidate, sched.run, sched.barrier, lambda op: op.kind == "barrier")


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
