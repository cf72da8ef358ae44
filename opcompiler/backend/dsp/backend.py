"""DspSimBackend: build a DSP template's lowered program, run it (values + cycles) or time it."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...config import ConfigSpec
from ...workload import Workload
from ..base import Backend, Kernel, RunResult
from . import fclock
from .engine import Timing, report, timing
from .machine import machine


class DspSimBackend(Backend):
    """The FT-M7032 DSP cluster simulator (`--target dsp-sim`).

    `build` lowers the template's schedule into a program of DMA transfers and VPU passes for
    each core (capacities enforced: CapacityError); `run` executes it on simulated memories
    (functional: real values) and times it; `measure` times it only. Both give the same cycles.
    """

    family = "dsp"

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        m = machine(self.target)
        tmpl, cfg = self.resolve(wl, config)
        prog = tmpl.apply(wl, self.target, cfg)  # timing program: validates capacities, fast
        info = {"data_mode": m.data_mode, "cores_used": prog.cores_used, **prog.info}
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=dict(cfg), artifact={"template": tmpl, "program": prog}, info=info)

    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        """Functional mode: the functional program executes on simulated memories and is timed
        by its own clock (`fclock.replay`: its own tables read from the target, costs from what
        executed, never the timing model's); the reported `cycles` stay the timing model's (the
        tuner's and the records' figure), which runs identical cores as one group. Both clocks
        are in the metrics (`functional_cycles`, `timing_cycles`), with `clocks_differ`."""
        m = machine(self.target)
        tmpl = kernel.artifact["template"]
        fprog = tmpl.apply(kernel.workload, self.target, kernel.config, functional=True)
        out, counters, ft = fclock.replay(m, fprog, inputs, fclock.clock(self.target))
        t = timing(m, kernel.artifact["program"])
        res = self._result(kernel, t, [out])
        res.metrics["functional_counters"] = counters.as_dict()
        res.metrics["functional_cycles"], res.metrics["timing_cycles"] = ft.cycles, t.cycles
        res.metrics["clocks_differ"] = ft.cycles != t.cycles
        return res

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        return self._result(kernel, timing(machine(self.target), kernel.artifact["program"]), None)

    def _result(self, kernel: Kernel, t: Timing, outputs: list[np.ndarray] | None) -> RunResult:
        m = machine(self.target)
        metrics = report(m, kernel.artifact["program"], t)
        seconds = t.cycles / m.clock_hz
        return RunResult(outputs=outputs, seconds=seconds, cycles=t.cycles, metrics=metrics)
