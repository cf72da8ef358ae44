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

`lowering="tir"` builds the same kernel as a TVM s_tir schedule (`matmul_tir.py`) lowered by the
backend's one TIR lowering (`opcompiler.backend.ascend.tir_lower`); it takes every config the
direct emitter takes (fp16 and int8). A config dict without `lowering` takes the TIR route;
`preferred()` still names "tik", so a resolved default config keeps the direct emitter.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import (AscendTemplate, CubeTiles, EpStep, core_values, cube_dtype, epilogue, epilogue_group,
                     l0_chunks, machine, over_capacity, pad_to, tile_values)

ACC = {"float16": "float32", "int8": "int32"}
OUT = {"float16": "float16", "int8": "int32"}


def _dims(wl: Workload, target: Target) -> tuple[int, int, int, int, int, int]:
    m0, k0, n0 = cube_dtype(wl, target)
    return ceil_div(wl["m"], m0), ceil_div(wl["k"], k0), ceil_div(wl["n"], n0), m0, k0, n0


@register_template
class AscendMatmul(AscendTemplate):
    """m/k/n tiles in 16-aligned fractals through L1, L0A/L0B, the cube, L0C and UB."""

    name = "ascend.matmul"
    op_families = ("matmul",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        m1, k1, n1, m0, k0, n0 = _dims(wl, target)
        return [
            Knob("m_tile", tile_values(m1 * m0, m0), "rows of A per tile (multiple of 16)"),
            Knob("k_tile", tile_values(k1 * k0, k0, 2048), "reduction depth per L1 tile"),
            Knob("n_tile", tile_values(n1 * n0, n0), "columns of B per tile (multiple of 16)"),
            Knob("double_buffer", (1, 0), "ping-pong buffers in L1, L0 and UB"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the output tiles are split over"),
            Knob("a_layout", ("zZ", "ND"), "A in GM as zZ fractals (host-side) or ND, converted by Load2D on chip"),
            Knob("lowering", ("tik", "tir"), "emit the program directly (tik) or lower a TVM schedule whose "
                 "tensorized blocks are the instructions (tir)"),
        ]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        sp = {k.name: k.values for k in self.space(wl, target)}
        out = []
        for mt in sorted(sp["m_tile"], key=lambda v: abs(v - 256)):
            for nt in sorted(sp["n_tile"], key=lambda v: abs(v - 256)):
                for kt in sorted(sp["k_tile"], key=lambda v: abs(v - 128)):
                    out.append({"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1,
                                "block_dim": target.cores, "a_layout": "zZ", "lowering": "tik"})
        return out

    def _tiles(self, wl: Workload, target: Target, cfg: Mapping) -> CubeTiles | None:
        m0, k0, n0 = cube_dtype(wl, target)
        slots = 2 if cfg["double_buffer"] else 1
        mt1, kt1, nt1 = cfg["m_tile"] // m0, cfg["k_tile"] // k0, cfg["n_tile"] // n0
        ch = l0_chunks(machine(target), wl.dtype, mt1, kt1, nt1, slots)
        if ch is None:
            return None
        return CubeTiles(mt1, kt1, nt1, ch[0], ch[1], slots)

    def _cslots(self, target: Target, t: CubeTiles) -> int:
        one = t.nt1 * t.mt1 * 16 * 16 * 4
        return 2 if t.slots == 2 and 2 * one <= machine(target).level("L0C").capacity else 1

    def lowering(self, wl: Workload, target: Target, cfg: Mapping) -> str:
        """The route of a config: its `lowering` knob, or when absent the TVM schedule (tir)
        wherever it covers the config and the direct emitter (tik) elsewhere."""
        if cfg.get("lowering"):
            return cfg["lowering"]
        from .matmul_tir import tir_buffers, unsupported

        if unsupported(wl) is None and over_capacity(target, tir_buffers(wl, target, cfg)) is None:
            return "tir"
        return "tik"

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        if self.lowering(wl, target, config) == "tir":
            from .matmul_tir import unsupported

            why = unsupported(wl)
            if why is not None:
                return why
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        m0, k0, n0 = cube_dtype(wl, target)
        if self.lowering(wl, target, cfg) == "tir":  # what the TIR lowering allocates
            from .matmul_tir import tir_buffers

            return tir_buffers(wl, target, cfg)
        isz = np.dtype(wl.dtype).itemsize
        frac = m0 * k0 * isz
        t = self._tiles(wl, target, cfg)
        mt1, kt1, nt1 = cfg["m_tile"] // m0, cfg["k_tile"] // k0, cfg["n_tile"] // n0
        slots = 2 if cfg["double_buffer"] else 1
        if t is None:
            return [("L0A", "A_L0A", mt1 * frac * slots + machine(target).level("L0A").capacity)]
        out = []
        for s in range(slots):
            out += [("L1", f"A_L1_{s}", mt1 * kt1 * frac), ("L1", f"B_L1_{s}", kt1 * nt1 * frac)]
            out += [("L0A", f"A_L0A_{s}", mt1 * t.k0c * frac), ("L0B", f"B_L0B_{s}", t.k0c * t.n0c * frac)]
        out += [("L0C", f"C_L0C_{s}", nt1 * mt1 * 16 * 16 * 4) for s in range(self._cslots(target, t))]
        out += self._ub(wl, target, cfg, t)[0]
        return out

    def _ub(self, wl: Workload, target: Target, cfg: Mapping, t: CubeTiles):
        m = machine(target)
        bias = wl.op in ("matmul_bias_relu", "matmul_bias")
        osz = np.dtype(OUT[wl.dtype]).itemsize
        cast = OUT[wl.dtype] != ACC[wl.dtype]
        bufs = []
        if bias:
            bufs += [("UB", "bias_ub", t.nt1 * 16 * np.dtype(wl.dtype if wl.dtype != "int8" else "int32").itemsize)]
            if cast:
                bufs += [("UB", "bias32_ub", t.nt1 * 16 * 4)]
        rows = t.mt1 * 16
        g = epilogue_group(m, t.nt1, rows, 4, osz if cast else 0, t.slots, m.level("UB").capacity // 2)
        for s in range(t.slots):
            bufs.append(("UB", f"acc_ub_{s}", g * rows * 16 * 4))
            if cast:
                bufs.append(("UB", f"out_ub_{s}", g * rows * 16 * osz))
        return bufs, g

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Plan:
        if self.lowering(wl, target, cfg) == "tir":
            from .matmul_tir import tir_plan, unsupported

            why = unsupported(wl)
            if why is not None:
                raise OpcError(why, arg="--config", value=dict(cfg), expected="lowering=tik")
            return tir_plan(wl, target, cfg)
        m = machine(target)
        M1, K1, N1, m0, k0, n0 = _dims(wl, target)
        t = self._tiles(wl, target, cfg)
        if t is None:
            from opcompiler.errors import CapacityError
            lv = m.level("L0A")
            raise CapacityError("A_L0A", "L0A", cfg["m_tile"] * k0 * np.dtype(wl.dtype).itemsize * 2, lv.capacity,
                                "one K fractal of the m tile per ping-pong slot does not fit")
        dt, acc, odt = wl.dtype, ACC[wl.dtype], OUT[wl.dtype]
        bias = wl.op in ("matmul_bias_relu", "matmul_bias")
        bdt = "int32" if dt == "int8" else dt
        cast = odt != acc
        tiles_n, tiles_m = ceil_div(N1, t.nt1), ceil_div(M1, t.mt1)
        tiles = [(ni, mi) for ni in range(tiles_n) for mi in range(tiles_m)]
        active = min(cfg["block_dim"], len(tiles))
        cslots = self._cslots(target, t)
        ub_bufs, g = self._ub(wl, target, cfg, t)
        frac_shape = (16, k0)

        def program(core: int):
            kb = KernelBuilder(m, core, active)
            nd = cfg["a_layout"] == "ND"
            A = kb.gm("A", (M1 * m0, K1 * k0) if nd else (M1, K1) + frac_shape, dt)
            B = kb.gm("B", (K1, N1, n0, k0), dt)
            C = kb.gm("C", (N1, M1 * m0, n0), odt)
            bias_gm = kb.gm("bias", (N1, n0), bdt) if bias else None
            a_l1 = [kb.alloc("L1", f"A_L1_{s}", (t.mt1 * m0, t.kt1 * k0) if nd else (t.mt1, t.kt1) + frac_shape, dt)
                    for s in range(t.slots)]
            b_l1 = [kb.alloc("L1", f"B_L1_{s}", (t.kt1, t.nt1, n0, k0), dt) for s in range(t.slots)]
            l0a = [kb.alloc("L0A", f"A_L0A_{s}", (t.mt1, t.k0c) + frac_shape, dt) for s in range(t.slots)]
            l0b = [kb.alloc("L0B", f"B_L0B_{s}", (t.k0c, t.n0c, n0, k0), dt) for s in range(t.slots)]
            l0c = [kb.alloc("L0C", f"C_L0C_{s}", (t.nt1, t.mt1 * m0, n0), acc) for s in range(cslots)]
            bias_ub = kb.alloc("UB", "bias_ub", (t.nt1, n0), bdt) if bias else None
            bias32 = kb.alloc("UB", "bias32_ub", (t.nt1, n0), acc) if bias and cast else bias_ub
            acc_ub = [kb.alloc("UB", f"acc_ub_{s}", (g, t.mt1 * m0, n0), acc) for s in range(t.slots)]
            out_ub = [kb.alloc("UB", f"out_ub_{s}", (g, t.mt1 * m0, n0), odt) for s in range(t.slots)] if cast else None
            lo, hi = split_even(len(tiles), active, core)
            l1i, counter, ecount, cur_n = 0, [0, 0], [0], -1
            for ti, (ni, mi) in enumerate(tiles[lo:hi]):
                n1s, m1s = ni * t.nt1, mi * t.mt1
                nt, mt = min(t.nt1, N1 - n1s), min(t.mt1, M1 - m1s)
                c = l0c[ti % cslots]
                if bias and ni != cur_n:
                    kb.data_move(bias_ub, (slice(0, nt),), bias_gm, (slice(n1s, n1s + nt),))
                    if cast:
                        kb.vec("conv", _v(bias32), (_v(bias_ub),), nt * n0)
                    cur_n = ni
                for ks in range(0, K1, t.kt1):
                    kt = min(t.kt1, K1 - ks)
                    al, bl = a_l1[l1i % t.slots], b_l1[l1i % t.slots]
                    l1i += 1
                    if nd:
                        kb.data_move(al, (slice(0, mt * m0), slice(0, kt * k0)), A,
                                     (slice(m1s * m0, (m1s + mt) * m0), slice(ks * k0, (ks + kt) * k0)))
                    else:
                        kb.data_move(al, (slice(0, mt), slice(0, kt)), A, (slice(m1s, m1s + mt), slice(ks, ks + kt)))
                    kb.data_move(bl, (slice(0, kt), slice(0, nt)), B, (slice(ks, ks + kt), slice(n1s, n1s + nt)))
                    from .common import cube_k_step
                    def load_nd(a, kc, kn, al=al, mt=mt):
                        kb.data_move(a, (slice(0, mt), slice(0, kn)), al,
                                     (slice(0, mt * m0), slice(kc * k0, (kc + kn) * k0)), transform="nd2zz")

                    cube_k_step(kb, t, al, bl, l0a, l0b, c, kt, mt, nt, ks == 0, counter, load_nd if nd else None)
                    kb.loop()

                def write(ub, j, gn, n1s=n1s, m1s=m1s, mt=mt):
                    kb.data_move(C, (slice(n1s + j, n1s + j + gn), slice(m1s * m0, (m1s + mt) * m0)),
                                 ub, (slice(0, gn), slice(0, mt * m0)))

                acc_steps = [EpStep("add", bias32)] if bias else []
                out_steps = [EpStep("relu")] if wl.op == "matmul_bias_relu" else []
                if not cast:
                    acc_steps, out_steps = acc_steps + out_steps, []
                    acc_steps = [s for s in acc_steps if s.op != "relu"]
                    out_steps = [EpStep("relu")] if wl.op == "matmul_bias_relu" else []
                epilogue(kb, c, nt, mt * m0, acc_ub, out_ub, g, ecount, acc_steps, out_steps, write)
                kb.loop()
            return kb.finish(gm_inputs=("A", "B", "bias"))

        trans_a, trans_b = bool(wl.p.get("trans_a")), bool(wl.p.get("trans_b"))
        M, K, N = wl["m"], wl["k"], wl["n"]

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            a = inputs[0].T if trans_a else inputs[0]
            b = inputs[1].T if trans_b else inputs[1]
            a = pad_to(pad_to(a, 0, M1 * m0), 1, K1 * k0)
            b = pad_to(pad_to(b, 0, K1 * k0), 1, N1 * n0)
            a_gm = a if cfg["a_layout"] == "ND" else a.reshape(M1, m0, K1, k0).transpose(0, 2, 1, 3)
            gm = {"A": np.ascontiguousarray(a_gm),
                  "B": np.ascontiguousarray(b.reshape(K1, k0, N1, n0).transpose(0, 2, 3, 1))}
            if bias:
                gm["bias"] = pad_to(inputs[2].astype(bdt), 0, N1 * n0).reshape(N1, n0)
            return gm

        def unpack(c: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(c.transpose(1, 0, 2).reshape(M1 * m0, N1 * n0)[:M, :N])

        return Plan(active_cores=active, make_program=program, pack=pack, out_name="C",
                    out_shape=(N1, M1 * m0, n0), out_dtype=odt, unpack=unpack, flops=get_op(wl.op).flops(wl),
                    unit="cube", info={"gm_layouts": {"A": "zZ fractals (M1,K1,16,K0)" if cfg["a_layout"] == "zZ" else
                                                      "ND zero-padded to 16 (converted to zZ by Load2D, counted)",
                                                      "B": "FRACTAL_Z (K1,N1,16,K0)",
                                                      "C": "NZ (N1,M,16)"},
                                       "padding_waste": round(1 - (M * K * N) / (M1 * m0 * K1 * k0 * N1 * n0), 4)})

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
        occ = {}
        for level, _, nbytes in self.buffers(wl, target, cfg):
            occ[level] = occ.get(level, 0) + nbytes
        m = machine(target)
        return {"gm_read_bytes": gm_read, "gm_write_bytes": gm_write,
                "arith_intensity": flops / (gm_read + gm_write), "tiles": tiles, "k_steps": tk,
                "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores),
                "alignment_waste": 1 - (wl["m"] * wl["k"] * wl["n"]) / (M1 * m0 * K1 * k0 * N1 * n0),
                "edge_waste": 1 - (M1 * N1) / (tm * mt1 * tn * nt1),
                **{f"occupancy_{lv}": occ.get(lv, 0) / m.level(lv).capacity
                   for lv in ("L1", "L0A", "L0B", "L0C", "UB")},
                "dma_count": tiles * tk * 2, "mmad_flops_per_core": flops / cores}


def _v(buf):
    from opcompiler.backend.ascend.isa import VOp
    return VOp(buf)
