"""`AscendSimBackend`: the DaVinci AI Core on the simulator shell (`opcompiler.backend.sim`).

What the machine adds: its figures (`Machine.from_target`), its lowering (template.apply ->
Plan; core 0's program is emitted, capacity and alignment enforced: CapacityError names buffer,
level and bytes), the lowering's capacity dry-run (`lower.fit`: what a config `check` rejects
reports, without lowering it: `EMISSION_ERRORS`), its executor
(host-side packing of the inputs into GM layouts, every active core's program executed
instruction by instruction on simulated memories, output unpacked) timed by its functional
clock (`scheduler.replay`: `fclock`'s tables), and its timing replay (the pipe scheduler over
core 0's program, no arithmetic: same cycles). A functional run reports the functional clock.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...sim.buffers import Level
from ...sim.profile import Profile
from ...template_base import Config, Template
from ...workload import Workload
from ..sim import SimBackend
from .builder import Plan, Program
from .lower import fit, lower as lower_scheduled  # a template's Scheduled -> Plan
from .machine import Machine
from . import fclock, scheduler
from .scheduler import Timing, schedule

LAYOUT_NOTE = ("host-side preprocessing (not counted): inputs are packed on the host into the GM layouts "
               "named in gm_layouts and the output is unpacked back")


@dataclass(eq=False)
class Compiled:
    plan: Plan
    program: Program  # core 0's


class AscendSimBackend(SimBackend):
    """The DaVinci AI Core simulator backend (family "ascend")."""

    family = "ascend"
    EMISSION_ERRORS = True  # a rejected config reports the dry-run's CapacityError (buffer, level, bytes)
    REPORTED_CLOCK = "functional"

    def load_machine(self, target) -> Machine:
        m = Machine.from_target(target)
        fclock.bind(m, target)  # the functional replay reads the same file with its own clock
        return m

    def offchip_level(self) -> Level:
        m = self.machine
        return Level(name=m.offchip_name, capacity=m.offchip_bytes, alignment=1)

    def lower(self, wl: Workload, tmpl: Template, cfg: Config) -> tuple[Compiled, dict]:
        plan: Plan = lower_scheduled(tmpl.apply(wl, self.target, cfg), self.machine)
        prog = plan.make_program(0)
        info = {"layout_handling": LAYOUT_NOTE, "block_dim": plan.active_cores, "peak_unit": plan.unit,
                "instructions_core0": len(prog.instrs),
                "buffer_high_water": {k: v for k, v in prog.high_water.items() if v}, **plan.info}
        return Compiled(plan, prog), info

    def dry_run(self, scheduled) -> None:
        fit(scheduled, self.machine)

    def timing(self, kernel) -> Timing:
        return schedule(kernel.artifact.program)

    def functional(self, kernel, inputs) -> tuple[list, Timing, dict]:
        """Every active core's program executes; core 0's cycles come from the functional
        replay's own clock (what the execution read, wrote and did, costed by `fclock`'s tables:
        `scheduler.replay`), not from the timing scheduler."""
        comp: Compiled = kernel.artifact
        out, t = scheduler.run(comp.plan, comp.program, inputs)
        return [out], t, {}

    def profile(self, kernel, t: Timing) -> Profile:
        return scheduler.profile(self.machine, kernel.artifact.plan, t, kernel.workload.dtype)

    def report_keys(self, kernel, t: Timing, p: Profile) -> dict:
        return scheduler.report_keys(kernel.artifact.plan, t, p)
