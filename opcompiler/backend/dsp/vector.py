"""VPU vector programs: the instructions one core's vector unit issues, executed and timed.

The direct convolution describes its VPU pass by a micro-kernel signature (`core.mk_out`);
the vector-nest lowerings (`tir_vector.py` and its subclasses, for pooling, grouped convolution,
element-wise chains, softmax, reductions and data movement) emit the instructions themselves. A `VKernel` is one VPU pass: a sequence of loop
nests (`Nest`), each a list of vector instructions (`VI`) over 32-lane registers and AM / SM
operands (`Mem`) whose addresses are affine in the nest's loop indices.

* **Functional mode** executes the instructions on the simulated memories, opcode by opcode
  (`SEM`): nothing here knows which operator a kernel computes. The outer loops of a nest are
  independent iterations (no iteration reads what another writes), so each instruction is
  evaluated for all of them at once (numpy over the iterations x 32 lanes); the inner loops run
  one step at a time with their registers carried (accumulators). A nest marked `contract`
  whose body is only loads and multiply-accumulates of same-step loads (a GEMM micro-kernel)
  runs its inner loop at once instead: every load gathered over the steps at the addresses it
  would issue, each accumulator plus the sum of its products (float64, rounded once).
  `EXECUTED` counts the issue slots the execution used, per unit, independently of the timing.
* **Timing** list-schedules the same instruction stream (`core._run`): every outer iteration
  issues `pre`, the inner loops' bodies and `post`, on the VPU's issue slots (FMACs, vector
  load/store, scalar load, vector ALU) with each unit's latency and the register dependencies;
  the register window bounds how many iterations are in flight, and a nest whose registers
  exceed the register file does not build (CapacityError).

ISA figures that seed 004 does not publish (assumed, named here so they can be changed):
* an AM vector load reads 32 fp32 at any element offset and at an element stride `lane`
  (through the crossbar between the AM banks and the VPEs); a load touching L 256-byte AM rows
  (L = the stride) takes L load/store slots. Stores write 32 contiguous lanes, predicated to
  the first `lanes` lanes.
* `vrot` rotates the lanes through the VPEs' shuffle network in one vector-ALU slot;
  `vrcpe` / `vrsqrte` are 8-bit reciprocal / reciprocal square root estimates (as ARM FRECPE /
  FRSQRTE), `vfloor`, `vldexp`, `vgetexp`, `vgetmant` are vector-ALU conversions on the exponent field (as AVX-512's). There is no
  hardware exp, log or divide: `emit_exp`, `emit_log` and `emit_rcp` expand them into these
  instructions (Cody-Waite reduction + degree-6 polynomial; exponent / mantissa split + degree-9
  polynomial; two Newton steps), and `emit_rsqrt` 1 / sqrt(x) (estimate, two Newton steps), as a
  math library for the VPU does.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ...errors import CapacityError, OpcError
from .core import Instr, MkCost, _check_regs, _run
from .machine import DspMachine
from .program import View

@dataclass(frozen=True)
class Mem:
    """A vector operand in AM (lane stride `lane`) or a scalar in SM broadcast to every lane
    (`lane` 0). The element address of lane l in iteration (i_0, ..., i_k) of a nest is
    base + sum(i_d * steps[d]) + l * lane, the indices being the nest's outer then inner loops."""

    level: str
    base: int
    steps: tuple[int, ...]
    lane: int = 1


@dataclass(frozen=True)
class VI:
    """One vector instruction: opcode, destination (a register name, or a Mem for `vst`), sources
    (register names, Mems for loads, float immediates); `lanes`: active lanes of a store (all
    when None)."""

    op: str
    dst: Any
    srcs: tuple = ()
    lanes: int | None = None


@dataclass(frozen=True)
class Nest:
    """for i in outer (independent): pre; for j in inner (sequential): body; post."""

    outer: tuple[int, ...]
    body: tuple[VI, ...] = ()
    inner: tuple[int, ...] = ()
    pre: tuple[VI, ...] = ()
    post: tuple[VI, ...] = ()
    # functional mode only: the body is loads and multiply-accumulates of same-step loads into
    # carried registers (a GEMM micro-kernel): run its inner loop as one contraction
    contract: bool = False

    @property
    def count(self) -> int:
        return prod(self.outer)


@dataclass(frozen=True)
class VKernel:
    nests: tuple[Nest, ...]
    label: str = ""


