"""The DSP core model: one VPU micro-kernel invocation as an instruction stream, list-scheduled.

A micro-kernel is what one call of the kernel's innermost block issues: vector loads and
stores between AM and the vector registers, scalar loads from SM broadcast to the lanes, and
vector FMAs into accumulator registers. The stream is scheduled cycle by cycle on the VPU's
issue slots (FMACs, load/store, scalar-load, vector ALU) with each instruction's latency and
its register dependencies, so a block with too few independent accumulators stalls on the
6-cycle FMAC latency. Register capacity bounds how many iterations may be in flight (a
software-pipelining window); a block that cannot hold its live registers does not build.

The stream of a given signature is always the same, so its cycle count is memoized; the loop
of identical iterations is simulated until its per-iteration cost repeats, then the rest of
the (periodic) loop is skipped and accounted for exactly.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable

from ...errors import CapacityError
from .machine import DspMachine

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


class _Sched:
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
    s = _Sched(m)
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


EPI_REGS = {"bias": 1, "bn": 2, "res": 0, "relu": 0}  # per-channel parameter vectors an epilogue holds in registers


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
    depth = _check_regs(m, live, kv + pw, f"register block {pw}x{kv}")
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
def mk_ew(m: DspMachine, nvec: int, n_in: int, fm: int, va: int, params: int) -> MkCost:
    """Element-wise pass over `nvec` vectors: n_in vector loads, `fm` FMAC ops (add, scale+shift)
    and `va` vector-ALU ops (max for ReLU) chained per vector, one store."""
    depth = _check_regs(m, params, n_in + 1, "element-wise block")
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
        ins.append(("ldst", None, prev, m.vld_latency))
        return ins

    return replace(_run(m, pro, body, nvec, lambda _: [], depth), calls=(("ew", nvec, n_in, fm, va, params),))


def sum_costs(costs: list[tuple[MkCost, int]]) -> MkCost:
    return MkCost(cycles=sum(c.cycles * k for c, k in costs), fmas=sum(c.fmas * k for c, k in costs),
                  vldst=sum(c.vldst * k for c, k in costs), slds=sum(c.slds * k for c, k in costs),
                  valu=sum(c.valu * k for c, k in costs), calls=tuple(x for c, k in costs for x in c.calls * k))
