"""`AscendSimBackend`: the DaVinci AI Core on the simulator shell (`opcompiler.backend.sim`).

What the machine adds: its figures (`Machine.from_target`), its lowering (template.apply ->
Plan; core 0's program is emitted, capacity and alignment enforced: CapacityError names buffer,
level and bytes), the lowering's capacity dry-run (`lower.fit`: what a config `check` rejects
reports, without lowering it: `EMISSION_ERRORS`), its executor
(host-side packing of the inputs into GM layouts, every active core's program executed
instruction by instruction on simulated memories, output unpacked) timed by its functional
clock (`execute.replay`: `fclock`'s tables), and its timing replay (`timing.schedule`: the six
pipes over core 0's program, no arithmetic: same cycles). A functional run reports the functional
clock. The report (`profile`, `report_keys`) is here: the typed profile of a run's `Timing`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...sim.buffers import Level
from ...sim.profile import Profile, bound_of
from ...template_base import Config, Template
from ...workload import Workload
from ..sim import SimBackend
from . import execute, fclock
from .lower import fit, lower as lower_scheduled  # a template's Scheduled -> Plan
from .machine import Machine
from .program import Plan, Program
from .timing import Timing, schedule

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
        `execute.replay`), not from the timing model."""
        comp: Compiled = kernel.artifact
        out, t = execute.run(comp.plan, comp.program, inputs)
        return [out], t, {}

    def profile(self, kernel, t: Timing) -> Profile:
        return profile(self.machine, kernel.artifact.plan, t, kernel.workload.dtype)

    def report_keys(self, kernel, t: Timing, p: Profile) -> dict:
        return report_keys(kernel.artifact.plan, t, p)


# -- the report ------------------------------------------------------------------------------

PIPE_RATIO = {"M": "mac_ratio", "V": "vec_ratio", "S": "scalar_ratio", "MTE1": "mte1_ratio",
              "MTE2": "mte2_ratio", "MTE3": "mte3_ratio"}
PIPE_RESOURCE = {"M": "cube (M pipe)", "V": "vector unit (V pipe)", "S": "scalar unit (S pipe)",
                 "MTE1": "L1 -> L0 loads (MTE1)", "MTE2": "GM reads (MTE2)", "MTE3": "GM writes (MTE3)"}


def profile(m, plan, t: Timing, dtype: str) -> Profile:
    """The typed report of one kernel: core 0's replay scaled to the active cores (core 0 holds
    the largest share), the peak of the unit the plan names (cube or vector), the HBM traffic
    after L2 hits as the roofline's off-chip bytes; busy ratios per pipe over core 0's cycles
    and the bound by the simulator core's one rule (`opcompiler.sim.profile.bound_of`)."""
    if plan.unit == "cube":
        peak_per_cycle = m.peak_flops_per_cycle.get(dtype, 0.0)
    else:
        peak_per_cycle = float(m.lanes(np.dtype(dtype).itemsize))
    n = plan.active_cores
    hbm_bytes = (t.gm_read_bytes * t.hbm_read_fraction + t.gm_write_bytes) * n
    ratios = {PIPE_RATIO[p]: t.busy[p] / t.cycles if t.cycles else 0.0 for p in PIPE_RATIO}
    bound = bound_of(ratios, labels={PIPE_RATIO[p]: PIPE_RESOURCE[p] for p in PIPE_RATIO})
    by_level = {"GM_read": t.gm_read_bytes * n, "GM_write": t.gm_write_bytes * n,
                m.offchip_name: int(hbm_bytes), "L2_hit": int(t.gm_read_bytes * (1 - t.hbm_read_fraction) * n)}
    for key, v in t.bytes_by_path.items():
        if key.split("->")[1] != "GM":
            by_level[key] = v * n
    return Profile(cycles=t.cycles, clock_hz=m.clock_hz, flops=plan.flops,
                   peak_flops=peak_per_cycle * m.clock_ghz * 1e9 * m.cores, busy=dict(t.busy), busy_ratio=ratios,
                   bytes_by_level=by_level, offchip_bytes=hbm_bytes, offchip_gbps=m.offchip_gbps, bound=bound)


def report_keys(plan, t: Timing, p: Profile) -> dict:
    """The DaVinci core's own report keys, beside the profile's (`opcompiler.sim.profile.report`)."""
    n = plan.active_cores
    ratios = {k: round(v, 4) for k, v in p.busy_ratio.items()}
    return {
        "gm_bytes": (t.gm_read_bytes + t.gm_write_bytes) * n,
        "memory_bound_ratio": round(ratios["mte2_ratio"] / max(ratios["mac_ratio"], ratios["vec_ratio"], 1e-9), 4),
        "active_cores": n, "sync_events_core0": t.syncs, "instructions_core0": t.instructions,
        "l2_hit_ratio": round(1 - t.hbm_read_fraction, 4),
        "bytes_note": "bytes are core 0's traffic x active cores (core 0 holds the largest share)",
    }
