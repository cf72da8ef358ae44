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
from . import scheduler
from .scheduler import Timing, schedule

PIPE_RATIO = {"M": "mac_ratio", "V": "vec_ratio", "S": "scalar_ratio", "MTE1": "mte1_ratio",
              "MTE2": "mte2_ratio", "MTE3": "mte3_ratio"}
PIPE_RESOURCE = {"M": "cube (M pipe)", "V": "vector unit (V pipe)", "S": "scalar unit (S pipe)",
                 "MTE1": "L1 -> L0 loads (MTE1)", "MTE2": "GM reads (MTE2)", "MTE3": "GM writes (MTE3)"}
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

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        try:
            tmpl, cfg = self.resolve(wl, config)
        except InvalidConfig as e:
            raise self._emission_error(wl, e) from None
        self._check_gm(wl)
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
        functional replay's own accounting (what the execution read, wrote and did, `scheduler.
        replay`), not from the timing scheduler; `measure` gives the same figure independently."""
        comp: Compiled = kernel.artifact
        out, t = scheduler.run(comp.plan, comp.program, inputs)
        return self._result(kernel, t, [out])

    # -- reporting ----------------------------------------------------------------------------

    def _result(self, kernel: Kernel, t: Timing, outputs: list[np.ndarray] | None) -> RunResult:
        plan: Plan = kernel.artifact.plan
        m, tgt = self.machine, self.target
        seconds = m.cycles_to_seconds(t.cycles)
        flops = plan.flops
        if plan.unit == "cube":
            peak_per_cycle = m.peak_flops_per_cycle.get(kernel.workload.dtype, 0.0)
        else:
            peak_per_cycle = float(m.lanes(np.dtype(kernel.workload.dtype).itemsize))
        peak = peak_per_cycle * m.clock_ghz * 1e9 * m.cores
        n = plan.active_cores
        gm_bytes = (t.gm_read_bytes + t.gm_write_bytes) * n
        hbm_bytes = (t.gm_read_bytes * t.hbm_read_fraction + t.gm_write_bytes) * n
        bw = m.offchip_gbps * 1e9
        intensity = flops / hbm_bytes if hbm_bytes else float("inf")
        attainable = min(peak, intensity * bw)
        ratios = {PIPE_RATIO[p]: round(t.busy[p] / t.cycles, 4) if t.cycles else 0.0 for p in PIPE_RATIO}
        busiest = max(PIPE_RATIO, key=lambda p: t.busy[p])
        bound = PIPE_RESOURCE[busiest] if t.busy[busiest] >= 0.5 * t.cycles else "latency (pipes wait on each other)"
        by_level = {"GM_read": t.gm_read_bytes * n, "GM_write": t.gm_write_bytes * n,
                    m.offchip_name: int(hbm_bytes), "L2_hit": int(t.gm_read_bytes * (1 - t.hbm_read_fraction) * n)}
        for key, v in t.bytes_by_path.items():
            dst = key.split("->")[1]
            if dst != "GM":
                by_level[f"{key}"] = v * n
        metrics = {
            "cycles": t.cycles, "time_us": seconds * 1e6, "tflops": flops / seconds / 1e12 if seconds else 0.0,
            "percent_of_peak": 100.0 * flops / seconds / peak if seconds and peak else 0.0,
            "bound": bound, "pipe_ratios": ratios, "bytes_by_level": by_level,
            "gm_bytes": gm_bytes,
            "memory_bound_ratio": round(ratios["mte2_ratio"] / max(ratios["mac_ratio"], ratios["vec_ratio"], 1e-9), 4),
            "roofline": {"peak_tflops": peak / 1e12, "arithmetic_intensity": intensity,
                         "attainable_tflops": attainable / 1e12,
                         "roofline_bound": "compute" if intensity * bw >= peak else "memory",
                         "offchip_gbps": m.offchip_gbps},
            "active_cores": n, "sync_events_core0": t.syncs, "instructions_core0": t.instructions,
            "l2_hit_ratio": round(1 - t.hbm_read_fraction, 4),
            "mode": "functional" if outputs is not None else "timing",
            "bytes_note": "bytes are core 0's traffic x active cores (core 0 holds the largest share)",
        }
        if tgt.clock_ghz <= 0:
            raise OpcError(f"target {tgt.name} has no clock", arg="clock_ghz", value=tgt.clock_ghz)
        return RunResult(outputs=outputs, seconds=seconds, cycles=t.cycles, metrics=metrics)
