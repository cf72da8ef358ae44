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

Every config is built as a TVM s_tir schedule (`schedule`, below); `apply` returns it as a
`Scheduled` the backend lowers (its `lower.py`, lowering "gemm"). Template v2: the directly emitted
(TIK-style) program and the `lowering` knob are retired; the TIR route took every config the emitter
took, with equal or fewer cycles (`benchmarks/tir_parity.py`).

The schedule: an `s_tir.Schedule` over the catalogue's TE compute, padded to the tiles (pad_einsum),
buffers placed in the target's scopes, every inner block an AI Core instruction.

    loops                 n tile, m tile (the output tile), k step, L0 chunk of k, L0 chunk of n
    A, B                  the padding copies (or cache_read) -> local.L1 at the k step (MTE2 DMA),
                          cache_read -> local.L0A at the k chunk, local.L0B at the n chunk (Load2D)
    matmul (fp32 reduce)  -> local.L0C (cache_write; tensorized MMAD per chunk), copied to local.UB
    reduction init        -> decompose_reduction, tensorized: the tile's first MMADs overwrite L0C
    matmul_bias, matmul_out (cast), vrelu
                          -> reverse_compute_at the output tile, in UB; the last block writes GM

MMAD and the reduction init go through `sch.tensorize`; the DMA, Load2D, L0C -> UB and epilogue
blocks carry the padding / unpadding predicates of partial tiles, which TVM's structural
matcher cannot take, so each is substituted by the same `opc.ascend.tir.event` call with the
GEMM coordinates TVM computed for it (the intrinsics and `substitute` are the backend's
`opcompiler.backend.ascend.intrin`). This module only builds the schedule and packs the GM inputs
(A zZ fractals or ND, B FRACTAL_Z, C NZ): `scheduled` hands the backend a `Scheduled` (lowering
"gemm"), whose `lower.py` compiles and traces the module and turns the trace into each core's
program.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.ops import get_op
from opcompiler.ops.steps import lowerable
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import (
    CUBE_DTYPES,
    CubeTemplate,
    ceil_div,
    core_values,
    cube_chunks,
    cube_dtype,
    epilogue_channels,
    machine,
    pad_to,
    tile_values,
    tir_epilogue_at,
)

# the epilogue steps (`opcompiler.ops.steps`) the cube lowering has, in its pipeline's order; a
# matmul-family op runs here when its catalogue entry's `epilogue` is made of them
EPI_STEPS = {"bias": "bias", "relu": "relu"}
EPI_TAGS = {"matmul_bias": "bias", "matmul_out": "cast", "vrelu": "relu", "matmul_pad": "out"}


DTYPES = CUBE_DTYPES  # K0, accumulator, element bytes


def unsupported(wl: Workload) -> str | None:
    op = get_op(wl.op)
    if op.family != "matmul" or epilogue(wl) is None or wl.dtype not in DTYPES:
        return (f"the ascend matmul template covers fp16 / int8 matmul with epilogue steps among "
                f"{', '.join(EPI_STEPS)} (in that order); {wl.op} {wl.dtype} has {op.epilogue or 'none'}")
    return None


def epilogue(wl: Workload) -> tuple[str, ...] | None:
    """The op's epilogue in this template's names (bias, relu), or None when a step has no lowering."""
    return lowerable(get_op(wl.op).epilogue_steps(wl), EPI_STEPS, ordered=True)


chunks = cube_chunks  # (k, n) elements of one L0 chunk of the tile, or None


