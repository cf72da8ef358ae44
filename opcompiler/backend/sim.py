"""`SimBackend`: the one backend shell of the simulated machines (ascend-sim, dsp-sim).

build   the off-chip check (the kernel's tensors must fit off-chip memory: before any tiling
        is searched), `resolve` (the template's check), then the machine's lowering. A config
        the check rejects reports, on a machine that asks for it (`EMISSION_ERRORS`), what
        emitting it reports: the lowering's CapacityError names buffer, level and bytes exactly
        (`check` is its prefilter); the check's own error when emission happens to succeed.
run     functional mode, measure timing mode, and the report: `opcompiler.sim.shell.SimShell`.

A machine's backend is a small subclass that names its family and supplies the hooks listed in
`opcompiler.sim.shell` (its machine, lowering, executor, timing replay, functional clock,
profile and report keys).
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..config import ConfigSpec, InvalidConfig
from ..errors import OpcError
from ..ops import get_op
from ..sim.clock import Clocked
from ..sim.shell import SimShell, check_offchip
from ..template_base import Config, Template
from ..workload import Workload
from .base import Backend, Kernel, RunResult

__all__ = ["SimBackend"]


class SimBackend(SimShell, Backend):
    """A simulated machine's build / run / measure (see the module docstring)."""

    EMISSION_ERRORS: ClassVar[bool] = False

    def __init__(self, target):
        super().__init__(target)
        self.machine = self.load_machine(target)

    # -- the machine's hooks (besides `opcompiler.sim.shell.SimShell`'s) -------------------

    def load_machine(self, target) -> Clocked:  # pragma: no cover - every machine overrides
        raise NotImplementedError

    def lower(self, wl: Workload, tmpl: Template, cfg: Config) -> tuple[Any, dict[str, Any]]:  # pragma: no cover
        """(artifact, build info) of the checked config; capacities enforced (CapacityError)."""
        raise NotImplementedError

    # -- the shell -------------------------------------------------------------------------

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        self._check_offchip(wl)  # first: a workload beyond off-chip memory is refused before any tiling is searched
        try:
            tmpl, cfg = self.resolve(wl, config)
        except InvalidConfig as e:
            if not self.EMISSION_ERRORS:
                raise
            raise self._emission_error(wl, e) from None
        artifact, info = self.lower(wl, tmpl, cfg)
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=dict(cfg), artifact=artifact, info=info)

    def result(self, *, outputs: list[np.ndarray] | None, seconds: float, cycles: int,
               metrics: dict[str, Any]) -> RunResult:
        return RunResult(outputs=outputs, seconds=seconds, cycles=cycles, metrics=metrics)

    def _emission_error(self, wl: Workload, invalid: InvalidConfig) -> OpcError:
        try:
            self.lower(wl, invalid.template, invalid.config)
        except OpcError as e:
            return e
        return invalid

    def _check_offchip(self, wl: Workload) -> None:
        level = self.offchip_level()
        if level is None or not level.capacity:
            return  # unbounded
        op = get_op(wl.op)
        sizes = [(name, int(np.prod(shape)) * np.dtype(dt).itemsize) for name, shape, dt in op.inputs(wl)]
        shape, dt = op.output_spec(wl)
        sizes.append(("output", int(np.prod(shape)) * np.dtype(dt).itemsize))
        check_offchip(level, sizes)
