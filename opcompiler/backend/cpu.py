"""The host CPU through LLVM: build with `tvm.compile`, run, time (warm-up, median of repeats)."""
from __future__ import annotations

import os
import statistics
from functools import cache
from typing import Any, Mapping, Sequence

import numpy as np
import tvm

from ..ops import get_op
from ..workload import Workload
from . import Backend, Kernel, RunResult, device_args


@cache
def llvm_target() -> tvm.target.Target:
    """The host as LLVM sees it (mcpu asked of LLVM, never hard-coded), all cores."""
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    spec: dict[str, Any] = {"kind": "llvm", "num-cores": os.cpu_count() or 1}
    if cpu and cpu != "generic":
        spec["mcpu"] = cpu
    return tvm.target.Target(spec)


def vector_lanes(dtype: str = "float32") -> int:
    """SIMD lanes for `dtype` on the host, from LLVM's vector width for the detected CPU."""
    try:
        bits = int(tvm.target.codegen.llvm_get_vector_width(llvm_target()))
    except Exception:  # an LLVM without the query: assume SSE
        bits = 128
    return max(bits // (np.dtype(dtype).itemsize * 8), 1)


class CpuBackend(Backend):
    family = "cpu"
    repeats = 10
    min_repeat_ms = 5  # tiny kernels repeat inside one measurement so timer overhead does not dominate

    def build(self, wl: Workload, config: Mapping[str, Any] | None = None) -> Kernel:
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