def _fma(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def _rcpe(a):
    r = 1.0 / np.asarray(a, np.float64)
    mant, ex = np.frexp(r)
    return np.ldexp(np.round(mant * 256.0) / 256.0, ex).astype(np.float32)


def _rsqrte(a):
    r = 1.0 / np.sqrt(np.asarray(a, np.float64))
    mant, ex = np.frexp(r)
    return np.ldexp(np.round(mant * 256.0) / 256.0, ex).astype(np.float32)


def _ldexp(a, b):
    return np.ldexp(np.asarray(a, np.float32), np.asarray(np.nan_to_num(b), np.float64).astype(np.int32))


def _getexp(a):
    return (np.frexp(np.asarray(a, np.float32))[1] - 1).astype(np.float32)  # floor(log2 |a|)


def _getmant(a):
    return (np.frexp(np.asarray(a, np.float32))[0] * 2).astype(np.float32)  # |a| / 2^floor(log2 |a|), in [1, 2)


def _rot(a, k):
    return np.roll(np.asarray(a, np.float32), -int(k), axis=-1)


# opcode -> (unit, semantics on float32 arrays of (iterations, lanes) or immediates)
SEM: dict[str, tuple[str, Any]] = {
    "vadd": ("fmac", lambda a, b: np.add(a, b, dtype=np.float32)),
    "vsub": ("fmac", lambda a, b: np.subtract(a, b, dtype=np.float32)),
    "vmul": ("fmac", lambda a, b: np.multiply(a, b, dtype=np.float32)),
    "vfma": ("fmac", _fma),  # a * b + c, rounded once
    "vfnma": ("fmac", lambda a, b, c: _fma(-np.asarray(a, np.float64), b, c)),  # c - a * b
    "vmax": ("valu", lambda a, b: np.maximum(a, b, dtype=np.float32)),
    "vmin": ("valu", lambda a, b: np.minimum(a, b, dtype=np.float32)),
    "vmov": ("valu", lambda a: np.asarray(a, np.float32)),
    "vfloor": ("valu", lambda a: np.floor(a).astype(np.float32)),
    "vldexp": ("valu", _ldexp),
    "vgetexp": ("valu", _getexp),
    "vgetmant": ("valu", _getmant),
    "vrcpe": ("valu", _rcpe),
    "vrsqrte": ("valu", _rsqrte),
    "vrot": ("valu", _rot),
}
MEMOPS = {"vld": "ldst", "vst": "ldst", "sld": "sld"}

EXECUTED: dict[str, int] = defaultdict(int)  # issue slots used by functional execution, per unit
# functional mode: callables shown every VKernel `execute` runs (the functional clock times them)
OBSERVERS: list = []


def unit(ins: VI) -> str:
    if ins.op in MEMOPS:
        return MEMOPS[ins.op]
    if ins.op not in SEM:
        raise OpcError(f"unknown VPU instruction {ins.op}", arg="instruction", value=ins.op,
                       expected=", ".join(sorted(SEM) + sorted(MEMOPS)))
    return SEM[ins.op][0]


def slots(ins: VI) -> int:
    """Issue slots of the instruction's unit (a strided AM load touches `lane` AM rows)."""
    if ins.op == "vld":
        return max(1, abs(ins.srcs[0].lane))
    return 1


# ------------------------------------------------------------------ timing


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


def _sig(ins: VI) -> tuple:
    def one(x):
        if isinstance(x, Mem):
            return ("M", x.level, x.lane)
        return x if isinstance(x, str) else "imm"
    return (ins.op, one(ins.dst), tuple(one(s) for s in ins.srcs))


def nest_signature(n: Nest) -> tuple:
    """What a nest's timing depends on (not its addresses)."""
    return (n.count, n.inner, tuple(map(_sig, n.pre)), tuple(map(_sig, n.body)), tuple(map(_sig, n.post)))


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


# ------------------------------------------------------------------ functional execution


def _view(mem: Any, op: Mem, outer: tuple[int, ...], idx: tuple[int, ...], width: int) -> np.ndarray:
    no = len(outer)
    if len(op.steps) != no + len(idx):
        raise OpcError(f"operand {op} has {len(op.steps)} steps for a nest of {no}+{len(idx)} loops")
    off = op.base + sum(i * s for i, s in zip(idx, op.steps[no:]))
    return mem.view(View((op.level,), off, tuple(outer) + (width,), tuple(op.steps[:no]) + (op.lane,)))


def _exec(mem: Any, ins: VI, regs: dict, outer: tuple[int, ...], idx: tuple[int, ...], lanes: int) -> None:
    p = prod(outer)
    EXECUTED[unit(ins)] += p * slots(ins)
    if ins.op == "vld":
        regs[ins.dst] = np.array(_view(mem, ins.srcs[0], outer, idx, lanes), np.float32).reshape(p, lanes)
    elif ins.op == "sld":
        v = _view(mem, ins.srcs[0], outer, idx, 1)
        regs[ins.dst] = np.broadcast_to(np.array(v, np.float32).reshape(p, 1), (p, lanes))
    elif ins.op == "vst":
        src = regs[ins.srcs[0]]
        width = ins.lanes or lanes
        dst = _view(mem, ins.dst, outer, idx, width)
        dst[...] = np.broadcast_to(src, (p, lanes))[:, :width].reshape(dst.shape)
    else:
        args = [regs[s] if isinstance(s, str) else s for s in ins.srcs]
        regs[ins.dst] = np.broadcast_to(SEM[ins.op][1](*args), (p, lanes))


def _contraction(n: Nest) -> bool:
    """Whether the body is only loads (each register loaded once) and `vfma acc <- x * y + acc`
    with x, y loaded in the same step, every accumulator distinct, no loaded register read in
    `post` (then the inner loop is a sum over its steps)."""
    loads: set = set()
    accs: list = []
    for ins in n.body:
        if ins.op in ("vld", "sld") and isinstance(ins.dst, str) and ins.dst not in loads:
            loads.add(ins.dst)
        elif ins.op == "vfma" and len(ins.srcs) == 3 and ins.srcs[2] == ins.dst and \
                all(isinstance(x, str) and x in loads for x in ins.srcs[:2]):
            accs.append(ins.dst)
        else:
            return False
    reads_after = {x for ins in n.post for x in ins.srcs if isinstance(x, str)}
    return bool(accs) and len(set(accs)) == len(accs) and not (set(accs) & loads) and not (reads_after & loads)


def _exec_contraction(mem: Any, n: Nest, regs: dict, lanes: int) -> None:
    """The inner loop of a multiply-accumulate body, every step at once: each load gathered over
    all steps (its address advances by its inner steps), each accumulator += the sum over the
    steps of its two operands' product (float64, rounded to fp32 once at the end: the per-step
    fp32 rounding of the chip's FMA chain is not reproduced). The issue slots are counted as
    if stepped."""
    no, ni = len(n.outer), len(n.inner)
    p, steps = prod(n.outer), prod(n.inner)
    loaded: dict[str, np.ndarray] = {}
    for ins in n.body:
        EXECUTED[unit(ins)] += p * steps * slots(ins)
        if ins.op not in ("vld", "sld"):
            continue
        op = ins.srcs[0]
        if len(op.steps) != no + ni:
            raise OpcError(f"operand {op} has {len(op.steps)} steps for a nest of {no}+{ni} loops")
        width = lanes if ins.op == "vld" else 1
        v = mem.view(View((op.level,), op.base, tuple(n.outer) + tuple(n.inner) + (width,),
                          tuple(op.steps) + (op.lane,)))
        loaded[ins.dst] = np.array(v, np.float64).reshape(p, steps, width)
    fmas = [ins for ins in n.body if ins.op == "vfma"]
    xs = list(dict.fromkeys(i.srcs[0] for i in fmas))
    ys = list(dict.fromkeys(i.srcs[1] for i in fmas))
    if len(fmas) == len(xs) * len(ys) and all(loaded[x].shape[2] == 1 for x in xs):
        # scalars x vectors, every pair: one batched matrix product (x: rows, y: columns)
        a = np.stack([loaded[x][:, :, 0] for x in xs], axis=1)  # (p, nx, steps)
        b = np.concatenate([loaded[y] for y in ys], axis=2) if all(loaded[y].shape[2] == lanes for y in ys) else None
        if b is not None:
            prodm = np.matmul(a, b)  # (p, nx, ny * lanes)
            where = {(x, y): (i, j) for i, x in enumerate(xs) for j, y in enumerate(ys)}
            for ins in fmas:
                i, j = where[ins.srcs[:2]]
                acc = np.broadcast_to(regs[ins.dst], (p, lanes)).astype(np.float64)
                regs[ins.dst] = (acc + prodm[:, i, j * lanes:(j + 1) * lanes]).astype(np.float32)
            return
    for ins in fmas:  # the general case, one accumulator at a time
        x, y = loaded[ins.srcs[0]], loaded[ins.srcs[1]]
        acc = np.broadcast_to(regs[ins.dst], (p, lanes)).astype(np.float64)
        regs[ins.dst] = (acc + np.broadcast_to(x * y, (p, steps, lanes)).sum(axis=1)).astype(np.float32)


def execute(mem: Any, k: VKernel, lanes: int) -> int:
    """Run the pass on the simulated memories; returns the number of loop nests executed."""
    for f in OBSERVERS:
        f(k)
    with np.errstate(all="ignore"):  # idle lanes compute on whatever the memory held; never stored
        for n in k.nests:
            if n.count == 0:
                continue
            regs: dict[str, np.ndarray] = {}
            zero = (0,) * len(n.inner)
            for ins in n.pre:
                _exec(mem, ins, regs, n.outer, zero, lanes)
            if n.contract and n.inner and _contraction(n):
                _exec_contraction(mem, n, regs, lanes)
            else:
                for idx in np.ndindex(*n.inner) if n.inner else [()]:
                    for ins in n.body:
                        _exec(mem, ins, regs, n.outer, idx, lanes)
            for ins in n.post:
                _exec(mem, ins, regs, n.outer, zero, lanes)
    return len(k.nests)


# ------------------------------------------------------------------ instruction sequences (a VPU math library)

LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125  # ln 2 split in two (Cody-Waite): n * LN2_HI is exact for |n| < 2^11
LN2_LO = 1.4286068203094172e-06
EXP_POLY = tuple(1.0 / np.prod(np.arange(1, k + 1, dtype=np.float64)) for k in range(6, -1, -1))  # 1/6! .. 1/0!
EXP_LO, EXP_HI = -87.33, 88.37  # exp stays a normal, finite fp32 inside


def emit_exp(x: str, y: str, r: str, nreg: str) -> list[VI]:
    """y = exp(x): clamp, n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], y = P6(r) * 2^n.
    Registers r and nreg are scratch; x is kept."""
    out = [VI("vmax", r, (x, EXP_LO)), VI("vmin", r, (r, EXP_HI)),
           VI("vfma", nreg, (r, LOG2E, 0.5)), VI("vfloor", nreg, (nreg,)),
           VI("vfnma", r, (nreg, LN2_HI, r)), VI("vfnma", r, (nreg, LN2_LO, r)),
           VI("vfma", y, (r, EXP_POLY[0], EXP_POLY[1]))]
    out += [VI("vfma", y, (y, r, c)) for c in EXP_POLY[2:]]
    out.append(VI("vldexp", y, (y, nreg)))
    return out


_F = 0.5 - 0.5 * np.cos(np.pi * (np.arange(400) + 0.5) / 400)
LOG_POLY = tuple(float(c) for c in np.polyfit(_F, np.log1p(_F), 9))  # ln(1 + f) on [0, 1), |error| < 6e-9
LN2 = 0.6931471805599453


def emit_log(x: str, y: str, e: str) -> list[VI]:
    """y = ln(x) for x > 0: x = m 2^e with m in [1, 2), ln x = e ln 2 + P9(m - 1). Register e is
    scratch; x is kept."""
    out = [VI("vgetexp", e, (x,)), VI("vgetmant", y, (x,)), VI("vsub", y, (y, 1.0)),
           VI("vfma", "lp", (y, LOG_POLY[0], LOG_POLY[1]))]
    out += [VI("vfma", "lp", ("lp", y, c)) for c in LOG_POLY[2:]]
    out.append(VI("vfma", y, (e, LN2, "lp")))
    return out


def emit_rcp(d: str, y: str, e: str) -> list[VI]:
    """y = 1 / d: 8-bit estimate, two Newton steps y <- y (2 - d y). Register e is scratch."""
    out = [VI("vrcpe", y, (d,))]
    for _ in range(2):
        out += [VI("vfnma", e, (d, y, 2.0)), VI("vmul", y, (y, e))]
    return out


def emit_rsqrt(d: str, y: str, e: str, h: str) -> list[VI]:
    """y = 1 / sqrt(d) for d > 0: 8-bit estimate, two Newton steps y <- y (1.5 - (d / 2) y^2).
    Registers e and h are scratch; d is kept."""
    out = [VI("vrsqrte", y, (d,)), VI("vmul", h, (d, 0.5))]
    for _ in range(2):
        out += [VI("vmul", e, (y, y)), VI("vfnma", e, (h, e, 1.5)), VI("vmul", y, (y, e))]
    return out


def emit_hreduce(op: str, x: str, tmp: str, lanes: int) -> list[VI]:
    """Every lane of x <- op over the lanes of x (log2(lanes) rotate-and-combine steps)."""
    out: list[VI] = []
    k = lanes // 2
    while k >= 1:
        out += [VI("vrot", tmp, (x, float(k))), VI(op, x, (x, tmp))]
        k //= 2
    return out


def fill_nests(value: float, base: int, shape: tuple[int, int, int], pitches: tuple[int, int], lanes: int
               ) -> list[Nest]:
    """Vector stores of a constant over a (planes, rows, cols) box of AM (elements between planes
    and between rows in `pitches`); the last vector of a row is predicated to the box's width."""
    np_, nr, nc = shape
    if np_ * nr * nc == 0:
        return []
    full, tail = divmod(nc, lanes)
    out = []
    st = (VI("vmov", "fill", (float(value),)),)
    if full:
        out.append(Nest(outer=(np_, nr, full), pre=st,
                        post=(VI("vst", Mem("AM", base, (pitches[0], pitches[1], lanes)), ("fill",)),)))
    if tail:
        out.append(Nest(outer=(np_, nr), pre=st,
                        post=(VI("vst", Mem("AM", base + full * lanes, pitches), ("fill",), lanes=tail),)))
    return out
