"""Assembling a cluster program from per-core op lists: layout changes, host work, core groups.

Used by the backend's lowering (`lower/__init__.py`) for every DSP template. Layout changes (NCHW <-> NHWC, transposed matmul operands) are
DDR -> DDR DMA transposes done by the cores before / after the main part and counted like any
transfer (element-granular runs make them slow, as on the chip). The host's part is the call
overhead, the CPU <-> DSP copies of copy mode (seed 004 §2.2.2) and host-side replication.
In timing mode cores whose op lists are the same up to addresses are simulated once, with a
multiplicity; functional mode keeps one list per core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from ..machine import DspMachine
from ..program import F32, Op, Program, View, contiguous, dma_op


@dataclass(frozen=True)
class Relayout:
    """DDR tensor `src` read through `strides` (elements) into contiguous `dst` of `shape`,
    split along axis 0 across the cores (or done by core 0 only when `leader_only`)."""

    src: str
    dst: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    leader_only: bool = False


def relayout_ops(m: DspMachine, rl: Relayout, core: int, cores: int, functional: bool) -> list[Op]:
    if rl.leader_only:
        lo, hi = (0, rl.shape[0]) if core == 0 else (0, 0)
    else:
        lo, hi = core * rl.shape[0] // cores, (core + 1) * rl.shape[0] // cores
    if hi <= lo:
        return []
    shape = (hi - lo,) + tuple(rl.shape[1:])
    inner = int(np.prod(rl.shape[1:]))
    src = View(("DDR", rl.src), lo * rl.strides[0], shape, rl.strides)
    dst = contiguous(("DDR", rl.dst), lo * inner, shape)
    return [dma_op(m, src, dst, (), ("relayout",), functional, f"relayout {rl.src}->{rl.dst}")]


def host_ops(m: DspMachine, copies_in: list[tuple[str, int]], copies_out: list[tuple[str, int]],
             replicate: list[tuple[str, int]]) -> tuple[list, list]:
    """(host_pre, host_post) as (what, cycles, bytes) for the call, copy mode and replication."""
    def copy(what: str, nbytes: int) -> tuple[str, int, int]:
        return (what, int(m.host_copy_overhead_cycles + nbytes / m.host_copy_bytes_per_cycle), nbytes)

    def replicate_one(what: str, nbytes: int) -> tuple[str, int, int]:
        if not m.host_replicate_bytes_per_cycle:  # the target gives replication no rate of its own
            return copy(what, nbytes)
        return (what, int(m.host_replicate_overhead_cycles + nbytes / m.host_replicate_bytes_per_cycle), nbytes)
    pre = [("launch", m.launch_cycles, 0)]
    post: list[tuple[str, int, int]] = []
    if m.data_mode == "copy":
        pre += [copy(f"copy {n} CPU->DSP", b) for n, b in copies_in]
        post += [copy(f"copy {n} DSP->CPU", b) for n, b in copies_out]
    pre += [replicate_one(f"replicate {n}", b) for n, b in replicate]
    return pre, post


def assemble(m: DspMachine, *, functional: bool, cores: int,
             core_ops: Callable[[int], list[Op]], group_key: Callable[[int], Hashable],
             pre: list[Relayout], post: list[Relayout], **program: Any) -> Program:
    """One Program: per core [pre relayouts, barrier, main ops, barrier, post relayouts]."""
    def full(c: int) -> list[Op]:
        ops: list[Op] = []
        for rl in pre:
            ops += relayout_ops(m, rl, c, cores, functional)
        if pre:
            ops.append(Op("barrier", "sync", label="inputs relaid"))
        ops += core_ops(c)
        if post:
            ops.append(Op("barrier", "sync", label="outputs complete"))
            for rl in post:
                ops += relayout_ops(m, rl, c, cores, functional)
        return ops

    if functional:
        lists, mult = [full(c) for c in range(cores)], [1] * cores
    else:
        groups: dict[Hashable, list[int]] = {}
        for c in range(cores):
            key = (group_key(c), tuple(rl.leader_only and c == 0 for rl in pre + post),
                   tuple(len(relayout_ops(m, rl, c, cores, False)) and
                         (c + 1) * rl.shape[0] // cores - c * rl.shape[0] // cores for rl in pre + post))
            groups.setdefault(key, []).append(c)
        lists = [full(cs[0]) for cs in groups.values()]
        mult = [len(cs) for cs in groups.values()]
    return Program(cores=lists, multiplicity=mult, **program)


def nbytes(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) * F32
