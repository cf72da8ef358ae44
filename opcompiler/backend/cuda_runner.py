"""The CUDA backend's runner: the process that owns one GPU's CUDA context loads each exported
kernel library, checks it against the op's numpy reference when asked, and times it.

Tuning (`opcompiler.tune.gpu_runner`) keeps that process and the build processes feeding it;
what touches the GPU, and what a build process must leave untouched, is here, beside the backend
that builds the libraries:

- `export_kernel` writes a built kernel's library where the runner loads it;
- `cuda_state` says what a build process did with CUDA (it must never initialise it);
- `CudaRunner.run` loads, verifies and times one library (raising as `Backend.run` does);
- `is_cuda_error` tells an error that poisons the CUDA context (the runner must be replaced).
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import device
from ..errors import OpcError
from ..settings import visible_devices
from ..target import Target
from ..verify import compare
from ..workload import Workload
from .base import device_args

# a CUDA error in these words leaves the context unusable: the runner must be replaced
_CUDA_ERROR_WORDS = ("cuda", "illegal memory access", "illegal address", "misaligned address",
                     "unspecified launch failure", "launch timeout", "an illegal instruction")


def is_cuda_error(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in _CUDA_ERROR_WORDS)


def export_kernel(kernel: Any, path: str) -> str:
    """Write the kernel's library where the runner loads it; returns the entry function's name."""
    art = kernel.artifact
    if hasattr(art, "export_library"):
        art.export_library(path)
        mod = getattr(art, "mod", art)
        return str(getattr(mod, "entry_name", "") or "main")
    import json  # a test double's artifact: its config, for a fake runner
    with open(path, "w") as f:
        json.dump({"config": kernel.config, "artifact": repr(art)}, f)
    return "main"


def cuda_state() -> dict[str, Any]:
    """What a build process did with CUDA, for the parent to check. (TVM's FFI imports torch when it
    is installed, torch.cuda included: importing is not initialising, `torch.cuda.is_initialized()` is.)"""
    torch = sys.modules.get("torch")
    initialised = bool(torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized())
    return {"cuda_touched": device.cuda_touched(), "cuda_initialised": initialised,
            "cuda_python_modules": tuple(sorted(m for m in sys.modules if m.startswith("cuda.bindings"))),
            "cuda_visible_devices": visible_devices()}


@dataclass(kw_only=True)
class Timed:
    """One library run: its median time, or `wrong` (why its result is wrong: then not timed)."""

    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)  # max_abs_err when verified, then the roofline's
    wrong: str = ""


class CudaRunner:
    """Owns the CUDA context of GPU `gpu` (in the runner process); `repeat` timings of at least
    `min_repeat_ms` each, the median kept."""

    def __init__(self, target: Target, gpu: int = 0, number: int = 1, repeat: int = 5, min_repeat_ms: int = 20):
        import tvm

        from .cuda import check_servable, install_compile_hook, tvm_cuda_target
        if not device.has_gpu():
            raise OpcError("no CUDA GPU visible to the runner process")
        check_servable(target)
        install_compile_hook()  # a module that still holds CUDA source is compiled for its target's arch
        self.target, self.number, self.repeat, self.min_repeat_ms = target, number, repeat, min_repeat_ms
        self.tvm = tvm
        self.dev = tvm.cuda(gpu)
        self.tvm_target = tvm_cuda_target(target)
        self._inputs: dict[tuple, tuple[list, list]] = {}  # (workload, seed) -> (numpy inputs, device inputs)

    def _args(self, wl: Workload, seed: int) -> tuple[list, list]:
        """The candidates of one workload share their inputs (made and copied to the GPU once); each
        gets a fresh zeroed output, so a kernel that skips part of it cannot pass on another's values."""
        import numpy as np

        from ..ops import get_op
        key = (wl, seed)
        if key not in self._inputs:
            inputs = get_op(wl.op).make_inputs(wl, seed)
            self._inputs = {key: (inputs, device_args(wl, inputs, self.dev)[:-1])}
        inputs, dev_in = self._inputs[key]
        shape, dt = get_op(wl.op).output_spec(wl)
        return inputs, [*dev_in, self.tvm.runtime.tensor(np.zeros(shape, dtype=dt), self.dev)]

    def run(self, wl: Workload, path: str, entry: str = "main", verify: bool = False, seed: int = 0) -> Timed:
        """Load the library at `path`, run it once, check it (`verify`) and time it. Raises what
        loading or running raised (`is_cuda_error` says whether the context survived)."""
        from ..ops import get_op
        from .cuda import cuda_metrics
        tvm, dev = self.tvm, self.dev
        with self.tvm_target:
            mod = tvm.runtime.load_module(path)
        op = get_op(wl.op)
        inputs, args = self._args(wl, seed)
        mod[entry](*args)  # first launch: loads the module on the GPU, runs it once
        dev.sync()
        metrics: dict[str, Any] = {}
        if verify:
            ok, err = compare(args[-1].numpy(), op.reference(wl, inputs))
            metrics["max_abs_err"] = err
            if not ok:
                return Timed(metrics=metrics, wrong=f"wrong result: max abs error {err:.3g} beyond tolerance")
        timer = mod.time_evaluator(entry, dev, number=self.number, repeat=self.repeat,
                                   min_repeat_ms=self.min_repeat_ms)
        secs = float(statistics.median(timer(*args).results))
        if secs > 0:
            metrics.update(cuda_metrics(self.target, wl, secs))
        return Timed(seconds=secs, metrics=metrics)
