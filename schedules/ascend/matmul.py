"""Matmul / fully connected on the cube: seed 000's Algorithm Y, generalized.

    FOR n tile, m tile (output tiles, split over `block_dim` cores)
      FOR k step:  A[m, k] -> A_L1, B[k, n] -> B_L1          (MTE2)
                   L1 -> L0A / L0B in chunks that fit L0     (MTE1, Load2D)
                   C_L0C (+)= A_L0A x B_L0B                  (M, one MMAD per chunk)
      C_L0C -> UB (V), bias in fp32, cast, ReLU (V), UB -> C   (MTE3)

GM layouts (host-side preprocessing): A as zZ fractals (M1, K1, 16, K0) or, with
`a_layout="ND"`, row-major (zero-padded to the fractal) and converted ND -> zZ by Load2D on
the way to L0A (counted); B as FRACTAL_Z (K1, N1, 16, K0), C as NZ (N1, M1*16, 16). `double_buffer`
gives every on-chip stage two slots (ping-pong) so MTE2, MTE1, M, V and MTE3 overlap.

Every config is built as a TVM s_tir schedule (`matmul_tir.py`); `apply` returns it as a
`Scheduled` the backend lowers (its `lower.py`, lowering "gemm").
Template v2: the directly emitted (TIK-style) program and the `lowering` knob are retired; the
TIR route took every config the emitter took, with equal or fewer cycles
(`benchmarks/tir_parity.py`).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import CubeTemplate, ceil_div, core_values, cube_dtype, tile_values

ACC = {"float16": "float32", "int8": "int32"}
OUT = {"float16": "float16", "int8": "int32"}


def _dims(wl: Workload, target: Target) -> tuple[int, int, int, int, int, int]:
    m0, k0, n0 = cube_dtype(wl, target)
    return ceil_div(wl["m"], m0), ceil_div(wl["k"], k0), ceil_div(wl["n"], n0), m0, k0, n0


@register_template
class AscendMatmul(CubeTemplate):
    """m/k/n tiles in 16-aligned fractals through L1, L0A/L0B, the cube, L0C and UB."""

    name = "ascend.matmul"
    op_families = ("matmul",)
    version = 2  # v2: one route (TVM s_tir schedule); the `lowering` knob and the TIK-style emitter retired

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        m1, k1, n1, m0, k0, n0 = _dims(wl, target)
        return [
            Knob("m_tile", tile_values(m1 * m0, m0), "rows of A per tile (multiple of 16)"),
            Knob("k_tile", tile_values(k1 * k0, k0, 2048), "reduction depth per L1 tile"),
            Knob("n_tile", tile_values(n1 * n0, n0), "columns of B per tile (multiple of 16)"),
            Knob("double_buffer", (1, 0), "ping-pong buffers in L1, L0 and UB"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the output tiles are split over"),
            Knob("a_layout", ("zZ", "ND"), "A in GM as zZ fractals (host-side) or ND, converted by Load2D on chip"),
        ]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        sp = {k.name: k.values for k in self.space(wl, target)}
        out = []
        for mt in sorted(sp["m_tile"], key=lambda v: abs(v - 256)):
            for nt in sorted(sp["n_tile"], key=lambda v: abs(v - 256)):
                for kt in sorted(sp["k_tile"], key=lambda v: abs(v - 128)):
                    out.append({"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1,
                                "block_dim": target.cores, "a_layout": "zZ"})
        return out

    def tir(self) -> Any:
        from . import matmul_tir  # unsupported, tir_buffers (the capacity check), scheduled (apply)

        return matmul_tir

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        M1, K1, N1, m0, k0, n0 = _dims(wl, target)
        isz = np.dtype(wl.dtype).itemsize
        mt1, kt1, nt1 = cfg["m_tile"] // m0, cfg["k_tile"] // k0, cfg["n_tile"] // n0
        tm, tn, tk = ceil_div(M1, mt1), ceil_div(N1, nt1), ceil_div(K1, kt1)
        gm_read = tn * M1 * K1 * m0 * k0 * isz + tm * K1 * N1 * k0 * n0 * isz
        gm_write = M1 * N1 * m0 * n0 * 2
        flops = 2 * M1 * K1 * N1 * m0 * k0 * n0
        tiles = tm * tn
        cores = min(cfg["block_dim"], tiles)
        return {"gm_read_bytes": gm_read, "gm_write_bytes": gm_write,
                "arith_intensity": flops / (gm_read + gm_write), "tiles": tiles, "k_steps": tk,
                "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores),
                "alignment_waste": 1 - (wl["m"] * wl["k"] * wl["n"]) / (M1 * m0 * K1 * k0 * N1 * n0),
                "edge_waste": 1 - (M1 * N1) / (tm * mt1 * tn * nt1),
                **self.occupancy(wl, target, cfg), "dma_count": tiles * tk * 2, "mmad_flops_per_core": flops / cores}
