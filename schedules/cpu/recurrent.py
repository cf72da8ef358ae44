"""CPU LSTM and GRU (the recurrent family): the op's TE as written (the input projection as one
GEMM over all steps, then each step's h R^T and cell), lstm's element-wise gate stages inlined into
its cell and h stages (gru computes its gates inside the h stage already), the projection's rows in
parallel."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule


@register_template
class CpuLstm(Template):
    name = "cpu.lstm.steps"
    op_families = ("recurrent",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("parallel_proj", (1, 0), "1: the input projection's steps split across cores")]

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        if wl.op == "lstm":
            for s in range(wl["t"]):
                sch.compute_inline(sch.get_sblock(f"gates{s}"))
        if config["parallel_proj"]:
            sch.parallel(sch.get_loops(sch.get_sblock("x_proj"))[0])
        return sch
