"""The simulator shell: what every simulated machine's backend does around its machine.

A machine adds its lowering, its executor, its timing replay and its functional clock, and
nothing else. The backend of a simulated machine (`opcompiler.backend.sim.SimBackend`, a
`Backend` with this mixin) supplies these hooks:

    load_machine(target)          the machine's figures, read from the target description
    offchip_level()               the off-chip `Level` the kernel's tensors live in (capacity 0:
                                  unbounded), or None
    lower(wl, tmpl, cfg)          the lowering: (artifact, build info) of the checked config
    timing(kernel)                the timing replay: a `Timing` (no arithmetic)
    functional(kernel, inputs)    the executor, timed by the functional clock: (outputs, its
                                  `Timing`, extra metrics)
    profile(kernel, t)            the typed `Profile` of a replay (the machine's peak, units,
                                  levels; the one bound rule is `profile.bound_of`)
    report_keys(kernel, t, p)     the machine's own report keys beside the profile's

and the shell does the rest: the off-chip check before any tiling is searched, both clocks in
a functional run's metrics (`functional_cycles`, `timing_cycles`, `clocks_differ`), seconds
from the clock, and the report (`profile.report`: the profile's keys, the machine's, the mode).
`REPORTED_CLOCK` says which clock's replay a functional run reports (its `cycles` and figures):
"functional" (ascend-sim: the execution's own accounting) or "timing" (dsp-sim: the timing
model's figure, which the tuner and the records use, since its core groups may differ from the
per-core functional replay by a few %). Resolving a config and the error a rejected one reports
belong to the backend interface (`opcompiler.backend.sim`).

This module sits below the backends: it imports nothing of `opcompiler.backend`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Iterable, Sequence

from ..errors import CapacityError, OpcError
from .buffers import Level
from .clock import Clocked
from .profile import Profile, Timing, report

__all__ = ["SimShell", "both_clocks", "check_offchip"]


def both_clocks(functional_cycles: int, timing_cycles: int) -> dict[str, Any]:
    """The two clocks of a functional run, side by side; they must agree (`clocks_differ`)."""
    return {"functional_cycles": functional_cycles, "timing_cycles": timing_cycles,
            "clocks_differ": functional_cycles != timing_cycles}


def check_offchip(level: Level | None, sizes: Iterable[tuple[str, int]]) -> None:
    """The kernel's tensors (name, bytes: its inputs and its output) must fit the off-chip level
    together (capacity 0: unbounded); the CapacityError names the largest."""
    sizes = list(sizes)
    total = sum(b for _, b in sizes)
    if level is not None and level.capacity and total > level.capacity:
        name = max(sizes, key=lambda x: x[1])[0]
        raise CapacityError(name, level.name, total, level.capacity,
                            f"the kernel's tensors ({', '.join(n for n, _ in sizes)}) do not fit; "
                            f"use a smaller batch")


class SimShell:
    """run / measure and the report of a simulated machine (see the module docstring); the
    host class provides `target`, `machine` and `result(outputs, seconds, cycles, metrics)`."""

    REPORTED_CLOCK: ClassVar[str] = "functional"
    machine: Clocked

    # -- the machine's hooks ---------------------------------------------------------------

    def offchip_level(self) -> Level | None:
        return None

    def timing(self, kernel: Any) -> Timing:  # pragma: no cover - every machine overrides
        raise NotImplementedError

    def functional(self, kernel: Any, inputs: Sequence[Any]) -> tuple[list, Timing, dict]:  # pragma: no cover
        raise NotImplementedError

    def profile(self, kernel: Any, t: Timing) -> Profile:  # pragma: no cover
        raise NotImplementedError

    def report_keys(self, kernel: Any, t: Timing, p: Profile) -> dict[str, Any]:
        return {}

    # -- the shell -------------------------------------------------------------------------

    def measure(self, kernel: Any, inputs: Sequence[Any] | None = None) -> Any:
        """Timing mode: the machine's timing replay, no arithmetic."""
        return self._result(kernel, self.timing(kernel), None)

    def run(self, kernel: Any, inputs: Sequence[Any]) -> Any:
        """Functional mode: the program executes on simulated memories and is timed by the
        machine's functional clock (its own tables, from what executed); the timing replay runs
        too, and both clocks are in the metrics (`functional_cycles`, `timing_cycles`,
        `clocks_differ`). The reported `cycles` and figures are `REPORTED_CLOCK`'s."""
        outputs, ft, extra = self.functional(kernel, inputs)
        t = self.timing(kernel)
        res = self._result(kernel, ft if self.REPORTED_CLOCK == "functional" else t, outputs)
        res.metrics.update(extra)
        res.metrics.update(both_clocks(ft.cycles, t.cycles))
        return res

    def _result(self, kernel: Any, t: Timing, outputs: list | None) -> Any:
        m = self.machine
        if m.clock_hz <= 0:
            raise OpcError(f"target {self.target.name} has no clock", arg="clock_ghz", value=m.clock_ghz)
        p = self.profile(kernel, t)
        metrics = report(p, self.report_keys(kernel, t, p), functional=outputs is not None)
        return self.result(outputs=outputs, seconds=m.cycles_to_seconds(t.cycles), cycles=t.cycles, metrics=metrics)
