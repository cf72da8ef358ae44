"""The instruction protocol both machines' ISAs implement.

An instruction names the unit (pipe) that executes it, the buffers (or buffer tags) it reads
and writes -- the scoreboard orders instructions by these -- its cost in cycles for a machine (`cost_cycles`),
and how to execute itself on simulated memories (functional mode). Timing mode never calls
`execute`; functional mode never needs the scoreboard.
"""
from __future__ import annotations

from typing import Any


class Instruction:
    """Base of Ascend's `program.Instr` and the DSP's `program.Op` (attributes set by subclasses)."""

    __slots__ = ()
    pipe: str
    reads: tuple
    writes: tuple
    cycles: int

    @property
    def unit(self) -> str:
        return self.pipe

    def cost_cycles(self, machine: Any, **rates: float) -> int:
        """Its cost: cycles on its unit for `machine` (the ISA's cost model; by default the
        fixed `cycles`). Shared-bandwidth rates a scheduler found are passed as `rates`."""
        return self.cycles

    def execute(self, mem: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError(f"{type(self).__name__} has no functional semantics")
