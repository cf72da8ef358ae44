"""CPU attention: one query row at a time, its scores, max, exp-sum and P V computed inside the
row loop (the scores never leave a row-sized buffer), rows of every batch and head in parallel."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule


@register_template
class CpuAttention(Template):
    """The row's stages under the (b, h, row) loop of the output; `parallel_rows` spreads those rows
    over the cores, `vectorize` vectorizes the head-size loop of P V and the output."""

    name = "cpu.attention.rows"
    op_families = ("attention",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("parallel_rows", (1, 0), "1: query rows split across cores; 0: one core"),
                Knob("vectorize", (1, 0), "1: the head-size loop of P V vectorized")]

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        for name in ("scaled", "probs"):
            sch.compute_inline(sch.get_sblock(name))
        out = sch.get_sblock("attention_out")
        *lead, t = sch.get_loops(out)
        row = sch.fuse(*lead)  # (b, h, row) or, sequence first, (row, b, h)
        for name in ("pv", "row_sum", "probs_exp", "row_max", "scores"):  # consumers first
            sch.compute_at(sch.get_sblock(name), row)
        if config["vectorize"]:
            sch.vectorize(t)
        if config["parallel_rows"]:
            sch.parallel(row)
        return sch
