"""`AscendSimBackend`: build a template's program, run it (functional) or time it (timing).

build   resolve_config (the template's check) -> template.apply -> Plan; core 0's program is
        emitted (capacity and alignment are enforced here: CapacityError names buffer, level
        and bytes, and is what a config `check` rejects reports).
run     host-side packing of the inputs into GM layouts, every active core's program executed
        instruction by instruction on simulated memories, output unpacked; cycles from the
        pipe scheduler replaying core 0's program.
measure the same scheduler replay without any arithmetic (timing mode): same cycles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...config import ConfigSpec, InvalidConfig
from ...errors import CapacityError, OpcError
from ...ops import get_op
from ...template_base import Config, Template
from ...workload import Workload
from ..base import Backend, Kernel, RunResult
from .builder import Plan, Program
from .machine import Machine
from . import fclock, scheduler
from .scheduler import Timing, schedule

LAYOUT_NOTE = ("host-side preprocessing (not counted): inputs are packed on the host into the GM layouts "
               "named in gm_layouts and the output is unpacked back")


@dataclass(eq=False)
class Compiled:
    plan: Plan
    program: Program  # core 0's


class AscendSimBackend(Backend):
    """The DaVinci AI Core simulator backend (family "ascend")."""

    family = "ascend"

    def __init__(self, target):
        super().__init__(target)
        self.machine = Machine.from_target(target)
        fclock.bind(self.machine, target)  # the functional replay reads the same file with its own clock

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        self._check_gm(wl)  # first: a workload beyond HBM is refused before any tiling is searched
        try:
            tmpl, cfg = self.resolve(wl, config)
        except InvalidConfig as e:
            raise self._emission_error(wl, e) from None
        plan: Plan = tmpl.apply(wl, self.target, cfg)
        prog = plan.make_program(0)
        info = {"layout_handling": LAYOUT_NOTE, "block_dim": plan.active_cores, "peak_unit": plan.unit,
                "instructions_core0": len(prog.instrs),
                "buffer_high_water": {k: v for k, v in prog.high_water.items() if v}, **plan.info}
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=cfg, artifact=Compiled(plan, prog), info=info)

    def _emission_error(self, wl: Workload, invalid: InvalidConfig) -> OpcError:
        """What emitting the rejected config reports: the builder's CapacityError names the buffer,
        the level and the bytes exactly (`check` is its prefilter). The check's own error when
        emission happens to succeed."""
        tmpl: Template = invalid.template
        cfg: Config = invalid.config
        try:
            tmpl.apply(wl, self.target, cfg).make_program(0)
        except OpcError as e:
            return e
        return invalid

    def _check_gm(self, wl: Workload) -> None:
        """The kernel's inputs and output must fit off-chip memory (checked before emitting code)."""
        m = self.machine
        op = get_op(wl.op)
        sizes = [(name, int(np.prod(shape)) * np.dtype(dt).itemsize) for name, shape, dt in op.inputs(wl)]
        shape, dt = op.output_spec(wl)
        sizes.append(("output", int(np.prod(shape)) * np.dtype(dt).itemsize))
        total = sum(b for _, b in sizes)
        if m.offchip_bytes and total > m.offchip_bytes:
            name = max(sizes, key=lambda x: x[1])[0]
            raise CapacityError(name, m.offchip_name, total, m.offchip_bytes,
                                f"the kernel's tensors ({', '.join(n for n, _ in sizes)}) do not fit; "
                                f"use a smaller batch")

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        comp: Compiled = kernel.artifact
        t = schedule(comp.program)
        return self._result(kernel, t, None)

    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        """Functional mode: every active core's program executes; core 0's cycles come from the
        functional replay's own clock (what the execution read, wrote and did, costed by
        `fclock`'s tables: `scheduler.replay`), not from the timing scheduler. Both clocks are
        reported (`functional_cycles`, `timing_cycles`); they must be equal, and `clocks_differ`
        says when they are not."""
        comp: Compiled = kernel.artifact
        out, t = scheduler.run(comp.plan, comp.program, inputs)
        res = self._result(kernel, t, [out])
        timed = schedule(comp.program).cycles
        res.metrics["functional_cycles"], res.metrics["timing_cycles"] = t.cycles, timed
        res.metrics["clocks_differ"] = t.cycles != timed
        return res

    # -- reporting ----------------------------------------------------------------------------

    def _result(self, kernel: Kernel, t: Timing, outputs: list[np.ndarray] | None) -> RunResult:
        m, tgt = self.machine, self.target
        if tgt.clock_ghz <= 0:
            raise OpcError(f"target {tgt.name} has no clock", arg="clock_ghz", value=tgt.clock_ghz)
        metrics = scheduler.report(m, kernel.artifact.plan, t, kernel.workload.dtype, outputs is not None)
        seconds = m.cycles_to_seconds(t.cycles)
        return RunResult(outputs=outputs, seconds=seconds, cycles=t.cycles, metrics=metrics)
