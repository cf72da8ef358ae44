"""CPU batch_matmul: matmul's register tiles (`tile_m` rows by `tile_n` columns, vectorized along
N; K split for cache reuse) under the batch, with batches x row tiles x column tiles as one
parallel loop (a batch of small GEMMs fills the cores where one would not): matmul's schedule,
the batch loop leading."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.target import Target
from opcompiler.template_base import register_template
from opcompiler.workload import Workload

from .matmul import CpuMatmul


@register_template
class CpuBatchMatmul(CpuMatmul):
    """Knobs, default and register check as matmul's (they depend on m, k, n only)."""

    name = "cpu.batch_matmul.tiled"
    op_families = ("batch_matmul",)
    target_family = "cpu"
    version = 1

    def _packed_b(self, wl: Workload, tn: int):
        """B is (b, N, K), or (N, K) when shared (`bcast_b`): N packed as matmul's, per batch."""
        if wl["bcast_b"]:
            return super()._packed_b(wl, tn)
        return lambda z, n, k: (z, n // tn, k, n % tn)

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        f = super().features(wl, target, config)
        return {**f, "tasks": wl["b"] * f["tasks"]}