def tir_buffers(wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
    """(level, name, bytes) of what the TIR lowering allocates, for the template's capacity check."""
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    k0, _, isz = DTYPES[wl.dtype]
    cast = wl.dtype == "float16"
    sl = 2 if cfg["double_buffer"] else 1
    ch = chunks(wl, target, cfg)
    if ch is None:
        return [("L0A", "A_L0A", mt * k0 * isz * sl + machine(target).level("L0A").capacity)]
    kc, nc = ch
    bias = "bias" in (epilogue(wl) or ())
    cs = intrin.l0c_slots(machine(target), sl == 2, mt * nt * 4)
    g16 = epilogue_channels(wl, target, cfg)
    out = [b for s in range(sl) for b in (("L1", f"A_L1_{s}", mt * kt * isz), ("L1", f"B_L1_{s}", kt * nt * isz))]
    out += [b for s in range(sl) for b in (("L0A", f"A_L0A_{s}", mt * kc * isz),
                                           ("L0B", f"B_L0B_{s}", kc * nc * isz))]
    out += [("L0C", f"C_L0C_{s}", mt * nt * 4) for s in range(cs)]
    for s in range(sl):
        out += [("UB", f"acc_UB_{s}", mt * g16 * 4)] + ([("UB", f"out_UB_{s}", mt * g16 * 2)] if cast else [])
    if bias:
        out += [("UB", "bias_UB", nt * (2 if cast else 4))] + ([("UB", "bias32_UB", nt * 4)] if cast else [])
    return out


L1, L0A, L0B, L0C, UB = intrin.L1, intrin.L0A, intrin.L0B, intrin.L0C, intrin.UB_SCOPE


def stage_operands(sch, mm, k0, k1, j1) -> tuple[list, Any, Any, Any]:
    """A and B through the cube's levels, for matmul and batch_matmul alike: GM -> L1 at the k step
    `k0` (pad_einsum's padding copy where it made one, else a cache_read), L1 -> L0A at the k chunk
    `k1`, L1 -> L0B at the n chunk `j1`; then the reduction init split off at the k step as one
    (mt, nt) init of the whole tile. ([A's L1 block, B's], the L0A block, the L0B block, the init)."""
    from tvm.s_tir.schedule.analysis import has_block

    l1 = []
    for idx, name in ((0, "tensor_a_pad"), (1, "tensor_b_pad")):
        if has_block(sch, name):  # the padding copy is the GM -> L1 DMA
            blk = sch.get_sblock(name)
            sch.set_scope(blk, 0, L1)
        else:
            blk = sch.cache_read(mm, idx, L1)
        l1.append(blk)
    a0, b0 = sch.cache_read(mm, 0, L0A), sch.cache_read(mm, 1, L0B)
    sch.compute_at(a0, k1)  # consumers first
    sch.compute_at(b0, j1)
    sch.compute_at(l1[0], k0)  # A's DMA first in the k step, then B's (as the direct template)
    sch.compute_at(l1[1], k0)
    init = sch.decompose_reduction(mm, k0)
    ij = sch.get_loops(init)[-3:]  # (n chunk, row, n in chunk): one (mt, nt) init of the whole tile
    sch.reorder(ij[1], ij[0])
    sch.fuse(ij[0], ij[2])
    return l1, a0, b0, init


def tensorize_gemm(sch, mm, loops: tuple, l0c, epi: list[tuple[Any, str]], dtype: str,
                   tiles: tuple[int, int, int, int], lead: int = 0, b_lead: int | None = None) -> None:
    """The GEMM's operands staged (`stage_operands` at `loops`: k0, k1, j1), its L0C init and
    mmad tensorized (`tiles`: mt, nt, kc, nc; `lead`, `b_lead`: the intrinsics' leading unit
    axes, batch_matmul's) and the copies and epilogue blocks (`epi`: (block, event)) substituted
    by their events."""
    mt, nt, kc, nc = tiles
    l1, a0, b0, init = stage_operands(sch, mm, *loops)
    _, acc, _ = DTYPES[dtype]
    sch.tensorize(sch.get_loops(init)[-2], intrin.intrin_init(mt, nt, acc, lead=lead))
    sch.tensorize(sch.get_loops(mm)[-3], intrin.intrin_mmad(mt, kc, nc, dtype, acc, lead=lead, b_lead=b_lead))
    for blk, tag in [(l1[0], "dma_a"), (l1[1], "dma_b"), (a0, "ld_a"), (b0, "ld_b"), (l0c, "l0c")] + epi:
        intrin.substitute(sch, blk, 2, tag)


def schedule(wl: Workload, mp: int, kp: int, np_: int, mt: int, kt: int, nt: int, kc: int, nc: int, g16: int):
    """The (16-padded) matmul's s_tir schedule; (module, argument specs)."""
    import tvm
    from tvm import te
    from tvm.s_tir.schedule.analysis import has_block

    padded = Workload.make(wl.op, {**dict(wl.params), "m": mp, "k": kp, "n": np_, "trans_a": 0, "trans_b": 0},
                           wl.dtype)
    ins, out = get_op(wl.op).compute(padded)
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    mm = sch.get_sblock("matmul")
    epi = [(name, sch.get_sblock(name)) for name in ("matmul_bias", "matmul_out", out.op.name)
           if name in EPI_TAGS and has_block(sch, name)]
    epi = list(dict(epi).items())  # the output block may be matmul_out itself
    sch.pad_einsum(mm, [mt, nt, kt])
    if has_block(sch, "matmul_pad") and epi:  # the epilogue reads the padded GEMM result directly
        sch.compute_inline(sch.get_sblock("matmul_pad"))
    elif has_block(sch, "matmul_pad"):  # int8 matmul: the unpadding copy is the output block
        epi = [("matmul_pad", sch.get_sblock("matmul_pad"))]
    i, j, k = sch.get_loops(mm)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1, j2 = sch.split(j, [None, nt // nc, nc])
    k0, k1, k2 = sch.split(k, [None, kt // kc, kc])
    sch.reorder(j0, i0, k0, k1, j1, i1, j2, k2)  # n tiles outermost, as the direct template
    l0c = sch.cache_write(mm, 0, L0C)  # the copy block is the L0C -> UB move
    if epi:  # (an int8 matmul of a 16-aligned shape has none: the copy writes GM, lowered L0C -> UB -> GM)
        sch.set_scope(l0c, 0, UB)
    tir_epilogue_at(sch, l0c, [blk for _, blk in epi], i0, nt, g16)  # producers first
    for _, blk in epi[:-1]:  # the last epilogue block writes GM
        sch.set_scope(blk, 0, UB)
    tensorize_gemm(sch, mm, (k0, k1, j1), l0c, [(blk, EPI_TAGS[name]) for name, blk in epi], wl.dtype,
                   (mt, nt, kc, nc))
    return sch.mod, [([int(s) for s in t.shape], str(t.dtype)) for t in (*ins, out)]


def gemm_sizes(wl: Workload) -> tuple[int, str, tuple[int, int, int], tuple[int, int, int]]:
    """A (batch) GEMM's K0, output dtype, fractal counts (M1, K1, N1) and padded (M, K, N)."""
    k0, _, _ = DTYPES[wl.dtype]
    out_dt = "float16" if wl.dtype == "float16" else "int32"
    M1, K1, N1 = ceil_div(wl["m"], 16), ceil_div(wl["k"], k0), ceil_div(wl["n"], 16)
    return k0, out_dt, (M1, K1, N1), (M1 * 16, K1 * k0, N1 * 16)


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    """The config's scheduled matmul for the backend's "gemm" lowering (see the module docstring)."""
    M, K, N = wl["m"], wl["k"], wl["n"]
    k0, out_dt, (M1, K1, N1), (mp, kp, np_) = gemm_sizes(wl)
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    ch = chunks(wl, target, cfg)  # None: the capacity dry-run (`buffers`) refuses the config before TVM
    has_bias = "bias" in (epilogue(wl) or ())
    nd = cfg.get("a_layout") == "ND"
    g16 = epilogue_channels(wl, target, cfg)
    trans_a, trans_b = bool(wl.p.get("trans_a")), bool(wl.p.get("trans_b"))

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        a = inputs[0].T if trans_a else inputs[0]
        b = inputs[1].T if trans_b else inputs[1]
        a = pad_to(pad_to(a, 0, M1 * 16), 1, K1 * k0)
        b = pad_to(pad_to(b, 0, K1 * k0), 1, N1 * 16)
        gm = {"A": np.ascontiguousarray(a if nd else a.reshape(M1, 16, K1, k0).transpose(0, 2, 1, 3)),
              "B": np.ascontiguousarray(b.reshape(K1, k0, N1, 16).transpose(0, 2, 3, 1))}
        if has_bias:
            gm["bias"] = pad_to(inputs[2].astype(out_dt), 0, N1 * 16).reshape(N1, 16)
        return gm

    def unpack(c: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(c.transpose(1, 0, 2).reshape(M1 * 16, N1 * 16)[:M, :N])

    key = ("ascend.matmul", wl.op, wl.dtype, mp, kp, np_, mt, kt, nt, *(ch or (None, None)), g16)
    return Scheduled(
        lowering="gemm", key=key,
        module=lambda: schedule(wl, mp, kp, np_, mt, kt, nt, *ch, g16),
        params={"dims": (mp, kp, np_), "tiles": (mt, kt, nt), "chunks": ch, "slots": 2 if cfg["double_buffer"] else 1,
                "bias": has_bias, "a_nd": nd, "group": g16, "dtype": wl.dtype, "block_dim": cfg["block_dim"]},
        host=HostLayout(pack=pack, unpack=unpack, out_name="C", out_shape=(N1, M1 * 16, 16), out_dtype=out_dt),
        buffers=tir_buffers(wl, target, cfg), flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": {"A": "ND zero-padded to 16 (converted to zZ by Load2D, counted)"
                             if nd else "zZ fractals (M1,K1,16,K0)", "B": "FRACTAL_Z (K1,N1,16,K0)", "C": "NZ (N1,M,16)"},
              "padding_waste": round(1 - (M * K * N) / (M1 * K1 * N1 * 256 * k0), 4)})


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
        return sys.modules[__name__]  # unsupported, tir_buffers (the capacity check), scheduled (apply)

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
