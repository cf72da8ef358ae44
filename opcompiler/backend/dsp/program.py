"""The DSP's program: its instructions and the program container.

A template lowers a schedule (its knobs) into a `Program`: for each core, in program order,
the DMA transfers between levels (strided descriptors over flat memories), the VPU passes
(micro-kernel invocations with their register blocking, or vector kernels: `VKernel`),
zero-fills, barriers; plus the host's share (launch, CPU<->DSP copies in copy mode, host-side
weight replication). Buffers are allocated per level with the target's capacities; an overflow
is a CapacityError.

The VPU's vector instructions are here too: a `VKernel` is one VPU pass, a sequence of loop
nests (`Nest`), each a list of vector instructions (`VI`) over 32-lane registers and AM / SM
operands (`Mem`) whose addresses are affine in the nest's loop indices; `SEM` gives each opcode
its unit and its semantics, and the `emit_*` sequences are the VPU's math library.

The costs of all of this are `timing`'s (`timing.dma_cycles`, `timing.mk_*`,
`timing.kernel_cost`); the functional run is `execute`'s; the functional clock is `fclock`'s.

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
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable

import numpy as np

from ...errors import OpcError
from ...sim.buffers import Arena
from ...sim.instr import Instruction
from ...sim.program import Repeat, SimProgram
from .machine import F32, DspMachine


@dataclass(frozen=True)
class View:
    """A strided window (in fp32 elements) of one memory space: ("DDR", tensor) | ("GSM",) | ("AM",) | ("SM",)."""

    space: tuple
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def level(self) -> str:
        return self.space[0]


def runs(src: View, dst: View) -> int:
    """Contiguous runs a DMA descriptor needs: dims contiguous in both views merge."""
    shape, n, expect = list(src.shape), 1, 1
    merged = 0
    for d in range(len(shape) - 1, -1, -1):
        if src.strides[d] == expect and dst.strides[d] == expect:
            expect *= shape[d]
            merged = d
            continue
        merged = d + 1
        break
    else:
        return 1
    for d in range(merged):
        n *= shape[d]
    return n


class Op(Instruction):
    """One step of a core's program (the simulator core's instruction protocol). `pipe` is "dma",
    "vpu" or "sync"; `reads`/`writes` are buffer tags (for the scoreboard's dependencies); `fn`
    does the functional work (None in timing mode) and `execute` runs it. A zero fill's `zeros`
    says what it writes and how, (level, elements, "scalar" or "vector" stores): the functional
    clock (`fclock`) costs that; the timing model ignores it (it takes `cycles`). `cost` is a VPU
    pass's `timing.MkCost`. Every cost is the timing model's: a transfer's `timing.dma_cycles`, a
    VPU pass's declared `cycles` (from `timing.mk_*` / `timing.kernel_cost`); `cost_cycles` is
    the protocol's default, the declared `cycles` (0 for a transfer: this class computes no cost)."""

    __slots__ = ("kind", "pipe", "cycles", "reads", "writes", "nbytes", "path", "nruns", "cost", "fn", "label", "views",
                 "zeros")

    def __init__(self, kind: str, pipe: str, *, cycles: int = 0, reads: tuple = (), writes: tuple = (),
                 nbytes: int = 0, path: str = "", nruns: int = 0, cost: Any = None,
                 fn: Callable[[Any], None] | None = None, label: str = "", zeros: tuple = ()):
        self.kind, self.pipe, self.cycles, self.reads, self.writes = kind, pipe, cycles, reads, writes
        self.nbytes, self.path, self.nruns, self.cost, self.fn, self.label = nbytes, path, nruns, cost, fn, label
        self.zeros = zeros
        self.views: tuple = ()  # a transfer's (source, destination) Views

    def execute(self, mem: Any) -> Any:
        """Run the functional body (a VPU pass returns the micro-kernel calls it executed)."""
        return self.fn(mem)


def compress(blocks: list[tuple], periods: tuple[int, ...] = (2, 1)) -> list:
    """Run-length encode a sequence of op blocks (tuples of Op objects): at each position the
    first period (in blocks) that repeats at least 3 times becomes one Repeat."""
    out: list = []
    i, n = 0, len(blocks)
    ids = [tuple(map(id, b)) for b in blocks]
    while i < n:
        for p in periods:
            if p < 1 or i + 3 * p > n:
                continue
            reps = 1
            while i + (reps + 1) * p <= n and ids[i + reps * p:i + (reps + 1) * p] == ids[i:i + p]:
                reps += 1
            if reps >= 3:
                out.append(Repeat(tuple(op for j in range(p) for op in blocks[i + j]), reps))
                i += reps * p
                break
        else:
            out.extend(blocks[i])
            i += 1
    return out


@dataclass(kw_only=True)
class Program(SimProgram):
    """A lowered kernel for the whole cluster (the simulator core's program container:
    `listing()` prints a core's ops, repeat blocks once with their count)."""

    cores: list[list[Op]]  # per core (or per core group in timing mode)
    multiplicity: list[int]  # cores each entry stands for (1 each in functional mode)
    host_pre: list[tuple[str, int, int]]  # (what, cycles, bytes) before the DSP part
    host_post: list[tuple[str, int, int]]
    ddr_tensors: dict[str, tuple[int, ...]]  # every DDR region the kernel uses, with its shape
    inputs: list[str]  # DDR names of the op's inputs, in op order
    output: str
    out_shape: tuple[int, ...]
    prepare: list[Callable[[dict[str, np.ndarray]], None]] = field(default_factory=list)  # host-side copies
    flops: int = 0
    cores_used: int = 1
    info: dict[str, Any] = field(default_factory=dict)

    def streams(self) -> list[tuple[str, list]]:
        if all(m == 1 for m in self.multiplicity):
            return [(f"core {c}", ops) for c, ops in enumerate(self.cores)]
        return [(f"core group {c} (x{m} cores)", ops)
                for c, (ops, m) in enumerate(zip(self.cores, self.multiplicity))]

    def declared_cycles(self, op: Op) -> int | None:
        """A VPU pass's scheduled micro-kernel cycles; None for a transfer (its time depends on
        the shared DDR / GSM channels) and a barrier."""
        return op.cycles if op.pipe == "vpu" else None


class Allocator(Arena):
    """Bump allocation of one level of one core (or of the shared GSM), capacity enforced (the
    simulator core's `Arena`), in fp32 elements."""

    __slots__ = ()

    def __init__(self, level: str, capacity_bytes: int, align_bytes: int = 64):
        super().__init__(level, capacity_bytes, align_bytes)

    def alloc(self, name: str, elems: int) -> int:  # type: ignore[override]
        return super().alloc(name, elems * F32) // F32


def dma_op(m: DspMachine, src: View, dst: View, reads: tuple, writes: tuple, functional: bool, label: str = "") -> Op:
    """A DMA transfer; the path must exist on the chip (no AM <-> SM)."""
    path = f"{src.level}->{dst.level}"
    if m.dma_paths and path not in m.dma_paths:
        raise OpcError(f"the DMA engine has no {path} path", arg="schedule", value=label or path,
                       expected=", ".join(sorted(m.dma_paths)))
    if src.shape != dst.shape:
        raise OpcError(f"DMA {label}: shapes differ {src.shape} vs {dst.shape}")
    fn = None
    if functional:
        def fn(mem: Any, src=src, dst=dst) -> None:
            mem.view(dst)[...] = mem.view(src)
    op = Op("dma", "dma", reads=reads, writes=writes, nbytes=src.size * F32, path=path, nruns=runs(src, dst),
            fn=fn, label=label)
    op.views = (src, dst)
    return op


def contiguous(space: tuple, offset: int, shape: tuple[int, ...]) -> View:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return View(space, offset, tuple(shape), tuple(reversed(strides)))

def stage_order(stage: list[tuple], dbuf: bool, functional: bool, period: int = 1) -> list:
    """Program order of the stages' (DMA-in, VPU, DMA-out) ops. With two buffers the next tile's
    DMA-in is issued before this tile's VPU pass (software pipelining), so the DMA engine
    fetches while the VPU computes. Timing programs run-length encode repeated stages; `period`
    is the stages per image (their pattern repeats image after image, buffers alternating)."""
    if not stage:
        return []
    if dbuf:
        blocks = [tuple(stage[0][0])] + [tuple((stage[i + 1][0] if i + 1 < len(stage) else []) + comp + outs)
                                        for i, (_, comp, outs) in enumerate(stage)]
    else:
        blocks = [tuple(ins + comp + outs) for ins, comp, outs in stage]
    if functional:
        return [op for b in blocks for op in b]
    return compress(blocks, tuple(dict.fromkeys((2 * period, period, 2, 1))))


# ------------------------------------------------------------------ what a run issued


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


def host_bytes(prog: Program, counters: Counters) -> None:
    for _, _, nbytes in prog.host_pre + prog.host_post:
        if nbytes:
            counters.bytes_by_level["host_copy"] += nbytes


# ------------------------------------------------------------------ VPU vector instructions

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
