"""CPU element-wise, pooling and reduction templates: one pass, vectorized, parallel."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.cpu_intrin import vector_lanes
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule, divisors, inline_all_except, near, output_block


@register_template
class CpuElemwise(Template):
    """All element-wise stages inlined into one loop nest over the output, flattened, split
    into `vector` lanes (vectorized) and parallel chunks."""

    name = "cpu.elemwise.flat"
    op_families = ("elemwise",)
    target_family = "cpu"
    version = 1

    def _size(self, wl: Workload) -> int:
        return int(np.prod(get_op(wl.op).output_spec(wl)[0]))

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("vector", divisors(self._size(wl), 256), "elements per vector chunk")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"vector": near(self.space(wl, target)[0].values, 4 * vector_lanes("float32"))}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        inline_all_except(sch, set())
        out = output_block(sch)
        fused = sch.fuse(*sch.get_loops(out))
        o, i = sch.split(fused, [None, config["vector"]])
        sch.parallel(o)
        sch.vectorize(i)
        return sch


@register_template
class CpuReduceLike(Template):
    """Pooling and reductions: the innermost spatial axis vectorized in `tile_vec` lanes,
    window / reduction loops outside it, parallel over the outer spatial axes."""

    name = "cpu.reduce.vectorized"
    op_families = ("pool", "reduce")
    target_family = "cpu"
    version = 1

    def _inner(self, wl: Workload) -> int:
        shape, _ = get_op(wl.op).output_spec(wl)
        return int(shape[-1])

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [Knob("tile_vec", divisors(self._inner(wl), 64), "innermost output elements per vector")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return {"tile_vec": near(self.space(wl, target)[0].values, vector_lanes("float32"))}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        red_name = {"pool2d": "pool2d", "reduce_sum": "sum", "reduce_mean": "sum"}.get(wl.op, wl.op)
        red = sch.get_sblock(red_name)
        inline_all_except(sch, {red_name})
        out = output_block(sch)
        if sch.get(out).name_hint == red_name:
            sch.cache_write(red, 0, "local")
            red, out = sch.get_sblock(red_name), output_block(sch)
        else:
            sch.set_scope(red, 0, "local")
        loops = sch.get_loops(red)
        nsp = len(get_op(wl.op).output_spec(wl)[0])
        sp, rd = loops[:nsp], loops[nsp:]
        vo, vi = sch.split(sp[-1], [None, config["tile_vec"]])
        sch.reorder(*sp[:-1], vo, *rd, vi)
        outer = sp[:-1] + [vo]
        par = sch.fuse(*outer[: max(1, min(2, len(outer)))]) if len(outer) > 1 else outer[0]
        sch.parallel(par)
        sch.reverse_compute_at(out, sch.get_loops(red)[len(outer) - (min(2, len(outer)) - 1) - 1])
        sch.vectorize(vi)
        sch.decompose_reduction(red, rd[0])
        if config["tile_vec"] > 1:  # one lane: the output's innermost loop is shared, nothing to vectorize
            sch.vectorize(sch.get_loops(out)[-1])
        return sch
