"""DspSimBackend: build a DSP template's lowered program, run it (values + cycles) or time it."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...config import ConfigSpec
from ...errors import OpcFailure
from ...workload import Workload
from ..base import Backend, Kernel, RunResult
from .engine import Timing, execute, timing
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
        m = machine(self.target)
        tmpl = kernel.artifact["template"]
        fprog = tmpl.apply(kernel.workload, self.target, kernel.config, functional=True)
        out, counters = execute(m, fprog, inputs)
        t = timing(m, kernel.artifact["program"])
        res = self._result(kernel, t, [out])
        res.metrics["functional_counters"] = counters.as_dict()
        if hasattr(tmpl, "tir_check"):
            tiles = tmpl.tir_check(kernel.workload, self.target, kernel.config)
            if tiles is not None:
                if not tiles["match"]:
                    raise OpcFailure(f"the DSP program's tiles {tiles['program']} differ from the TVM schedule's "
                                     f"{tiles['tir']} for config {kernel.config}")
                res.metrics["tir_tiles"] = tiles["tir"]
        return res

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        return self._result(kernel, timing(machine(self.target), kernel.artifact["program"]), None)

    def _result(self, kernel: Kernel, t: Timing, outputs: list[np.ndarray] | None) -> RunResult:
        m = machine(self.target)
        prog = kernel.artifact["program"]
        seconds = t.cycles / m.clock_hz
        peak = m.peak_flops * m.cores
        gflops = prog.flops / seconds / 1e9 if seconds else 0.0
        cyc = max(t.cycles, 1)
        share = {
            "host (launch + copies)": t.host_cycles / cyc,
            "FMAC": t.busy.get("fmac", 0.0) / (m.cores * cyc),
            "VPU issue": t.busy.get("vpu", 0.0) / (m.cores * cyc),
            "DDR bandwidth": t.busy.get("ddr", 0.0) / cyc,
            "GSM bandwidth": t.busy.get("gsm", 0.0) / cyc,
            "DMA engines": t.busy.get("dma", 0.0) / (m.cores * cyc),
        }
        bound = max(share, key=share.get)
        if bound == "VPU issue" and share["FMAC"] >= 0.9 * share["VPU issue"]:
            bound = "FMAC"  # the VPU is busy and almost every cycle issues its 3 FMAs
        elif bound == "VPU issue":
            bound = "VPU issue (FMAC latency / loads)"
        metrics = {
            "percent_of_peak": 100.0 * gflops * 1e9 / peak if peak else 0.0,
            "gflops": gflops,
            "bound": bound,
            "busy_ratios": {k: round(v, 4) for k, v in share.items()},
            "pipe_ratios": {k: round(v, 4) for k, v in share.items()},  # printed by `opcompiler run`
            "fmac_utilization": t.busy.get("fmac", 0.0) / (m.cores * cyc),
            "bytes_by_level": dict(t.counters.bytes_by_level),
            "counters": t.counters.as_dict(),
            "dsp_cycles": t.dsp_cycles, "host_cycles": t.host_cycles,
            "data_mode": m.data_mode, "cores_used": prog.cores_used,
        }
        return RunResult(outputs=outputs, seconds=seconds, cycles=t.cycles, metrics=metrics)
