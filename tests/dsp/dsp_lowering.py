"""Test-side helpers for the dsp templates: the program the backend lowers from a template's
`Scheduled` (in either mode), with faults injected into the lowering, and the hand-built VPU
passes and stage streams the retired emitters' reference programs use.

Faults replace the test hooks production code used to carry: a wrong address in one lowered copy
(`tamper(name, view) -> view`, name "src->dst" of the TIR buffers) goes in through the one method
every lowering's copies take (`Lowerer._copy_op`); a rewritten vector kernel (`vtamper(kernel) ->
kernel`) through the one VPU-op helper of the vector lowerings (`VecLowerer._vpu_op`), for the
kernels of the vector nests (not the padding / identity fills)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Hashable, Sequence

from opcompiler.backend.dsp import execute as ex, program as vx, timing as tm
from opcompiler.backend.dsp.lower import lower, lowered_func
from opcompiler.backend.dsp.machine import DspMachine
from opcompiler.backend.dsp.program import Op, stage_order
from opcompiler.backend.dsp.lower.direct import Lowerer
from opcompiler.backend.dsp.lower.vector import VecLowerer

FILLS = ("padding fill", "identity fill")


@contextmanager
def faults(tamper: Callable | None = None, vtamper: Callable | None = None):
    """While inside: every lowered copy's destination view through `tamper`, every vector nest's
    kernel through `vtamper` (each None: untouched)."""
    copy_op = Lowerer.__dict__["_copy_op"]
    vpu_op_ = Lowerer.__dict__["_vpu_op"]
    if tamper is not None:
        def _copy_op(self, bsrc, bdst, src, dst, reads, writes, label):
            return copy_op(self, bsrc, bdst, src, tamper(f"{self.names[bsrc]}->{self.names[bdst]}", dst), reads,
                           writes, label)
        Lowerer._copy_op = _copy_op
    if vtamper is not None:
        def _vpu_op(self, kern, reads, writes, label, cost=None):
            return vpu_op_(self, kern if kern.label in FILLS else vtamper(kern), reads, writes, label, cost)
        VecLowerer._vpu_op = _vpu_op
    try:
        yield
    finally:
        Lowerer._copy_op = copy_op
        if "_vpu_op" in VecLowerer.__dict__:
            del VecLowerer._vpu_op


def program(tmpl, wl, target, cfg, functional: bool = False, tamper: Callable | None = None,
            vtamper: Callable | None = None):
    """The program the dsp backend lowers from `tmpl.apply(wl, target, cfg)`, with the faults."""
    with faults(tamper, vtamper):
        return lower(tmpl.apply(wl, target, cfg), target, functional)


def func(tmpl, wl, target, cfg):
    """The lowered TIR function the backend walks for this config."""
    return lowered_func(tmpl.apply(wl, target, cfg), target)


def vpu_op(m: DspMachine, kernel: vx.VKernel, reads: tuple, writes: tuple, functional: bool, label: str) -> Op:
    """One hand-built VPU pass: cycles from list-scheduling its instructions, values from executing them."""
    cost = tm.kernel_cost(m, kernel)
    fn = (lambda mem, k=kernel: ex.execute_pass(mem, k, m.lanes)) if functional else None
    return Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=writes, cost=cost, nruns=len(kernel.nests), fn=fn,
              label=label)


def fill_kernel(value: float, base: int, shape: tuple[int, int, int], pitches: tuple[int, int], lanes: int,
                label: str) -> vx.VKernel:
    return vx.VKernel(tuple(vx.fill_nests(value, base, shape, pitches, lanes)), label)


def stream(items: Sequence, nbuf: int, functional: bool, stage: Callable[[Any, int, bool], tuple],
           key: Callable[[Any], Hashable], cache: dict) -> list:
    """The stages of one core's items in issue order; `stage(item, slot, first_use_of_slot)` (the
    retired emitters' stage streams)."""
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
