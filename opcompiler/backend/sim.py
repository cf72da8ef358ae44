"""`SimBackend`: the one backend shell of the simulated machines (ascend-sim, dsp-sim).

build   `resolve` (once: the off-chip check, `check_offchip`, where the kernel's tensors must fit
        the machine's off-chip level before any tiling is searched; then the template's check),
        then the machine's lowering. A config the check rejects is never lowered: on a machine
        that has a capacity dry-run (`dry_run`, `EMISSION_ERRORS`) it reports the dry-run's
        CapacityError, which names buffer, level and bytes exactly (`check` is its prefilter);
        the check's own error when the dry-run happens to pass.
run     functional mode, measure timing mode, and the report: `opcompiler.sim.shell.SimShell`.

A machine's backend is a small subclass that names its family and supplies the hooks listed in
`opcompiler.sim.shell` (its machine, lowering, executor, timing replay, functional clock,
profile and report keys).
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..config import Choice, ConfigSpec, InvalidConfig
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

    def dry_run(self, scheduled: Any) -> None:
        """The capacity dry-run of a template's scheduled config (what `apply` returned), without
        lowering it: raises the machine's CapacityError. Machines with `EMISSION_ERRORS` define it."""

    # -- the shell -------------------------------------------------------------------------

    def build(self, wl: Workload, config: ConfigSpec | Choice = None) -> Kernel:
        chosen = self.resolve(wl, config)
        tmpl, cfg = chosen.template, chosen.config
        artifact, info = self.lower(wl, tmpl, cfg)
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=dict(cfg), artifact=artifact, info=info)

    def resolve(self, wl: Workload, config: ConfigSpec | Choice) -> Choice:
        try:
            return super().resolve(wl, config)
        except InvalidConfig as e:
            if not self.EMISSION_ERRORS:
                raise
            raise self._dry_run_error(wl, e) from None

    def result(self, *, outputs: list[np.ndarray] | None, seconds: float, cycles: int,
               metrics: dict[str, Any]) -> RunResult:
        return RunResult(outputs=outputs, seconds=seconds, cycles=cycles, metrics=metrics)

    def _dry_run_error(self, wl: Workload, invalid: InvalidConfig) -> OpcError:
        """What a rejected config reports: the dry-run's CapacityError, else the check's error."""
        try:
            self.dry_run(invalid.template.apply(wl, self.target, invalid.config))
        except OpcError as e:
            return e
        return invalid

    def check_offchip(self, wl: Workload) -> None:
        """The kernel's tensors (inputs and output) must fit the machine's off-chip level together;
        an off-chip level the model leaves unbounded: the host's memory (`Backend.check_offchip`)."""
        level = self.offchip_level()
        if level is None or not level.capacity:
            super().check_offchip(wl)
            return
        op = get_op(wl.op)
        sizes = [(name, int(np.prod(shape)) * np.dtype(dt).itemsize) for name, shape, dt in op.inputs(wl)]
        shape, dt = op.output_spec(wl)
        sizes.append(("output", int(np.prod(shape)) * np.dtype(dt).itemsize))
        check_offchip(level, sizes)
