"""DspSimBackend: the FT-M7032 DSP cluster on the simulator shell (`opcompiler.backend.sim`)."""
from __future__ import annotations

from ...sim.buffers import Level
from ...sim.profile import Profile
from ...template_base import Config, Template
from ...workload import Workload
from ..sim import SimBackend
from . import fclock
from .lower import lower as lower_scheduled  # a template's Scheduled -> Program
from .timing import Timing, profile, report_keys, timing
from .machine import DspMachine, machine


class DspSimBackend(SimBackend):
    """The FT-M7032 DSP cluster simulator (`--target dsp-sim`).

    Its lowering turns the template's schedule into a program of DMA transfers and VPU passes for
    each core (capacities enforced: CapacityError); its executor runs the functional program on
    simulated memories (real values), timed by its own clock (`fclock.replay`: its own tables read
    from the target, costs from what executed, never the timing model's); its timing replay
    (`timing.timing`) runs identical cores as one group. A functional run reports the timing
    model's cycles (the tuner's and the records' figure); both clocks are in the metrics.
    """

    family = "dsp"
    REPORTED_CLOCK = "timing"

    def load_machine(self, target) -> DspMachine:
        return machine(target)

    def offchip_level(self) -> Level:
        return self.machine.level("DDR")

    def lower(self, wl: Workload, tmpl: Template, cfg: Config) -> tuple[dict, dict]:
        m = self.machine
        sched = tmpl.apply(wl, self.target, cfg)  # the scheduled module; this backend lowers it
        prog = lower_scheduled(sched, self.target, functional=False)  # timing program: validates capacities, fast
        info = {"data_mode": m.data_mode, "cores_used": prog.cores_used, **prog.info}
        return {"template": tmpl, "scheduled": sched, "program": prog}, info

    def timing(self, kernel) -> Timing:
        return timing(self.machine, kernel.artifact["program"])

    def functional(self, kernel, inputs) -> tuple[list, Timing, dict]:
        m = self.machine
        sched = kernel.artifact["scheduled"]  # the scheduled module `lower` built (the same TIR)
        fprog = lower_scheduled(sched, self.target, functional=True)
        out, counters, ft = fclock.replay(m, fprog, inputs, fclock.clock(self.target))
        return [out], ft, {"functional_counters": counters.as_dict()}

    def profile(self, kernel, t: Timing) -> Profile:
        return profile(self.machine, kernel.artifact["program"], t)

    def report_keys(self, kernel, t: Timing, p: Profile) -> dict:
        return report_keys(self.machine, kernel.artifact["program"], t, p)
