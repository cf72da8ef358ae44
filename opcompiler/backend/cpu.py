"""The host CPU through LLVM: build with `tvm.compile`, run, time (warm-up, median of repeats)."""
from __future__ import annotations

import statistics
from typing import Sequence

import numpy as np
import tvm

from ..config import ConfigSpec
from ..ops import get_op
from ..workload import Workload
from .base import Backend, Kernel, RunResult, device_args
from .cpu_intrin import llvm_target, vector_lanes  # noqa: F401  (re-exported: callers import them from here)


class CpuBackend(Backend):
    family = "cpu"
    repeats = 10
    min_repeat_ms = 5  # tiny kernels repeat inside one measurement so timer overhead does not dominate

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        tmpl, cfg, mod = self.schedule(wl, config)
        ex = tvm.compile(mod, target=llvm_target())
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=cfg, artifact=ex)

    def _args(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> list:
        return device_args(kernel.workload, inputs, tvm.cpu())

    def _time(self, kernel: Kernel, args: list) -> float:
        ex = kernel.artifact
        f = ex.mod.time_evaluator(ex.mod.entry_name, tvm.cpu(), number=1, repeat=self.repeats,
                                  min_repeat_ms=self.min_repeat_ms)
        ex(*args)  # warm-up
        return float(statistics.median(f(*args).results))

    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        args = self._args(kernel, inputs)
        kernel.artifact(*args)
        out = args[-1].numpy()
        secs = self._time(kernel, args)
        return RunResult(outputs=[out], seconds=secs)

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        if inputs is None:
            inputs = get_op(kernel.workload.op).make_inputs(kernel.workload)
        args = self._args(kernel, inputs)
        return RunResult(outputs=None, seconds=self._time(kernel, args))
