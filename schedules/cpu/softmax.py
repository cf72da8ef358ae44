"""CPU softmax over the last axis: max, exp-sum and divide as three row passes, rows in parallel."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import block_names, create_schedule, output_block


@register_template
class CpuSoftmax(Template):
    """exp(x - max) is inlined into both the sum and the division (recomputed rather than stored);
    `parallel_rows` spreads rows over the cores."""

    name = "cpu.softmax.rows"
    op_families = ("softmax",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("parallel_rows", (1, 0), "1: rows split across cores; 0: one core")]

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        keep = {"reduce_max", "sum", sch.get(output_block(sch)).name_hint}
        for name in block_names(sch):
            if name not in keep:
                sch.compute_inline(sch.get_sblock(name))
        if config["parallel_rows"]:
            for name in keep:
                sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
        return sch
