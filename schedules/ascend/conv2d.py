"""conv2d (and its fused conv+bias+ReLU, conv+BN+ReLU) on the cube through img2col.

    FOR image b, pixel tile m, output-channel tile n   (tiles split over `block_dim` cores)
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

Template v2: with groups 1 every config is a TVM implicit-GEMM s_tir schedule (`conv2d_tir.py`)
lowered by the backend's one TIR lowering (`opcompiler.backend.ascend.tir_lower`); the `lowering`
knob is retired. The TIK-style emitter below remains only for what that schedule does not cover
yet: grouped / depthwise convolution and int8 with a BN epilogue.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import VOp
from opcompiler.errors import CapacityError, OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import (AscendTemplate, CubeTiles, EpStep, core_values, cube_k_step, epilogue,
                     epilogue_group, from_5hd, l0_chunks, machine, to_5hd, tile_values)
from .conv_geometry import ConvGeometry as _Geo

ACC = {"float16": "float32", "int8": "int32"}
OUT = {"float16": "float16", "int8": "int32"}


@register_template
class AscendConv2d(AscendTemplate):
    """img2col convolution in 16-aligned fractals with fused UB epilogues."""

    name = "ascend.conv2d"
    op_families = ("conv2d",)
    version = 2  # v2: one route for groups 1 (TVM s_tir), the `lowering` knob retired

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

    def _tiles(self, g: _Geo, wl: Workload, target: Target, cfg: Mapping) -> CubeTiles | None:
        slots = 2 if cfg["double_buffer"] else 1
        mt1, kt1, nt1 = cfg["m_tile"] // 16, cfg["k_tile"] // g.c0, cfg["n_tile"] // 16
        ch = l0_chunks(machine(target), wl.dtype, mt1, kt1, nt1, slots)
        return None if ch is None else CubeTiles(mt1, kt1, nt1, ch[0], ch[1], slots)

    def _cslots(self, target: Target, t: CubeTiles) -> int:
        one = t.nt1 * t.mt1 * 16 * 16 * 4
        return 2 if t.slots == 2 and 2 * one <= machine(target).level("L0C").capacity else 1

    def _ub(self, wl: Workload, target: Target, t: CubeTiles, g: _Geo):
        m = machine(target)
        cast = OUT[wl.dtype] != ACC[wl.dtype]
        osz = np.dtype(OUT[wl.dtype]).itemsize
        bufs = []
        if wl.op == "conv2d_bias_relu":
            bufs.append(("UB", "bias_ub", g.groups * g.n1 * 16 * (2 if cast else 4)))
            if cast:
                bufs.append(("UB", "bias32_ub", g.groups * g.n1 * 16 * 4))
        if wl.op in ("conv2d_bn_relu", "conv2d_bn"):
            bufs += [("UB", "scale_ub", g.groups * g.n1 * 16 * osz), ("UB", "shift_ub", g.groups * g.n1 * 16 * osz)]
        rows = t.mt1 * 16
        grp = epilogue_group(m, t.nt1, rows, 4, osz if cast else 0, t.slots, m.level("UB").capacity // 2)
        for s in range(t.slots):
            bufs.append(("UB", f"acc_ub_{s}", grp * rows * 16 * 4))
            if cast:
                bufs.append(("UB", f"out_ub_{s}", grp * rows * 16 * osz))
        return bufs, grp

    def lowering(self, wl: Workload, target: Target, cfg: Mapping) -> str:
        """The route: the TVM schedule (tir) wherever it covers the workload (groups 1: fp16, and
        int8 conv2d / conv2d_bias_relu), the direct emitter (tik) for the rest (grouped /
        depthwise convolution, int8 with a BN epilogue, a 1x1 output the implicit-GEMM rewrite
        cannot express)."""
        from .conv2d_tir import expressible, unsupported

        return "tir" if unsupported(wl) is None and expressible(wl) else "tik"

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        if self.lowering(wl, target, config) == "tir":
            from .conv2d_tir import unsupported

            why = unsupported(wl)
            if why is not None:
                return why
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        g = _Geo(wl, target)
        if self.lowering(wl, target, cfg) == "tir":  # what the TIR lowering allocates
            from .conv2d_tir import tir_buffers

            return tir_buffers(wl, target, cfg)
        isz = np.dtype(wl.dtype).itemsize
        frac = 16 * g.k0 * isz
        t = self._tiles(g, wl, target, cfg)
        slots = 2 if cfg["double_buffer"] else 1
        if t is None:
            return [("L0A", "A_L0A", cfg["m_tile"] * g.k0 * isz * slots + machine(target).level("L0A").capacity)]
        rows = g.max_rows(t.mt1 * 16)
        out = []
        for s in range(slots):
            out.append(("L1", f"fmap_L1_{s}", g.c1 * rows * g.w * g.c0 * isz))
            if not cfg["w_resident"]:
                out.append(("L1", f"W_L1_{s}", t.kt1 * t.nt1 * frac))
            out += [("L0A", f"A_L0A_{s}", t.mt1 * t.k0c * frac), ("L0B", f"B_L0B_{s}", t.k0c * t.n0c * frac)]
        if cfg["w_resident"]:
            out.append(("L1", "W_res_L1", g.q * t.nt1 * frac))
        out += [("L0C", f"C_L0C_{s}", t.nt1 * t.mt1 * 16 * 16 * 4) for s in range(self._cslots(target, t))]
        return out + self._ub(wl, target, t, g)[0]

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Plan:
        if self.lowering(wl, target, cfg) == "tir":
            from .conv2d_tir import tir_plan, unsupported

            why = unsupported(wl)
            if why is not None:
                raise OpcError(why, arg="op", value=wl.op)
            return tir_plan(wl, target, cfg)
        m = machine(target)
        g = _Geo(wl, target)
        t = self._tiles(g, wl, target, cfg)
        if t is None:
            raise CapacityError("A_L0A", "L0A", cfg["m_tile"] * g.k0 * np.dtype(wl.dtype).itemsize * 2,
                                m.level("L0A").capacity, "one K fractal of the pixel tile per ping-pong slot")
        dt, acc, odt = wl.dtype, ACC[wl.dtype], OUT[wl.dtype]
        cast = odt != acc
        bias, bn = wl.op == "conv2d_bias_relu", wl.op in ("conv2d_bn_relu", "conv2d_bn")
        bdt = "int32" if dt == "int8" else dt
        mtiles = ceil_div(g.mp1, t.mt1)
        ntiles = ceil_div(g.n1, t.nt1)
        resident = bool(cfg["w_resident"])
        if resident:  # n tiles outermost: each core loads a weight slice once and sweeps pixels
            tiles = [(b, mi, ni) for ni in range(ntiles) for b in range(g.nb) for mi in range(mtiles)]
        else:  # pixel tiles outermost: the feature map stays in L1 across n tiles
            tiles = [(b, mi, ni) for b in range(g.nb) for mi in range(mtiles) for ni in range(ntiles)]
        active = min(cfg["block_dim"], len(tiles))
        cslots = self._cslots(target, t)
        _, grp = self._ub(wl, target, t, g)
        rows_max = g.max_rows(t.mt1 * 16)

        def program(core: int):
            kb = KernelBuilder(m, core, active)
            X = kb.gm("data", (g.nb, g.c1, g.h, g.w, g.c0), dt)
            W = kb.gm("weight", (g.groups * g.q, g.n1, 16, g.k0), dt)
            Y = kb.gm("out", (g.nb, g.n1, g.hw, 16), odt)
            pn1 = g.groups * g.n1  # per-channel parameters of every group
            fm = [kb.alloc("L1", f"fmap_L1_{s}", (g.c1, rows_max, g.w, g.c0), dt) for s in range(t.slots)]
            if resident:
                wres = kb.alloc("L1", "W_res_L1", (g.q, t.nt1, 16, g.k0), dt)
            else:
                wl1 = [kb.alloc("L1", f"W_L1_{s}", (t.kt1, t.nt1, 16, g.k0), dt) for s in range(t.slots)]
            l0a = [kb.alloc("L0A", f"A_L0A_{s}", (t.mt1, t.k0c, 16, g.k0), dt) for s in range(t.slots)]
            l0b = [kb.alloc("L0B", f"B_L0B_{s}", (t.k0c, t.n0c, 16, g.k0), dt) for s in range(t.slots)]
            l0c = [kb.alloc("L0C", f"C_L0C_{s}", (t.nt1, t.mt1 * 16, 16), acc) for s in range(cslots)]
            acc_steps, out_steps = [], []
            if bias:
                bg = kb.gm("bias", (pn1, 16), bdt)
                bub = kb.alloc("UB", "bias_ub", (pn1, 16), bdt)
                kb.data_move(bub, (slice(None),), bg, (slice(None),))
                if cast:
                    b32 = kb.alloc("UB", "bias32_ub", (pn1, 16), acc)
                    kb.vec("conv", VOp(b32), (VOp(bub),), pn1 * 16)
                else:
                    b32 = bub
                acc_steps.append(EpStep("add", b32))
                (out_steps if cast else acc_steps).append(EpStep("relu"))
            if bn:
                sg, hg = kb.gm("scale", (pn1, 16), dt), kb.gm("shift", (pn1, 16), dt)
                sub, hub = kb.alloc("UB", "scale_ub", (pn1, 16), odt), kb.alloc("UB", "shift_ub", (pn1, 16), odt)
                kb.data_move(sub, (slice(None),), sg, (slice(None),))
                kb.data_move(hub, (slice(None),), hg, (slice(None),))
                out_steps += [EpStep("mul", sub), EpStep("add", hub)]
                if wl.op == "conv2d_bn_relu":
                    out_steps.append(EpStep("relu"))
            acc_relu = [s for s in acc_steps if s.op == "relu"]
            acc_steps = [s for s in acc_steps if s.op != "relu"]
            acc_ub = [kb.alloc("UB", f"acc_ub_{s}", (grp, t.mt1 * 16, 16), acc) for s in range(t.slots)]
            out_ub = ([kb.alloc("UB", f"out_ub_{s}", (grp, t.mt1 * 16, 16), odt) for s in range(t.slots)]
                      if cast else None)
            if not cast:
                out_steps = acc_relu
            lo_t, hi_t = split_even(len(tiles), active, core)
            fcount, l1i, counter, ecount, cur, cur_w = 0, 0, [0, 0], [0], None, None
            for ti, (b, mi, ni) in enumerate(tiles[lo_t:hi_t]):
                p0 = mi * t.mt1 * 16
                mt = min(t.mt1, g.mp1 - mi * t.mt1)
                n1s = ni * t.nt1
                nt = min(t.nt1, g.n1 - n1s)
                lo, hi = g.rows(p0, mt * 16)
                if cur != (b, mi):
                    f = fm[fcount % t.slots]
                    fcount += 1
                    kb.data_move(f, (slice(None), slice(0, hi - lo + 1)), X, (b, slice(None), slice(lo, hi + 1)))
                    cur = (b, mi)
                c = l0c[ti % cslots]
                wq = (b % g.groups) * g.q  # this group's weight fractals
                if resident and cur_w != (wq, ni):
                    kb.data_move(wres, (slice(None), slice(0, nt)), W, (slice(wq, wq + g.q), slice(n1s, n1s + nt)))
                    cur_w = (wq, ni)
                for qs in range(0, g.q, t.kt1):
                    kt = min(t.kt1, g.q - qs)
                    if resident:
                        wb, koff = wres, qs
                    else:
                        wb, koff = wl1[l1i % t.slots], 0
                        l1i += 1
                        kb.data_move(wb, (slice(0, kt), slice(0, nt)), W,
                                     (slice(wq + qs, wq + qs + kt), slice(n1s, n1s + nt)))

                    def load_a(a, kc, kn, f=f, lo=lo, p0=p0, mt=mt, qs=qs):
                        kb.load3d(a, f, g.geom, h0=lo, c1_0=0, p0=p0, mt=mt * 16, q0=qs + kc, kt1=kn)

                    cube_k_step(kb, t, None, wb, l0a, l0b, c, kt, mt, nt, qs == 0, counter, load_a, b_k_off=koff)
                    kb.loop()
                valid = min(mt * 16, g.hw - p0)

                def write(ub, j, gn, b=b, n1s=n1s, p0=p0, valid=valid):
                    kb.data_move(Y, (b, slice(n1s + j, n1s + j + gn), slice(p0, p0 + valid)),
                                 ub, (slice(0, gn), slice(0, valid)))

                steps_acc = [EpStep(s.op, s.param) for s in acc_steps]
                epilogue(kb, c, nt, mt * 16, acc_ub, out_ub, grp, ecount, steps_acc, out_steps, write,
                         param_n1=(b % g.groups) * g.n1 + n1s)
                kb.loop()
            return kb.finish(gm_inputs=("data", "weight", "bias", "scale", "shift"))

        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            x, w = inputs[0], inputs[1]
            if layout == "NHWC":
                x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)  # -> NCHW, HWIO -> OIHW
            G = g.groups
            xg = x.reshape(g.n * G, g.c, g.h, g.w)  # (image, group) pairs
            x5 = to_5hd(xg, "NCHW", g.c0).reshape(g.nb, g.c1, g.h, g.w, g.c0)
            wp = np.zeros((G, g.n1 * 16, g.c1 * g.c0, g.r, g.s), w.dtype)
            wp[:, :g.k, :g.c] = w.reshape(G, g.k, g.c, g.r, g.s)
            wz = wp.reshape(G, g.n1, 16, g.c1, g.c0, g.r, g.s).transpose(0, 3, 5, 6, 1, 2, 4)
            gm = {"data": np.ascontiguousarray(x5),
                  "weight": np.ascontiguousarray(wz.reshape(G * g.q, g.n1, 16, g.c0))}

            def params(v: np.ndarray, dtype: str) -> np.ndarray:
                out = np.zeros((G, g.n1 * 16), dtype)
                out[:, :g.k] = v.reshape(G, g.k)
                return out.reshape(G * g.n1, 16)

            if bias:
                gm["bias"] = params(inputs[2], bdt)
            if bn:
                gm["scale"], gm["shift"] = params(inputs[2], dt), params(inputs[3], dt)
            return gm

        def unpack(y: np.ndarray) -> np.ndarray:
            out = from_5hd(y, g.k, g.ho, g.wo, "NCHW").reshape(g.n, g.k_all, g.ho, g.wo)
            return np.ascontiguousarray(out.transpose(0, 2, 3, 1)) if layout == "NHWC" else out

        cin_waste = 1 - g.c / (g.c1 * g.c0)
        return Plan(active_cores=active, make_program=program, pack=pack, out_name="out",
                    out_shape=(g.nb, g.n1, g.hw, 16), out_dtype=odt, unpack=unpack, flops=get_op(wl.op).flops(wl),
                    unit="cube",
                    info={"gm_layouts": {"data": "NC1HWC0 per group (N*G,C1,H,W,C0)",
                                         "weight": "FRACTAL_Z per group (G*C1*R*S,K1,16,C0)",
                                         "out": "NC1HWC0 per group (N*G,K1,Ho*Wo,16)"},
                          "channel_padding_waste": round(cin_waste, 4),
                          "padding_waste": round(1 - (g.c * g.k * g.hw) / (g.c1 * g.c0 * g.n1 * 16 * g.mp1 * 16), 4)})

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
        m = machine(target)
        occ: dict[str, int] = {}
        for level, _, nbytes in self.buffers(wl, target, cfg):
            occ[level] = occ.get(level, 0) + nbytes
        return {"gm_read_bytes": fmap + wts, "gm_write_bytes": out_b, "arith_intensity": flops / (fmap + wts + out_b),
                "tiles": tiles, "k_steps": ceil_div(g.q, kt1), "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "alignment_waste": 1 - g.c / (g.c1 * g.c0),
                "pixel_waste": 1 - g.hw / (mtiles * mt1 * 16), "halo_rows": rows,
                **{f"occupancy_{lv}": occ.get(lv, 0) / m.level(lv).capacity
                   for lv in ("L1", "L0A", "L0B", "L0C", "UB")},
                "mmad_flops_per_core": flops / cores}
