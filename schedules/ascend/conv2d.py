"""conv2d (and its fused conv+bias+ReLU, conv+BN+ReLU) on the cube through img2col.

    FOR image b (and group), pixel tile m, output-channel tile n   (tiles split over `block_dim` cores)
      input rows of the tile, all C1 blocks: GM (NC1HWC0) -> L1        (MTE2, once per (b, m))
      FOR k step (K fractals in FRACTAL_Z order (c1, ry, rx)):
        weights GM (FRACTAL_Z) -> L1 (MTE2; with w_resident the n tile's whole slice is loaded
        once and the loops run n tile outermost)
        Load3D img2col L1 -> L0A (stride, padding, dilation);
        Load2D L1 -> L0B; MMAD into L0C                                (MTE1, M)
      L0C -> UB, bias (fp32) / cast / BN (fp16) / ReLU in UB, UB -> GM  (V, MTE3)

GM layouts (host-side preprocessing): data NC1HWC0 (C0 = 16 for fp16, 32 for int8; channels
zero-padded, so 3 or 13 input channels pay for a whole C0 block), weights FRACTAL_Z
(C1*R*S, K1, 16, C0), output NC1HWC0 with H*W flattened; per-channel parameters (K1, 16).
Grouped convolution runs each (image, group) pair as its own GEMM over that group's channels
(each group padded to C0: depthwise convolution pays 16x on the cube, as on the chip).

Template v2: every config is a TVM implicit-GEMM s_tir schedule (`conv2d_tir.py`), returned as a
`Scheduled` the backend lowers (its `lower.py`, lowering "conv"); the `lowering` knob is
retired, and so is the TIK-style emitter that grouped / depthwise convolution and 1x1 outputs
took until the schedule covered them (int8 conv with BN is not an op: BN takes float dtypes).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import CubeTemplate, ceil_div, core_values, tile_values
from .conv_geometry import ConvGeometry as _Geo


@register_template
class AscendConv2d(CubeTemplate):
    """img2col convolution in 16-aligned fractals with fused UB epilogues."""

    name = "ascend.conv2d"
    op_families = ("conv2d",)
    version = 2  # v2: one route (TVM s_tir), the `lowering` knob retired

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        g = _Geo(wl, target)
        return [
            Knob("m_tile", tile_values(g.mp1 * 16, 16, 2048), "output pixels per tile (multiple of 16)"),
            Knob("k_tile", tile_values(g.q * g.c0, g.c0, 4096), "reduction depth (C0 x taps) per L1 weight tile"),
            Knob("n_tile", tile_values(g.n1 * 16, 16), "output channels per tile (multiple of 16)"),
            Knob("double_buffer", (1, 0), "ping-pong buffers in L1, L0 and UB"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over"),
            Knob("w_resident", (0, 1), "keep the n tile's whole weight slice in L1, loaded once per n tile"),
        ]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        sp = {k.name: k.values for k in self.space(wl, target)}
        out = []
        for mt in sorted(sp["m_tile"], key=lambda v: abs(v - 256)):
            for nt in sorted(sp["n_tile"], key=lambda v: -v if v <= 256 else v):
                for kt in sorted(sp["k_tile"], key=lambda v: abs(v - 128)):
                    out.append({"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1,
                                "block_dim": target.cores, "w_resident": 0})
        return out

    def tir(self) -> Any:
        from . import conv2d_tir  # unsupported, tir_buffers (the capacity check), scheduled (apply)

        return conv2d_tir

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        g = _Geo(wl, target)
        isz = np.dtype(wl.dtype).itemsize
        mt1, kt1, nt1 = cfg["m_tile"] // 16, cfg["k_tile"] // g.c0, cfg["n_tile"] // 16
        mtiles, ntiles = ceil_div(g.mp1, mt1), ceil_div(g.n1, nt1)
        tiles = g.nb * mtiles * ntiles
        rows = g.max_rows(mt1 * 16)
        fmap = g.nb * mtiles * g.c1 * rows * g.w * g.c0 * isz
        wts = (g.groups * ntiles if cfg["w_resident"] else tiles) * g.q * nt1 * 16 * g.c0 * isz
        out_b = g.nb * g.n1 * g.hw * 16 * 2
        flops = 2 * g.nb * g.mp1 * 16 * g.q * g.c0 * g.n1 * 16
        cores = min(cfg["block_dim"], tiles)
        return {"gm_read_bytes": fmap + wts, "gm_write_bytes": out_b, "arith_intensity": flops / (fmap + wts + out_b),
                "tiles": tiles, "k_steps": ceil_div(g.q, kt1), "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "alignment_waste": 1 - g.c / (g.c1 * g.c0),
                "pixel_waste": 1 - g.hw / (mtiles * mt1 * 16), "halo_rows": rows,
                **self.occupancy(wl, target, cfg), "mmad_flops_per_core": flops / cores}
