"""CPU embedding lookup (gather): out[i, :] = table[indices[i], :], the indices in parallel over
the cores, each row copied in vector chunks of `vector` columns; with `bag` > 1 (EmbeddingBag's
sum) the lookup is inlined into the bag sum, each bag's rows added into its output row."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.cpu_intrin import vector_lanes
from opcompiler.ops.catalogue.gather import bag
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule, divisors, near


@register_template
class CpuGather(Template):
    """The gather block's index loop parallel (`parallel`), its column loop split by `vector`
    and the inner part vectorized (a row copy: one index load per row)."""

    name = "cpu.gather.rows"
    op_families = ("gather",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("vector", divisors(wl["cols"], 64), "row columns per vector chunk"),
                Knob("parallel", (1, 0), "1: indices split across cores; 0: one core")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"vector": near(self.space(wl, target)[0].values, 2 * vector_lanes(wl.dtype)),
                "parallel": int(wl["n"] > 1 and wl["n"] * wl["cols"] >= 16384)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        v = config["vector"]
        if bag(wl) > 1:  # the lookup inlined into the bag sum: per bag, its rows added into the output row
            sch.compute_inline(sch.get_sblock("gather"))
            blk = sch.get_sblock("bag_sum")
            i, j, k = sch.get_loops(blk)
            sch.reorder(i, k, j)  # (TVM's vectorize refuses j under the reduction loop: LLVM's loop
            if config["parallel"]:  # vectorizer takes the unit-stride row add)
                sch.parallel(i)
            sch.decompose_reduction(blk, k)
            return sch
        i, j = sch.get_loops(sch.get_sblock("gather"))
        if v > 1:
            _, ji = sch.split(j, [None, v])
            sch.vectorize(ji)
        if config["parallel"]:
            sch.parallel(i)
        return sch
