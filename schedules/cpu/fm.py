"""CPU fm_interaction (DeepFM's pairwise term): per sample, the field sum and the sum of squares
over f accumulated in two (k,) rows, then s * s - q; samples in parallel over the cores."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule


@register_template
class CpuFm(Template):
    """The float32 cast and the squares inlined into the two sums; both sums and the result at
    the sample loop (`parallel`: the samples split across cores)."""

    name = "cpu.fm"
    op_families = ("fm",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("parallel", (1, 0), "1: samples split across cores; 0: one core")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"parallel": int(wl["b"] > 1 and wl["b"] * wl["f"] * wl["k"] >= 16384)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        for name in ("fm_sq", "fm_in") if wl.dtype != "float32" else ("fm_sq",):
            sch.compute_inline(sch.get_sblock(name))
        out = sch.get_sblock("fm_out")
        i = sch.get_loops(out)[0]
        if config["parallel"]:
            sch.parallel(i)
        for name in ("fm_sumsq", "fm_sum"):
            blk = sch.get_sblock(name)
            sch.set_scope(blk, 0, "local")
            sch.compute_at(blk, i)
        return sch
