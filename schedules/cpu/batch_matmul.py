"""CPU batch_matmul: matmul's register tiles (`tile_m` rows by `tile_n` columns, vectorized along
N; K split for cache reuse) under the batch, with batches x row tiles x column tiles as one
parallel loop (a batch of small GEMMs fills the cores where one would not)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import register_template
from opcompiler.workload import Workload

from .common import create_schedule, inline_all_except, output_block
from .matmul import CpuMatmul


@register_template
class CpuBatchMatmul(CpuMatmul):
    """Knobs, default and register check as matmul's (they depend on m, k, n only)."""

    name = "cpu.batch_matmul.tiled"
    op_families = ("batch_matmul",)
    target_family = "cpu"
    version = 1

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        mm = sch.get_sblock("matmul")
        inline_all_except(sch, {"matmul"})
        tn = config["tile_n"]
        if wl["trans_b"]:  # B is (b, N, K) or (N, K): pack N into (N/tn, K, tn) so vector loads are contiguous
            bp = sch.cache_read(mm, 1, "global")
            if wl["bcast_b"]:
                sch.transform_layout(bp, ("write", 0), lambda n, k: (n // tn, k, n % tn))
            else:
                sch.transform_layout(bp, ("write", 0), lambda z, n, k: (z, n // tn, k, n % tn))
        out = output_block(sch)
        if sch.get(out).name_hint == "matmul":
            sch.cache_write(mm, 0, "local")
            mm, out = sch.get_sblock("matmul"), output_block(sch)
        else:
            sch.set_scope(mm, 0, "local")
        z, i, j, k = sch.get_loops(mm)
        io, ii = sch.split(i, [None, config["tile_m"]])
        jo, ji = sch.split(j, [None, tn])
        ko, ki = sch.split(k, [None, config["tile_k"]])
        sch.reorder(z, io, jo, ko, ki, ii, ji)
        sch.parallel(sch.fuse(z, io, jo))
        sch.reverse_compute_at(out, sch.get_loops(mm)[0])
        sch.vectorize(ji)
        sch.unroll(ii)
        sch.decompose_reduction(mm, ko)
        lps = sch.get_loops(out)
        if len(lps) > 1:  # a 1 x 1 tile has no loop of its own
            sch.vectorize(lps[-1])
        return sch

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        f = super().features(wl, target, config)
        return {**f, "tasks": wl["b"] * f["tasks"]}
