"""The lowered DSP kernel: per-core op lists over simulated memories.

A template lowers a schedule (its knobs) into a `Program`: for each core, in program order,
the DMA transfers between levels (strided descriptors over flat memories), the VPU passes
(micro-kernel invocations with their register blocking), zero-fills, barriers; plus the host's
share (launch, CPU<->DSP copies in copy mode, host-side weight replication). The simulator
executes exactly this: `engine.execute` moves and computes real values through the flat
DDR/GSM/AM/SM arrays, `engine.timing` schedules the same ops on the pipes and shared channels.
Buffers are allocated per level with the target's capacities; an overflow is a CapacityError.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...errors import OpcError
from ...sim.buffers import Arena
from ...sim.instr import Instruction
from ...sim.program import Repeat, SimProgram, expand
from .core import MkCost
from .machine import DspMachine

from .intrin import F32  # noqa: E402


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
    clock (`fclock`) costs that; the timing model ignores it (it takes `cycles`)."""

    __slots__ = ("kind", "pipe", "cycles", "reads", "writes", "nbytes", "path", "nruns", "cost", "fn", "label", "views",
                 "zeros")

    def __init__(self, kind: str, pipe: str, *, cycles: int = 0, reads: tuple = (), writes: tuple = (),
                 nbytes: int = 0, path: str = "", nruns: int = 0, cost: MkCost | None = None,
                 fn: Callable[[Any], None] | None = None, label: str = "", zeros: tuple = ()):
        self.kind, self.pipe, self.cycles, self.reads, self.writes = kind, pipe, cycles, reads, writes
        self.nbytes, self.path, self.nruns, self.cost, self.fn, self.label = nbytes, path, nruns, cost, fn, label
        self.zeros = zeros
        self.views: tuple = ()  # a transfer's (source, destination) Views

    def execute(self, mem: Any) -> Any:
        """Run the functional body (a VPU pass returns the micro-kernel calls it executed)."""
        return self.fn(mem)

    def cost_cycles(self, m: DspMachine, **rates: float) -> int:
        """Cycles on its pipe: a transfer's DMA-engine time (its shared-channel time is
        `dma_cycles`' other two figures), a VPU pass's scheduled micro-kernel cycles."""
        return dma_cycles(m, self)[0] if self.kind == "dma" else self.cycles


def dma_cycles(m: DspMachine, op: Op) -> tuple[int, int, int]:
    """(engine cycles, DDR channel cycles, GSM channel cycles) of one transfer by one core."""
    src, dst = op.path.split("->")
    ddr = op.nbytes / m.ddr_bytes_per_cycle * ((src == "DDR") + (dst == "DDR"))
    gsm = op.nbytes / m.gsm_bytes_per_cycle * ((src == "GSM") + (dst == "GSM"))
    lat = max(m.ddr_latency if "DDR" in (src, dst) else 0, m.gsm_latency if "GSM" in (src, dst) else 0)
    eng = m.dma_startup + lat + op.nbytes / m.dma_bytes_per_cycle + op.nruns * m.dma_row_cycles
    return int(eng), int(np.ceil(ddr)), int(np.ceil(gsm))


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
