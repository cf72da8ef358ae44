"""Shared by the dsp templates whose VPU passes are spelled out as vector instructions
(`opcompiler.backend.dsp.vector`): pooling, grouped convolution, element-wise chains, softmax,
reductions, concat.

Each such template cuts its work into items, gives every core a contiguous share of them
(`cores` knob: how many cores take part), and lowers each item to one stage: DMA-in (DDR ->
AM / SM) plus constant fills, one VPU pass, DMA-out; with `dbuf` two buffers alternate and the
next stage's DMA-in is issued before this stage's VPU pass (`direct.stage_order`). In timing mode
stages with the same key share their Op objects (so repeated stages compress), and cores with
the same sequence of keys are simulated once with a multiplicity.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from opcompiler.backend.dsp import vector as vx
from opcompiler.backend.dsp.machine import DspMachine
from opcompiler.backend.dsp.program import Op
from opcompiler.template_base import Knob

from opcompiler.backend.dsp.program import stage_order


def cores_knob(m: DspMachine) -> Knob:
    vals = tuple(v for v in (8, 4, 2, 1) if v <= m.cores)
    if m.cores not in vals:
        vals = (m.cores,) + vals
    return Knob("cores", vals, "cores the items are split over (contiguous shares)")


def share(items: Sequence, ncores: int, total_cores: int) -> list[list]:
    """Contiguous, balanced shares of the items for the first `ncores` cores; the rest idle."""
    k = max(1, min(ncores, total_cores))
    out = [list(items[c * len(items) // k:(c + 1) * len(items) // k]) for c in range(k)]
    return out + [[] for _ in range(total_cores - k)]


def vpu_op(m: DspMachine, kernel: vx.VKernel, reads: tuple, writes: tuple, functional: bool, label: str) -> Op:
    """One VPU pass: cycles from list-scheduling its instructions, values from executing them."""
    cost = vx.kernel_cost(m, kernel)
    fn = (lambda mem, k=kernel: vx.execute(mem, k, m.lanes)) if functional else None
    return Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=writes, cost=cost, nruns=len(kernel.nests), fn=fn,
              label=label)


def stream(items: Sequence, nbuf: int, functional: bool, stage: Callable[[Any, int, bool], tuple],
           key: Callable[[Any], Hashable], cache: dict) -> list:
    """The stages of one core's items in issue order; `stage(item, slot, first_use_of_slot)`."""
    stages = []
    for i, it in enumerate(items):
        slot, first = i % nbuf, i < nbuf
        if functional:
            stages.append(stage(it, slot, first))
            continue
        k = (slot, first, key(it))
        if k not in cache:
            cache[k] = stage(it, slot, first)
        stages.append(cache[k])
    return stage_order(stages, nbuf > 1, functional)


def group_key(items: Sequence, key: Callable[[Any], Hashable]) -> Hashable:
    return tuple(key(it) for it in items)


def fill_kernel(value: float, base: int, shape: tuple[int, int, int], pitches: tuple[int, int], lanes: int,
                label: str) -> vx.VKernel:
    return vx.VKernel(tuple(vx.fill_nests(value, base, shape, pitches, lanes)), label)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
