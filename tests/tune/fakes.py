"""A tiny deterministic backend and template for testing the tuning loop itself.

The fake "machine" times a tiled matmul from its knobs with a structured cost (loads fall
with bigger tiles, a register budget punishes oversized ones, the loop order and unrolling
matter), so a model can learn it and random search cannot luck into it. `Target.extra`
steers failures: `fail` = crash | hang | wrong | invalid | all-invalid, for configs whose
`unroll` equals `fail_unroll` (every config when it is 0).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from opcompiler.backend import Backend, Kernel, RunResult
from opcompiler.errors import CapacityError, OpcError
from opcompiler.ops import get_op
from opcompiler.target import MemoryLevel, Target
from opcompiler.template import Knob, Template, get_template, register_template
from opcompiler.workload import Workload

FACTORY = f"{__name__}:FakeBackend"
TILES = (1, 2, 4, 8, 16, 32)


class FakeMatmulTemplate(Template):
    name = "fake.matmul"
    op_families = ("matmul",)
    target_family = "fake"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("tile_m", TILES), Knob("tile_n", TILES), Knob("tile_k", TILES),
                Knob("order", ("mnk", "mkn", "kmn")), Knob("unroll", (1, 2, 4, 8))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"tile_m": 4, "tile_n": 4, "tile_k": 4, "order": "mnk", "unroll": 1}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        tm, tn, tk = config["tile_m"], config["tile_n"], config["tile_k"]
        need = 4 * (tm * tk + tk * tn + tm * tn)
        cap = target.memories[0].capacity_bytes
        return f"tiles need {need} B of {cap} B" if need > cap else None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        tm, tn, tk = config["tile_m"], config["tile_n"], config["tile_k"]
        return {"tile_bytes": 4.0 * (tm * tk + tk * tn + tm * tn), "intensity": tm * tn / (tm + tn)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Any:
        return dict(config)


try:
    get_template("matmul", "fake")
except OpcError:
    register_template(FakeMatmulTemplate)


def fake_target(capacity: int = 6000, **extra: Any) -> Target:
    return Target(name="fake-sim", family="fake", description="test machine", clock_ghz=1.0, cores=1,
                  peak_flops_per_cycle=MappingProxyType({"float32": 64.0}),
                  memories=(MemoryLevel(name="L1", capacity_bytes=capacity),),
                  extra=MappingProxyType(extra), digest=f"fake{capacity}{sorted(extra.items())}")


def fake_cycles(wl: Workload, config: Mapping[str, Any]) -> int:
    """Structured cost of the fake machine: optimum is interior, knobs interact."""
    m, n, k = 256, 256, 256
    tm, tn, tk, u = config["tile_m"], config["tile_n"], config["tile_k"], config["unroll"]
    order = {"mnk": 1.0, "mkn": 1.3, "kmn": 1.8}[config["order"]]
    loads = m * n * k * (1 / tn + 1 / tm) * order / 4
    regs = tm * tn / u
    spill = 1.0 + max(0.0, (tm * tn) / 64 - 1) ** 2 * 0.5  # over 64 accumulators spills
    compute = m * n * k / (min(tk, 8) * min(u, 4)) * spill / 16
    loop = (m / tm) * (n / tn) * (k / tk) * (12 + 4 * abs(math.log2(u) - 2)) / max(1.0, regs / 16)
    return int(loads + compute + loop)


class FakeBackend(Backend):
    family = "fake"

    def __init__(self, target: Target):
        super().__init__(target)

    def _fails(self, config: Mapping[str, Any]) -> str:
        mode = self.target.extra.get("fail", "")
        which = self.target.extra.get("fail_unroll", 0)
        return mode if mode and (which == 0 or config.get("unroll") == which) else ""

    def build(self, wl: Workload, config: Mapping[str, Any] | None = None) -> Kernel:
        tmpl = FakeMatmulTemplate()
        cfg = tmpl.config(wl, self.target, config)
        fail = self._fails(cfg)
        if fail == "crash":
            os._exit(3)
        if fail == "hang":
            time.sleep(3600)
        if fail in ("invalid", "all-invalid") or (cfg["tile_m"] * cfg["tile_n"] > 512 and cfg["unroll"] == 8):
            raise CapacityError("acc", "registers", cfg["tile_m"] * cfg["tile_n"] * 4, 2048)
        if fail == "raise":
            raise RuntimeError("backend bug")
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=cfg, artifact=fake_cycles(wl, cfg))

    def measure(self, kernel: Kernel, inputs: Any = None) -> RunResult:
        cycles = int(kernel.artifact)
        return RunResult(outputs=None, seconds=cycles / 1e9, cycles=cycles,
                         metrics={"percent_of_peak": 12.5, "bound": "fake"})

    def run(self, kernel: Kernel, inputs: Any) -> RunResult:
        out = get_op(kernel.workload.op).reference(kernel.workload, inputs)
        if self._fails(kernel.config) == "wrong":
            out = out + np.float32(1.0)
        res = self.measure(kernel)
        return replace(res, outputs=[out])


def small_matmul() -> Workload:
    from opcompiler.ops import workload
    return workload("matmul", "m=16,k=32,n=16", dtype="float32")
