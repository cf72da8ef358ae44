"""CPU layer normalisation (layer_norm, add_layer_norm): per row, the sum, the sum of squared
deviations and rstd, then the normalised row; rows in parallel, the output's columns vectorized."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.cpu_intrin import vector_lanes
from opcompiler.ops.catalogue.norm import norm_blocks
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule, divisors, inline_all_except, near


@register_template
class CpuNorm(Template):
    """The two row reductions and rstd stay blocks, computed at the output's row loop (once per
    row: no square root per element); everything else (casts, the residual add, d = s - mean,
    the mean's and gamma / beta's broadcasts) is inlined, d recomputed where it is read.
    `vector`: the lanes of the output's vectorized column chunks and of the reductions' partial
    sums (rfactor: `vector` interleaved sums, vectorized, then added); `parallel_rows` spreads
    the rows over the cores."""

    name = "cpu.layer_norm.rows"
    op_families = ("norm",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("vector", divisors(wl["cols"], 64), "output columns per vector chunk"),
                Knob("parallel_rows", (1, 0), "1: rows split across cores; 0: one core")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"vector": near(self.space(wl, target)[0].values, 2 * vector_lanes("float32")),
                "parallel_rows": int(wl["rows"] > 1 and wl["rows"] * wl["cols"] >= 16384)}  # threads pay off

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        r = norm_blocks(sch)
        s1, s2, rstd, out = *r["sums"], r["stats_b"][-1], r["last"]
        v = config["vector"]
        inline_all_except(sch, {s1, s2, rstd})
        partial = {}  # the reductions as `vector` partial sums (vectorized), then their sum
        if v > 1:
            for nm in (s1, s2):
                _, ki = sch.split(sch.get_loops(sch.get_sblock(nm))[-1], [None, v])
                partial[nm] = sch.rfactor(ki, 1)
        i, j = sch.get_loops(sch.get_sblock(out))
        _, ji = sch.split(j, [None, v])
        for nm in (rstd, s2, s1):  # consumers first: each at the output's row loop
            sch.compute_at(sch.get_sblock(nm), i, preserve_unit_loops=True)
            if nm in partial:
                sch.compute_at(partial[nm], i, preserve_unit_loops=True)
        for rf in partial.values():  # (lanes, steps) -> (steps, lanes): the lanes vectorized
            lanes, steps = sch.get_loops(rf)[-2:]
            sch.reorder(steps, lanes)
            sch.vectorize(lanes)
        if v > 1:
            sch.vectorize(ji)
        if config["parallel_rows"]:
            sch.parallel(i)
        return sch
