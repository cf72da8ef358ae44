"""The functional replay's own clock: a second accounting of the DSP cluster's cycles.

Timing mode (`timing.timing`) costs what the timing program declares (`timing.dma_cycles`,
each VPU pass's list-scheduled `cycles` from `timing.mk_*` / `timing.kernel_cost`, the `DspMachine`
figures) on the scoreboard, with repeat blocks, steady-state skips and core groups. The
functional replay here times what it *executes*, with nothing of that path:

* its own figures, read from the target description (not from `DspMachine`): the DMA
  engine's start-up, rate and cost per contiguous run, DDR and GSM bandwidth and latency, the
  VPU's issue slots per unit (FMACs, vector load/store, scalar load, vector ALU), their
  latencies, the register file and the loop-exit (branch) latency;
* a transfer costs what it moved: the bytes and contiguous runs of the two views the DMA
  engine executed, on the levels they live in; DDR and GSM are channels the cores share;
* a VPU pass whose instructions execute (`execute.execute_pass`: pooling, grouped convolution,
  element-wise chains, softmax, reductions, data movement) costs its executed loop nests,
  list-scheduled here cycle by cycle on the issue slots with the units' latencies, the
  register dependencies and the register window, with every iteration issued (no
  steady-state skip);
* a register-blocked micro-kernel call of the direct convolution (output- or
  weight-stationary), the k-split or an epilogue pass (`timing.mk_out`, `mk_ws`, `mk_ew`: their
  functional bodies evaluate the TIR block, not an instruction stream) costs the instruction
  stream of its block, issued here from its kind and shape (`MkCost.calls`, recorded per
  call: pixels x vectors of the register block, the K loop's trip count, the epilogue): the
  weight-vector loads, scalar broadcasts, FMACs, epilogue and stores of every iteration, on
  the same slots and latencies, with the register window of what the block holds;
* a zero fill (padding halos, an empty k-split part's zero tile) costs what it writes, as the
  lowering recorded it (`Op.zeros`: level, elements, the stores that write them): scalar stores
  of one register word each (the REG level's bytes per VPE register) on the scalar memory
  port's slots, or vector stores of `lanes` elements each, every one of a register zeroed by
  a vector-ALU move, on the vector load/store and ALU slots (the slower binds); at its issue
  rate, no store latency or loop exit (as the lowering declares it);
* the host's share (launch, CPU <-> DSP copies, host-side replication) costs the target's host
  figures (`extra.launch_overhead_us`, `host_copy_gbps`, ...) for what each step is and the
  bytes it moves;
* dependencies and the cluster's order come from `opcompiler.sim.trace` over the per-core op
  lists as executed (one list per core: no repeat blocks, no core groups), never the
  scoreboard.

Still shared, taken as the program declares them: the shapes of the micro-kernel calls and
what a zero fill writes (what the lowering found each to be), and the buffer tags a dependency
is on.

The clocks agree exactly on the same per-core program (`timing.timing` of the functional
program); the timing program's core groups make the reported timing cycles differ from this
by a few % where identical cores' transfers hold a shared channel as one block
(`tests/sim/test_crosscheck.py` states that relation).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Sequence

import numpy as np

from ...sim.profile import Timing
from ...sim.trace import BARRIER, WORK, Event, Trace
from ...target import Target
from . import execute as ex, program as vx  # vx: the VPU's vector instructions
from .program import Program, View

__all__ = ["DspClock", "clock", "for_machine", "replay", "runs"]

F32 = 4
FMAC_OPS = frozenset({"vadd", "vsub", "vmul", "vfma", "vfnma"})
VALU_OPS = frozenset({"vmax", "vmin", "vmov", "vfloor", "vldexp", "vgetexp", "vgetmant", "vrcpe", "vrsqrte",
                       "vrot"})


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
    lanes: int  # fp32 elements per vector store (VPEs x lanes per VPE)
    word: int  # bytes per scalar store (a 64-bit register), 0: the target does not say
    # the host's share (cycles of the cluster clock): a call's launch, a CPU <-> DSP copy (start-up
    # + bytes at the host copy rate), a host-side replication (its own rate, else a copy's)
    launch: int
    host_bpc: float
    host_overhead: int
    replicate_bpc: float  # 0: a copy's rate and start-up
    replicate_overhead: int

    def host(self, what: str, nbytes: int) -> int:
        """Cycles of one host-side step of a call, by what it does and the bytes it moves."""
        if what == "launch":
            return self.launch
        if what.startswith("replicate") and self.replicate_bpc:
            return int(self.replicate_overhead + nbytes / self.replicate_bpc)
        if what.startswith(("copy", "replicate")):
            return int(self.host_overhead + nbytes / self.host_bpc)
        raise ValueError(f"the functional clock has no cost for the host step {what!r}")

    def dma(self, src: str, dst: str, nbytes: int, nruns: int) -> tuple[int, int, int]:
        """(engine cycles, DDR channel cycles, GSM channel cycles) of one executed transfer."""
        ends = (src, dst)
        lat = max(self.ddr_latency if "DDR" in ends else 0, self.gsm_latency if "GSM" in ends else 0)
        engine = int(self.dma_startup + lat + nbytes / self.dma_bpc + nruns * self.dma_per_run)
        ddr = int(np.ceil(nbytes / self.ddr_bpc * ends.count("DDR")))
        gsm = int(np.ceil(nbytes / self.gsm_bpc * ends.count("GSM")))
        return engine, ddr, gsm

    def fill(self, level: str, elements: int, stores: str) -> int:
        """Cycles of a zero fill, at the rate its stores issue: scalar stores of one register word
        each on the scalar memory port's slots; or vector stores of `lanes` elements each, every
        one of a register zeroed by a vector-ALU move, on the vector load/store and ALU slots
        (the slower binds). Their latency is not charged (nor is it in the timing model)."""
        if stores == "scalar":
            if not self.word:
                raise ValueError("the functional clock has no scalar store width (the target's REG level)")
            words = -(-elements * F32 // self.word)
            return -(-words // self.slots["sld"])
        if stores == "vector":
            n = -(-elements // self.lanes)
            return max(-(-n // self.slots["ldst"]), -(-n // self.slots["valu"]))
        raise ValueError(f"the functional clock has no cost for {stores!r} stores of a fill into {level}")

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


    # -- register-blocked micro-kernels ----------------------------------------------------------
    # One call of the direct convolution's, the k-split's or an epilogue's innermost block, by
    # its kind and shape (what `timing` recorded of each call it costed, `MkCost.calls`):
    #   ("out", pw, kv, steps, epi)  pw pixels x kv output-channel vectors accumulated in registers
    #                                over `steps` reduction steps (the K loop), then the epilogue
    #   ("ws", npix, kv, r, s, wo, rmw)  one input channel's r x s x kv weights held in registers,
    #                                swept over npix pixels (rows of wo), partial sums in AM
    #   ("ew", nvec, n_in, fm, va, params[, hs])  nvec vectors: n_in loads, fm FMAC and va vector-ALU
    #                                ops chained, hs HardSwish steps, one store, `params` vectors held
    # Each is issued here as the instruction stream that block executes, every iteration of its
    # loop in order (no steady-state skip), on this clock's slots and latencies.

    def call(self, sig: tuple) -> int:
        """Cycles of one micro-kernel call."""
        got = _CALLS.get((self, sig))
        if got is None:
            kind = sig[0]
            if kind not in ("out", "ws", "ew"):
                raise ValueError(f"the functional clock has no micro-kernel {kind!r}")
            got = _CALLS[(self, sig)] = getattr(self, "_mk_" + kind)(*sig[1:])
        return got

    def _ld(self, dst) -> tuple:
        return ("ldst", dst, (), self.latency["vld"])

    def _st(self, src) -> tuple:
        return ("ldst", None, (src,), self.latency["vld"])

    def _fma(self, dst, *srcs) -> tuple:
        return ("fmac", dst, srcs, self.latency["fmac"])

    def _window(self, held: int, per_iteration: int) -> int:
        """Iterations in flight: the registers not held across the loop over those one iteration
        takes."""
        return max(1, (self.registers - held) // max(per_iteration, 1))

    def _mk_out(self, pw: int, kv: int, steps: int, epi: tuple) -> int:
        params = [(name, v) for e in epi for v in range(kv) for name in _EPI_PARAMS[e]]
        # the epilogue's temporaries (HardSwish's) take registers the loop's weights and inputs free
        window = self._window(pw * kv + len(params), max(kv + pw, sum(_EPI_TEMPS[e] for e in epi)))
        accs = [("acc", p, v) for p in range(pw) for v in range(kv)]
        sld = self.latency["sld"]

        def body(_: int) -> list:
            ins = [self._ld(("w", v)) for v in range(kv)]
            ins += [("sld", ("x", p), (), sld) for p in range(pw)]
            ins += [self._fma(a, ("w", a[2]), ("x", a[1]), a) for a in accs]
            return ins
        tail: list = []
        for a in accs:
            v = a[2]
            for e in epi:
                if e == "bias":
                    tail.append(self._fma(a, a, ("bias", v)))
                elif e == "bn":
                    tail.append(self._fma(a, a, ("scale", v), ("shift", v)))
                elif e == "res":  # the residual's vector of this pixel, loaded and added
                    tail += [self._ld(("res", a)), self._fma(a, a, ("res", a))]
                elif e == "relu":
                    tail.append(("valu", a, (a,), self.latency["valu"]))
                elif e == "hswish":  # x * (max(min(x + 3, 6), 0) / 6), the clip in a temporary
                    tail += self._hswish(a, (a,), ("hswish", a))
                else:
                    raise ValueError(f"the functional clock has no epilogue {e!r}")
            tail.append(self._st(a))
        return self._loop([self._ld(r) for r in params], body, steps, tail, window)

    def _mk_ws(self, npix: int, kv: int, r: int, s: int, wo: int, rmw: bool) -> int:
        # held: the r*s*kv weights and the s-1 columns of r scalars reused along a row;
        # per pixel: its kv partial sums and one new column of r scalars
        window = self._window(r * s * kv + (s - 1) * r, kv + r)
        sld = self.latency["sld"]

        def body(i: int) -> list:
            row, col = divmod(i, wo)
            acc = [("acc", i, v) for v in range(kv)]
            ins = [self._ld(a) for a in acc] if rmw else []
            new = range(s) if col == 0 else (s - 1,)  # a row starts with all s columns
            ins += [("sld", ("x", row, col + c, y), (), sld) for c in new for y in range(r)]
            ins += [self._fma(acc[v], ("w", y, c, v), ("x", row, col + c, y), acc[v])
                    for y in range(r) for c in range(s) for v in range(kv)]
            return ins + [self._st(a) for a in acc]
        pro = [self._ld(("w", y, c, v)) for y in range(r) for c in range(s) for v in range(kv)]
        return self._loop(pro, body, npix, [], window)

    def _hswish(self, x, src: tuple, t) -> list:
        """HardSwish of what `src` holds into x: t = src + 3 (FMAC), min 6, max 0 (vector ALU),
        t * 1/6 (FMAC), x = src * t (FMAC)."""
        valu = self.latency["valu"]
        return [self._fma(t, *src), ("valu", t, (t,), valu), ("valu", t, (t,), valu), self._fma(t, t),
                self._fma(x, *src, t)]

    def _mk_ew(self, nvec: int, n_in: int, fm: int, va: int, params: int, hs: int = 0) -> int:
        window = self._window(params, n_in + 1 + hs)  # a HardSwish step's temporary per vector
        ps = tuple(("p", j) for j in range(params))

        def body(i: int) -> list:
            xs = tuple(("x", i, j) for j in range(n_in))
            ins = [self._ld(x) for x in xs]
            y, prev = ("y", i), xs
            for _ in range(fm):
                ins.append(self._fma(y, *prev, *ps))
                prev = (y,)
            for _ in range(va):
                ins.append(("valu", y, prev, self.latency["valu"]))
                prev = (y,)
            for _ in range(hs):
                ins += self._hswish(y, prev, ("t", i))
                prev = (y,)
            return ins + [("ldst", None, prev, self.latency["vld"])]
        return self._loop([self._ld(p) for p in ps], body, nvec, [], window)

    def _loop(self, pro: list, body, n: int, tail: list, window: int) -> int:
        """Issue the prologue, then the n iterations of `body` in order (an iteration may not
        issue before the last issue of the iteration `window` earlier), then the tail after the
        last iteration's last issue; each instruction at the first cycle its registers are
        ready and its unit has a free slot. Cycles: the last result ready, then the loop exit."""
        used = {u: {} for u in self.slots}
        nxt = {u: {} for u in self.slots}
        ready: dict = {}
        end = 0

        def issue(ins: tuple, gate: int) -> int:
            nonlocal end
            unit, dst, srcs, lat = ins
            t = gate
            for r in srcs:
                if ready.get(r, 0) > t:
                    t = ready[r]
            t = _free(nxt[unit], t)
            k = used[unit].get(t, 0) + 1
            used[unit][t] = k
            if k >= self.slots[unit]:
                nxt[unit][t] = t + 1
            if dst is not None:
                ready[dst] = t + lat
            end = max(end, t + lat)
            return t
        for ins in pro:
            issue(ins, 0)
        lasts: list[int] = []
        for i in range(n):
            gate = lasts[i - window] if i >= window else 0
            lasts.append(max((issue(ins, gate) for ins in body(i)), default=0))
        gate = lasts[-1] if lasts else 0
        for ins in tail:
            issue(ins, gate)
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
_CALLS: dict[tuple, int] = {}
# the parameter vectors each epilogue stage holds in registers, per output-channel vector
_EPI_PARAMS = {"bias": ("bias",), "bn": ("scale", "shift"), "res": (), "relu": (), "hswish": ()}
# the temporary registers each epilogue stage holds per vector while it runs
_EPI_TEMPS = {"bias": 0, "bn": 0, "res": 0, "relu": 0, "hswish": 1}


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
    ex = target.extra
    cyc = lambda us: int(float(us) * 1e-6 * hz)  # noqa: E731  (microseconds of the host, in cycles)
    bpc = lambda gbps: float(gbps) * 1e9 / hz  # noqa: E731
    return DspClock(
        dma_bpc=float(dma["bytes_per_cycle"]), dma_startup=int(dma["startup_cycles"]),
        dma_per_run=int(dma.get("row_cycles", 0)),
        ddr_bpc=mem["DDR"].bandwidth_gbps * 1e9 / hz, gsm_bpc=mem["GSM"].bandwidth_gbps * 1e9 / hz,
        ddr_latency=mem["DDR"].latency_cycles, gsm_latency=mem["GSM"].latency_cycles,
        slots={"fmac": int(vpe["fmac_units"]), "ldst": int(vpe["vector_ldst_per_cycle"]),
               "sld": int(vpe["scalar_loads_per_cycle"]), "valu": int(vpe.get("valu_per_cycle", 1))},
        latency={"fmac": int(vpe["fmac_latency"]), "valu": int(vpe.get("valu_latency", 2)),
                 "vld": max(1, mem["AM"].latency_cycles), "sld": max(1, mem["SM"].latency_cycles)},
        registers=int(vpe["registers"]), branch=int(vpe.get("branch_latency", 7)),
        lanes=int(vpe["count"]) * int(vpe["lanes_fp32"]),
        word=int(mem["REG"].capacity_bytes // (int(vpe["count"]) * int(vpe["registers"]))) if "REG" in mem else 0,
        launch=cyc(ex.get("launch_overhead_us", 0.0)),
        host_bpc=bpc(ex.get("host_copy_gbps", 1.0)), host_overhead=cyc(ex.get("host_copy_overhead_us", 0.0)),
        replicate_bpc=bpc(ex["host_replicate_gbps"]) if "host_replicate_gbps" in ex else 0.0,
        replicate_overhead=cyc(ex.get("host_replicate_overhead_us", 0.0)))


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
    """Functional mode with its own clock: `execute.execute` runs the (functional) program,
    every op each core executed is recorded in the order it ran (cores phase by phase between
    barriers) with the VPU loop nests it executed, and each is costed by this clock's tables;
    `sim.trace` derives the dependencies and evaluates them with the shared DDR and GSM
    channels. Returns (output, counters, Timing)."""
    from .execute import execute

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

    ex.OBSERVERS.append(seen)
    try:
        out, counters = execute(m, prog, inputs, record)
    finally:
        ex.OBSERVERS.remove(seen)
    tr = Trace(len(prog.cores))
    for c, entries in enumerate(ran):
        for e in entries:
            tr.record(c, Event(BARRIER) if e is None else _event(fc, *e))
    acc = tr.account()
    host = sum(fc.host(what, nbytes) for what, _, nbytes in prog.host_pre + prog.host_post)
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
    if kernels:  # VPU passes of vector instructions, as executed
        cyc = sum(fc.kernel(k) for k in kernels)
    elif op.cost is not None and op.cost.calls:  # register-blocked micro-kernel calls
        cyc = sum(fc.call(c) for c in op.cost.calls)
    elif op.kind == "fill":  # zero fills: what they write, how (`Op.zeros`)
        cyc = fc.fill(*op.zeros)
    else:
        raise ValueError(f"the functional clock has no cost for a {op.kind} op ({op.label})")
    return Event(WORK, op.pipe, reads, writes, cyc)
