"""Test doubles for GPU measurement on machines without a GPU, chosen through the specs'
`factory` ("module:callable") like any runner or backend: `FAKE_RUNNER` "times" a built file by
its config and misbehaves on poisoned ones, `FAKE_BUILDER` "builds" any config instantly."""
from __future__ import annotations

import os
import time
from typing import Any, Mapping

from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.tune.gpu_runner import MeasureResult, RunnerSpec, RunTask, is_cuda_error
from opcompiler.tune.process import _one_line
from opcompiler.workload import Workload

RUNNER_FACTORY = f"{__name__}:fake_runner"
BUILDER_FACTORY = f"{__name__}:fake_builder"


class FakeRunner:
    """A runner that "times" a built file by its config. Config `{"poison": "exit"}` kills the
    process (a kernel that takes the runner down), `"cuda"` raises a CUDA error that poisons the
    context, `"hang"` sleeps past any timeout."""

    def __init__(self, spec: RunnerSpec):
        self.spec = spec

    def run(self, task: RunTask) -> tuple[MeasureResult, bool]:
        poison = task.config.get("poison")
        if poison == "exit":
            os._exit(7)
        if poison == "hang":
            time.sleep(3600)
        if poison == "cuda":
            e = RuntimeError("CUDA: an illegal memory access was encountered")
            return MeasureResult(status="crash", error=f"run: {_one_line(e)}"), is_cuda_error(e)
        if not os.path.isfile(task.path) or os.path.getsize(task.path) == 0:
            return MeasureResult(status="crash", error=f"no library at {task.path}"), False
        secs = 1e-3 * (1 + sum(v for v in task.config.values() if isinstance(v, (int, float))))
        return MeasureResult(status="ok", seconds=secs, metrics={"runner_pid": os.getpid(),
                                                                  "library_bytes": os.path.getsize(task.path)}), False


def fake_runner(spec: RunnerSpec) -> FakeRunner:
    return FakeRunner(spec)


class FakeBuilder:
    """A backend that "builds" any config instantly (the artifact is the config)."""

    def __init__(self, target: Target):
        self.target = target

    def build(self, wl: Workload, config: Mapping[str, Any]) -> Any:
        from opcompiler.backend import Kernel
        if config.get("poison") == "invalid":
            raise OpcError("this config is invalid")
        return Kernel(workload=wl, target=self.target, template="fake", template_version=1, config=dict(config),
                      artifact=dict(config), info={"cuda_compiler": "none"})


def fake_builder(target: Target) -> FakeBuilder:
    return FakeBuilder(target)
