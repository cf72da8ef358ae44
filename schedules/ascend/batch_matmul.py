"""batch_matmul on the cube: the matmul template's schedule (`matmul.py`) under a
batch loop.

    FOR batch, n tile, m tile (batches x output tiles, split over `block_dim` cores)
      FOR k step:  A[b, m, k] -> A_L1, B[b, k, n] (B[k, n] when shared) -> B_L1      (MTE2)
                   L1 -> L0A / L0B in chunks that fit L0                          (MTE1)
                   C_L0C (+)= A_L0A x B_L0B                                       (M)
      C_L0C -> UB, cast (V), UB -> C[b]                                           (MTE3)

The TE compute has the batch axis; pad_einsum pads each batch's GEMM to the tiles (the batch
itself by 1), the batch loop is outermost and every block under it is the matmul's, the batch
coordinate leading its event. GM layouts (host-side preprocessing): A (b, M1, K1, 16, K0) zZ
fractals, or (b, M1*16, K1*K0) ND with `a_layout="ND"`; B (b, K1, N1, 16, K0) FRACTAL_Z, or
(K1, N1, 16, K0) once for every batch with `bcast_b`; C (b, N1, M1*16, 16) NZ. The transpose
flags are taken by the host packing, as matmul's. The backend lowers it with the GEMM lowering
("gemm", `GemmLowering` with `batch`); the cores share the batches' output tiles evenly.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Scheduled, register_template
from opcompiler.workload import Workload

from .common import CUBE_DTYPES, ceil_div, cube_chunks, epilogue_channels, pad_to, tir_epilogue_at
from .matmul import AscendMatmul, _dims, gemm_sizes, tensorize_gemm
from .matmul import tir_buffers  # noqa: F401  (the same buffers: a batch adds none on chip)

EPI_TAGS = {"matmul_out": "cast", "matmul_pad": "out"}
L0C, UB = intrin.L0C, intrin.UB_SCOPE


def unsupported(wl: Workload) -> str | None:
    if wl.op != "batch_matmul" or wl.dtype not in CUBE_DTYPES:
        return "the ascend batch_matmul template covers fp16 / int8 batch_matmul only"
    return None


def schedule(wl: Workload, mp: int, kp: int, np_: int, mt: int, kt: int, nt: int, kc: int, nc: int, g16: int):
    """The (16-padded) batched GEMM's s_tir schedule; (module, argument specs). Loops: batch, n tile,
    m tile, k step, L0 chunk of k, L0 chunk of n, as matmul's under the batch."""
    import tvm
    from tvm import te
    from tvm.s_tir.schedule.analysis import has_block

    bc = bool(wl["bcast_b"])
    padded = Workload.make(wl.op, {**dict(wl.params), "m": mp, "k": kp, "n": np_, "trans_a": 0, "trans_b": 0},
                           wl.dtype)
    ins, out = get_op(wl.op).compute(padded)
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    mm = sch.get_sblock("matmul")
    epi = [("matmul_out", sch.get_sblock("matmul_out"))] if has_block(sch, "matmul_out") else []
    sch.pad_einsum(mm, [1, mt, nt, kt])
    if has_block(sch, "matmul_pad") and epi:  # the cast reads the padded GEMM result directly
        sch.compute_inline(sch.get_sblock("matmul_pad"))
    elif has_block(sch, "matmul_pad"):  # int8: the unpadding copy is the output block
        epi = [("matmul_pad", sch.get_sblock("matmul_pad"))]
    z, i, j, k = sch.get_loops(mm)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1, j2 = sch.split(j, [None, nt // nc, nc])
    k0, k1, k2 = sch.split(k, [None, kt // kc, kc])
    sch.reorder(z, j0, i0, k0, k1, j1, i1, j2, k2)
    l0c = sch.cache_write(mm, 0, L0C)  # the copy block is the L0C -> UB move
    if epi:
        sch.set_scope(l0c, 0, UB)
    tir_epilogue_at(sch, l0c, [blk for _, blk in epi], i0, nt, g16)
    tensorize_gemm(sch, mm, (k0, k1, j1), l0c, [(blk, EPI_TAGS[name]) for name, blk in epi], wl.dtype,
                   (mt, nt, kc, nc), lead=1, b_lead=0 if bc else 1)
    return sch.mod, [([int(s) for s in t.shape], str(t.dtype)) for t in (*ins, out)]


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    """The config's scheduled batch_matmul for the backend's "gemm" lowering (module docstring)."""
    nb, M, K, N = wl["b"], wl["m"], wl["k"], wl["n"]
    k0, out_dt, (M1, K1, N1), (mp, kp, np_) = gemm_sizes(wl)
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    ch = cube_chunks(wl, target, cfg)  # None: the capacity dry-run (`buffers`) refuses the config before TVM
    nd = cfg.get("a_layout") == "ND"
    g16 = epilogue_channels(wl, target, cfg)
    ta, tb, bc = bool(wl["trans_a"]), bool(wl["trans_b"]), bool(wl["bcast_b"])

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        a = inputs[0].transpose(0, 2, 1) if ta else inputs[0]
        b = inputs[1]
        if tb:
            b = b.T if bc else b.transpose(0, 2, 1)
        a = pad_to(pad_to(a, 1, mp), 2, kp)
        b = pad_to(pad_to(b, b.ndim - 2, kp), b.ndim - 1, np_)
        lead = b.shape[:-2]
        return {"A": np.ascontiguousarray(a if nd else a.reshape(nb, M1, 16, K1, k0).transpose(0, 1, 3, 2, 4)),
                "B": np.ascontiguousarray(b.reshape(*lead, K1, k0, N1, 16).swapaxes(-3, -2).swapaxes(-2, -1))}

    def unpack(c: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(c.transpose(0, 2, 1, 3).reshape(nb, mp, np_)[:, :M, :N])

    key = ("ascend.batch_matmul", wl.dtype, nb, bc, mp, kp, np_, mt, kt, nt, *(ch or (None, None)), g16)
    return Scheduled(
        lowering="gemm", key=key,
        module=lambda: schedule(wl, mp, kp, np_, mt, kt, nt, *ch, g16),
        params={"dims": (mp, kp, np_), "tiles": (mt, kt, nt), "chunks": ch, "slots": 2 if cfg["double_buffer"] else 1,
                "bias": False, "a_nd": nd, "group": g16, "dtype": wl.dtype, "block_dim": cfg["block_dim"],
                "batch": nb, "bcast_b": bc},
        host=HostLayout(pack=pack, unpack=unpack, out_name="C", out_shape=(nb, N1, mp, 16), out_dtype=out_dt),
        buffers=tir_buffers(wl, target, cfg), flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": {"A": "ND zero-padded to 16, (b,M,K) (converted to zZ by Load2D, counted)"
                             if nd else "zZ fractals (b,M1,K1,16,K0)",
                             "B": "FRACTAL_Z (K1,N1,16,K0), one for every batch" if bc else "FRACTAL_Z (b,K1,N1,16,K0)",
                             "C": "NZ (b,N1,M,16)"},
              "padding_waste": round(1 - (M * K * N) / (M1 * K1 * N1 * 256 * k0), 4)})


@register_template
class AscendBatchMatmul(AscendMatmul):
    """matmul's knobs (m / k / n tiles of 16-aligned fractals, double buffering, cores, A's layout);
    the batches' output tiles are what the cores share."""

    name = "ascend.batch_matmul"
    op_families = ("batch_matmul",)
    version = 1

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Every tiling, best first by a rule fitted to sweeps of attention-like shapes (within
        11 % of the sweep's best on each, 1.5 % on their geometric mean): while the batches'
        output tiles do not give every core one, the most tiles; then the tile nearest 128 x 64
        (m x n; the small GEMMs are bound by each tile's load latency, not the cube), K in one
        step up to 256 (else steps of 256)."""
        sp = {k.name: k.values for k in self.space(wl, target)}
        M1, K1, N1, m0, k0, n0 = _dims(wl, target)
        mp, kp, np_ = M1 * m0, K1 * k0, N1 * n0
        kwant = min((v for v in sp["k_tile"] if v >= min(kp, 256)), default=max(sp["k_tile"]))
        out = [{"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1, "block_dim": target.cores,
                "a_layout": "zZ"} for mt in sp["m_tile"] for nt in sp["n_tile"] for kt in sp["k_tile"]]

        def rank(c: dict) -> tuple:
            tiles = wl["b"] * ceil_div(mp, c["m_tile"]) * ceil_div(np_, c["n_tile"])
            near = abs(np.log2(min(c["m_tile"], mp) / 128)) + abs(np.log2(min(c["n_tile"], np_) / 64))
            k = (c["k_tile"] < kwant, abs(c["k_tile"] - kwant))
            return (1, -tiles, near, k) if tiles < target.cores else (0, 0, near, k)
        return sorted(out, key=rank)

    def tir(self) -> Any:
        return sys.modules[__name__]

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        f = dict(super().features(wl, target, config))
        nb, shared = wl["b"], bool(wl["bcast_b"])
        cfg = self.config(wl, target, config)
        tiles = nb * f["tiles"]
        cores = min(cfg["block_dim"], tiles)
        flops = nb * f["mmad_flops_per_core"] * f["active_cores"]
        gm_read = nb * f["gm_read_bytes"]
        gm_write = nb * f["gm_write_bytes"]
        return {**f, "gm_read_bytes": gm_read, "gm_write_bytes": gm_write,
                "arith_intensity": flops / (gm_read + gm_write), "tiles": tiles, "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "dma_count": nb * f["dma_count"],
                "mmad_flops_per_core": flops / cores, "bcast_b": float(shared)}


__all__ = ["AscendBatchMatmul", "scheduled", "schedule", "tir_buffers", "unsupported"]
