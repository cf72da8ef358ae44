"""CPU matmul / fully connected (and fused bias + ReLU): a register tile of `tile_m` rows by
`tile_n` columns (vectorized along N), K split for cache reuse, parallel over tiles."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.cpu_intrin import vector_lanes
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import create_schedule, divisors, inline_all_except, near, output_block


@register_template
class CpuMatmul(Template):
    name = "cpu.matmul.tiled"
    op_families = ("matmul",)
    target_family = "cpu"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return [
            Knob("tile_n", divisors(wl["n"], 64), "columns per register tile (vectorized)"),
            Knob("tile_m", divisors(wl["m"], 16), "rows per register tile (unrolled)"),
            Knob("tile_k", divisors(wl["k"], 512), "K per cache block"),
        ]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        knobs = {k.name: k for k in self.space(wl, target)}
        lanes = vector_lanes("float32")
        tn = near(knobs["tile_n"].values, 2 * lanes)
        tm = near(knobs["tile_m"].values, max(1, 24 // max(1, -(-tn // lanes))))
        return {"tile_n": tn, "tile_m": tm, "tile_k": near(knobs["tile_k"].values, 256)}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        regs = config["tile_m"] * -(-config["tile_n"] // vector_lanes("float32"))
        return f"register tile needs {regs} vector registers (more than 64)" if regs > 64 else None

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        mm = sch.get_sblock("matmul")
        inline_all_except(sch, {"matmul"})
        tn = config["tile_n"]
        if wl["trans_b"]:  # B is (N, K): pack to (N/tn, K, tn) so vector loads are contiguous
            bp = sch.cache_read(mm, 1, "global")
            sch.transform_layout(bp, ("write", 0), self._packed_b(wl, tn))
        out = output_block(sch)
        if sch.get(out).name_hint == "matmul":
            sch.cache_write(mm, 0, "local")
            mm, out = sch.get_sblock("matmul"), output_block(sch)
        else:
            sch.set_scope(mm, 0, "local")
        *lead, i, j, k = sch.get_loops(mm)  # (batch_matmul: the batch loop leads, parallel with the tiles)
        io, ii = sch.split(i, [None, config["tile_m"]])
        jo, ji = sch.split(j, [None, tn])
        ko, ki = sch.split(k, [None, config["tile_k"]])
        sch.reorder(*lead, io, jo, ko, ki, ii, ji)
        sch.parallel(sch.fuse(*lead, io, jo))
        sch.reverse_compute_at(out, sch.get_loops(mm)[0])
        sch.vectorize(ji)
        sch.unroll(ii)
        sch.decompose_reduction(mm, ko)
        lps = sch.get_loops(out)
        if len(lps) > 1:  # a 1 x 1 tile (m and n without a divisor > 1 up to the tile caps) has no loop of its own
            sch.vectorize(lps[-1])
        return sch

    def _packed_b(self, wl: Workload, tn: int):
        """The packed layout of a transposed B: (N, K) -> (N/tn, K, tn)."""
        return lambda n, k: (n // tn, k, n % tn)

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        return {"accumulators": config["tile_m"] * config["tile_n"],
                "tasks": (wl["m"] // config["tile_m"]) * (wl["n"] // config["tile_n"]),
                "k_blocks": wl["k"] // config["tile_k"]}
