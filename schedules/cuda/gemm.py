"""The schedule core shared by the CUDA matmul and conv2d templates.

Both ops are first normalized to one GEMM, C[S, I, J] += A[S, I, K] * B[S, J, K] (a conv
becomes an implicit GEMM: I = batch x output pixels, J = output channels, K = input channels x
window; the im2col gather is never materialized, it happens in the global -> shared copy).
Then one of two schedules tiles it:

- `schedule_tensor_core` (fp16): thread blocks of `block_row_warps x block_col_warps` warps,
  each warp owning `warp_row_tiles x warp_col_tiles` 16x16 accumulator fragments; A and B
  staged through shared memory `chunk` 16-wide K slices at a time with vectorized loads;
  fragments loaded, multiplied and stored with TVM's registered WMMA intrinsics
  (`tvm.s_tir.tensor_intrin.cuda`, imported through `intrin.py`; m16n16k16, fp16 in, fp32 accumulate), the same fractal
  idea as the Ascend cube. With `stages` > 1 the K loop is software-pipelined
  (`software_pipeline_stage` / `_order` / `_async_stages`): the A and B tiles are
  multi-buffered and filled with `cp.async` (predicated zero-fill for the padded im2col gather)
  `stages - 1` steps ahead of the WMMA work. The epilogue (cast, bias, bn, relu, add) is fused
  into the shared -> global store.
- split-K (`split_k_rfactor`, `schedule_split_k_reduce`; matmul, fp16, mma.sync): K cut into
  slices by rfactor, the slices' fp32 partial sums computed as a batch over blockIdx.z into a
  global workspace, then a second kernel adds them and applies the epilogue (no atomics).
- `schedule_simt` (fp32): classic CUDA-core tiling: `threads_y x threads_x` threads each
  computing a `micro_y x micro_x` register tile, A and B staged through shared memory
  `micro_k` at a time, epilogue fused into the register -> global store.

Resource figures (threads, shared bytes, registers) are computed here from the knobs so the
templates' `check()` can reject a config before it is built; `measured_shared_bytes` reads
the same figure back from the lowered kernel so tests can hold the two together
(`measured_workspace_bytes` and `launch_extents` the split-K workspace and grid).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import tvm
from tvm import s_tir, tirx

from opcompiler.target import Target

FRAG = 16  # WMMA fragment edge (m16n16k16)
SMEM_PAD_HALF = 8  # storage_align offset on the fp16 operand tiles (bank-conflict padding, in elements)


def cuda_limits(target: Target) -> dict[str, int]:
    """The per-block / per-SM limits the templates check, from the target's [extra]."""
    e = target.extra
    return {
        "warp_size": int(e.get("warp_size", 32)),
        "max_threads_per_block": int(e.get("max_threads_per_block", 1024)),
        "max_shared_memory_per_block": int(e.get("max_shared_memory_per_block", 48 * 1024)),
        "max_static_shared_memory_per_block": int(e.get("max_static_shared_memory_per_block", 48 * 1024)),
        "registers_per_sm": int(e.get("registers_per_sm", 65536)),
        "max_registers_per_thread": int(e.get("max_registers_per_thread", 255)),
    }


def arch_of(target: Target) -> int:
    """The target's compute capability as a number (sm_80 -> 80)."""
    digits = "".join(ch for ch in str(target.extra.get("arch", "sm_80")) if ch.isdigit())
    return int(digits or 80)


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


# ------------------------------------------------------------------ tile geometry from knobs

@dataclass(frozen=True, kw_only=True)
class GemmTiles:
    """Tile geometry of one config on one GEMM (M, N, K already normalized)."""

    bm: int  # rows of C per thread block
    bn: int  # columns of C per thread block
    bk: int  # K slice staged in shared memory per step
    threads: int  # threads per block
    m_pad: int
    n_pad: int
    k_pad: int
    shared_bytes: int  # shared memory per block (operand tiles + staging)
    static_shared_bytes: int  # the part allocated statically (`__shared__`), limited to 48 KB by CUDA
    registers: int  # estimated registers per thread (accumulators + operands + addressing)
    split_k: int = 1  # K slices computed as a batch over blockIdx.z (`split_k_rfactor`)
    workspace_bytes: int = 0  # global fp32 partial sums of the split-K slices (0 without split-K)

    @property
    def output_tiles(self) -> int:
        """Thread blocks one K slice needs: the M x N block tiles."""
        return (self.m_pad // self.bm) * (self.n_pad // self.bn)

    @property
    def blocks(self) -> int:
        return self.output_tiles * self.split_k


def tensor_core_tiles(m: int, n: int, k: int, cfg: Mapping[str, Any]) -> GemmTiles:
    """Geometry of the fp16 tensor-core schedule for `cfg`. With `split_k` = s > 1 each thread block
    reduces one of s K slices (k / s long, padded to the block's K step); the partial sums are the
    fp32 workspace [s, m_pad, n_pad] (padded to the block tile: the partial-sum stores need no
    bounds checks) that the reduction kernel reads back (`split_k_rfactor`)."""
    bm = FRAG * cfg["block_row_warps"] * cfg["warp_row_tiles"]
    bn = FRAG * cfg["block_col_warps"] * cfg["warp_col_tiles"]
    bk = FRAG * cfg["chunk"]
    warps = cfg["block_row_warps"] * cfg["block_col_warps"]
    stages = cfg.get("stages", 1)  # pipelined: each operand tile is multi-buffered `stages` times
    a_sh = bm * (bk + SMEM_PAD_HALF) * 2 * stages
    b_sh = bn * (bk + SMEM_PAD_HALF) * 2 * stages
    # WMMA: fp32 accumulators staged (static shared) for the fused epilogue; mma_sync: none (the
    # epilogue runs on the accumulator registers, see `schedule_mma`)
    c_sh = 0 if cfg.get("mma", "wmma") == "mma_sync" else bm * bn * 4
    frags_c = cfg["warp_row_tiles"] * cfg["warp_col_tiles"]
    # a 16x16 fragment spread over 32 lanes is 8 values per thread: fp32 acc 8 regs, fp16 operands 4
    regs = 8 * frags_c + 4 * (cfg["warp_row_tiles"] + cfg["warp_col_tiles"]) + 48
    split = cfg.get("split_k", 1)
    return GemmTiles(bm=bm, bn=bn, bk=bk, threads=32 * warps, m_pad=_ceil(m, bm), n_pad=_ceil(n, bn),
                     k_pad=split * _ceil(-(-k // split), bk), shared_bytes=a_sh + b_sh + c_sh,
                     static_shared_bytes=c_sh, registers=regs, split_k=split,
                     workspace_bytes=split * _ceil(m, bm) * _ceil(n, bn) * 4 if split > 1 else 0)


def simt_tiles(m: int, n: int, k: int, cfg: Mapping[str, Any]) -> GemmTiles:
    """Geometry of the fp32 CUDA-core schedule for `cfg`."""
    bm = cfg["threads_y"] * cfg["micro_y"]
    bn = cfg["threads_x"] * cfg["micro_x"]
    bk = cfg["micro_k"]
    a_sh = bm * (bk + cfg["vec"]) * 4
    b_sh = bn * (bk + cfg["vec"]) * 4
    regs = cfg["micro_y"] * cfg["micro_x"] + cfg["micro_y"] + cfg["micro_x"] + 30
    return GemmTiles(bm=bm, bn=bn, bk=bk, threads=cfg["threads_x"] * cfg["threads_y"], m_pad=_ceil(m, bm),
                     n_pad=_ceil(n, bn), k_pad=_ceil(k, bk), shared_bytes=a_sh + b_sh, static_shared_bytes=a_sh + b_sh,
                     registers=regs)


def check_tiles(t: GemmTiles, target: Target) -> str | None:
    """Why these tiles cannot run on `target` (threads, shared memory, registers), or None."""
    lim = cuda_limits(target)
    if t.threads > lim["max_threads_per_block"]:
        return f"{t.threads} threads per block exceed the target's {lim['max_threads_per_block']}"
    if t.threads % lim["warp_size"]:
        return f"{t.threads} threads per block is not a multiple of the warp size {lim['warp_size']}"
    if t.shared_bytes > lim["max_shared_memory_per_block"]:
        return (f"needs {t.shared_bytes} B of shared memory per block but {target.name} allows "
                f"{lim['max_shared_memory_per_block']} B")
    if t.static_shared_bytes > lim["max_static_shared_memory_per_block"]:
        return (f"needs {t.static_shared_bytes} B of static shared memory per block but CUDA allows "
                f"{lim['max_static_shared_memory_per_block']} B")
    dynamic = t.shared_bytes - t.static_shared_bytes
    default = lim["max_static_shared_memory_per_block"]
    if t.shared_bytes > default and dynamic < default:
        # TVM's CUDA runtime opts a kernel into more than 48 KB (cuFuncSetAttribute
        # MAX_DYNAMIC_SHARED_SIZE_BYTES) only when its dynamic part alone is 48 KB or more; below
        # that, static + dynamic over 48 KB fails at launch (CUDA_ERROR_INVALID_VALUE, seen on an H100)
        return (f"needs {t.static_shared_bytes} B static + {dynamic} B dynamic shared memory per block: over "
                f"{default} B, which TVM's runtime allows only when the dynamic part alone is {default} B or more")
    if t.registers > lim["max_registers_per_thread"]:
        return f"needs about {t.registers} registers per thread but {target.name} allows {lim['max_registers_per_thread']}"
    if t.registers * t.threads > lim["registers_per_sm"]:
        return (f"{t.threads} threads x about {t.registers} registers exceed the SM's "
                f"{lim['registers_per_sm']} registers")
    return None


# ------------------------------------------------------------------ normalization to one GEMM

def _inline_producers(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers
    auto_inline_producers(sch, block)


def _inline_consumers(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
    auto_inline_consumer_chain(sch, block)


def gemm_dims(func: tirx.PrimFunc, block_name: str) -> tuple[int, int, int]:
    """(M, N, K) of the reduction block once normalized (batch folded into M)."""
    sch = s_tir.Schedule(func)
    normalize_gemm(sch, sch.get_sblock(block_name))
    ext = [int(iv.dom.extent) for iv in sch.get(sch.get_sblock(block_name)).iter_vars]
    return ext[0] * ext[1], ext[2], ext[3]


def _is_one(x: Any) -> bool:
    return isinstance(x, tirx.IntImm) and x.value == 1


def _gemm_index_maps(block: tirx.SBlock) -> tuple | None:
    """Index maps folding the block's iterators into [S, I, J, K] by where they appear: in A, B
    and C -> S; A and C -> I; B and C -> J; reduced over in A and B -> K. Unlike dlight's
    detector, unit-extent axes are classified too, so a matmul with m = 1 or a batch-1 conv
    stays a GEMM."""
    from tvm.s_tir.dlight.gpu.matmul import IterKind, IterTrait, make_iter_fusion_index_map
    if len(block.reads) != 2 or len(block.writes) != 1:
        return None

    def axes(region: Any) -> set:
        return {v for r in region for v in tirx.analysis.undefined_vars(r.min)}

    a, b, c = axes(block.reads[0].region), axes(block.reads[1].region), axes(block.writes[0].region)
    traits = {}
    for iv in block.iter_vars:
        v = iv.var
        if iv.iter_type == tirx.IterVar.DataPar:
            kind = (IterKind.kIter_S if v in a and v in b and v in c else IterKind.kIter_I if v in a and v in c
                    else IterKind.kIter_J if v in b and v in c else None)
        elif iv.iter_type == tirx.IterVar.CommReduce and v in a and v in b and v not in c:
            kind = IterKind.kIter_K
        else:
            kind = None
        if kind is None and _is_one(iv.dom.extent):
            kind = IterKind.kIter_T  # a unit axis the accesses simplified away (1x1 window)
        if kind is None:
            return None
        traits[v] = IterTrait(kind, iv.dom.extent)
    if {IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K} - {t.kind for t in traits.values()}:
        return None
    S, I, J, K = IterKind.kIter_S, IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K

    def of(vs: set) -> list:
        return [traits[iv.var] for iv in block.iter_vars if iv.var in vs]

    return (make_iter_fusion_index_map([traits[iv.var] for iv in block.iter_vars], [S, I, J, K]),
            make_iter_fusion_index_map(of(a), [S, I, K]), make_iter_fusion_index_map(of(b), [S, J, K]),
            make_iter_fusion_index_map(of(c), [S, I, J]))


def k_contiguous(block: tirx.SBlock, operand: int, width: int) -> bool:
    """Whether `width` consecutive K elements of operand `operand` (0 = A, 1 = B) of the original
    reduction block are adjacent in global memory: its innermost index runs over a reduced axis
    whose extent is a multiple of `width`."""
    last = set(tirx.analysis.undefined_vars(block.reads[operand].region[-1].min))
    return any(iv.iter_type == tirx.IterVar.CommReduce and iv.var in last and int(iv.dom.extent) % width == 0
               and int(iv.dom.extent) > 1 for iv in block.iter_vars)


def operand_vectors(block: tirx.SBlock, vec: int, async_copy: bool = False) -> tuple[int, int]:
    """Load widths for A and B: `vec` when the operand's K run is contiguous; for a strided gather
    at most 4 (TVM's CUDA codegen cannot emit an 8-wide fp16 gather), and 1 when the copy is
    asynchronous (`stages` > 1): TVM's cp.async injection turns a vectorized copy into one
    `vec * 2`-byte cp.async from the first element's address, ignoring the gather's stride. On an
    H100 that read the wrong elements from a misaligned address (cudaErrorMisalignedAddress for
    every pipelined matmul / conv whose B operand is N-contiguous); element-wise, the gathered
    operand is copied with plain loads and stores inside the pipelined stage, the contiguous one
    still with cp.async."""
    def width(i: int) -> int:
        if k_contiguous(block, i, vec):
            return vec
        return 1 if async_copy else min(vec, 4)
    return width(0), width(1)


def normalize_gemm(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Rewrite the reduction block as C[S, I, J] += A[S, I, K] * B[S, J, K] (implicit GEMM)."""
    ra = sch.reindex(block, ("read", 0))
    rb = sch.reindex(block, ("read", 1))
    rc = sch.reindex(block, ("write", 0))
    maps = _gemm_index_maps(sch.get(block))
    if maps is None:
        raise ValueError(f"block {sch.get(block).name_hint} is not a GEMM-like reduction")
    mm, am, bm, cm = maps
    sch.transform_layout(ra, ("write", 0), am)
    sch.transform_layout(rb, ("write", 0), bm)
    sch.transform_layout(rc, ("read", 0), cm)
    sch.transform_block_layout(block, mm)


# ------------------------------------------------------------------ fp16 on tensor cores

def _tile_for_tensor_cores(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, cfg: Mapping[str, Any],
                           vecs: tuple[int, int]) -> tuple:
    """What the WMMA and mma.sync schedules share: pad to the block tile, blockize the 16x16x16
    fragment, tile blocks / warps / K steps, bind (with `raster` grouping), and stage A and B in
    padded dynamic shared memory (the im2col gather inlined into the copy). Returns
    (outer, inner, bx, ty, k0, k1)."""
    brw, bcw = cfg["block_row_warps"], cfg["block_col_warps"]
    wr, wc, chunk = cfg["warp_row_tiles"], cfg["warp_col_tiles"], cfg["chunk"]
    warps = brw * bcw
    # batch folded into I so small-batch convs still fill blocks
    sch.pad_einsum(block, [1, FRAG * brw * wr, FRAG * bcw * wc, FRAG * chunk])
    batch, i, j, k = sch.get_loops(block)
    i, ii = sch.split(i, [None, FRAG])
    j, ji = sch.split(j, [None, FRAG])
    k, ki = sch.split(k, [None, FRAG])
    sch.reorder(i, j, k, ii, ji, ki)
    inner = block
    outer = sch.blockize(ii)
    i0, i1, i2 = sch.split(i, [None, brw, wr])
    j0, j1, j2 = sch.split(j, [None, bcw, wc])
    k0, k1 = sch.split(k, [None, chunk])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    bx = sch.fuse(*_raster(sch, i0, j0, cfg.get("raster", 1)))
    ty = sch.fuse(i1, j1)
    # split-K: the batch axis is the K slice (`split_k_rfactor`), one grid z index each
    sch.bind(batch, "blockIdx.z" if cfg.get("split_k", 1) > 1 else "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")

    def to_shared(idx: int) -> s_tir.schedule.SBlockRV:
        cr = sch.cache_read(outer, idx, "shared.dyn")
        sch.compute_at(cr, k0)
        fused = sch.fuse(*sch.get_loops(cr)[-2:])
        _, f1, f2, f3 = sch.split(fused, [None, warps, 32, vecs[idx]])
        sch.bind(f2, "threadIdx.x")
        sch.bind(f1, "threadIdx.y")
        sch.vectorize(f3)
        # row stride = 8 halves (16 B) mod 32 halves: the 8 rows one ldmatrix (or WMMA load) phase reads
        # start in 8 different 16-byte bank groups for every chunk (rows of 48, 80 or 144 B), so
        # neither the fragment loads nor the 16-byte cp.async stores conflict
        sch.storage_align(cr, 0, axis=-2, factor=16, offset=SMEM_PAD_HALF)
        return cr

    a_sh, b_sh = to_shared(0), to_shared(1)
    _inline_producers(sch, a_sh)  # the pad / im2col gather happens inside the copy
    _inline_producers(sch, b_sh)
    return outer, inner, bx, ty, k0, k1


def _raster(sch: s_tir.Schedule, i0: s_tir.schedule.LoopRV, j0: s_tir.schedule.LoopRV, group: int) -> list:
    """Block order for L2 reuse: with `group` > 1, consecutive blocks walk `group` M tiles down one
    N column before moving to the next column (CUTLASS's threadblock swizzle), so a wave reuses the
    same few A row panels and B column panels from L2. Applied only where `group` divides the
    number of M tiles (and there is more than one N tile); otherwise plain row-major order."""
    mt = int(sch.get(i0).extent)
    if group <= 1 or mt % group or mt == group or int(sch.get(j0).extent) == 1:
        return [i0, j0]
    io, ii = sch.split(i0, [None, group])
    sch.reorder(io, j0, ii)
    return [io, j0, ii]


def _apply_pipeline(sch: s_tir.Schedule, k0: s_tir.schedule.LoopRV, stages: int) -> None:
    if stages > 1:  # k0's body: the A copy, the B copy, the k1 loop (fragment loads + mma)
        sch.annotate(k0, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k0, "software_pipeline_async_stages", [0])  # the copies become cp.async (tirx.use_async_copy)


def schedule_tensor_core(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, cfg: Mapping[str, Any],
                         vecs: tuple[int, int]) -> None:
    """Tile the normalized GEMM for WMMA fragments (see the module docstring); `vecs` are the
    A and B load widths (`operand_vectors`). `mma = mma_sync` goes to `schedule_mma`."""
    if cfg.get("mma", "wmma") == "mma_sync":
        schedule_mma(sch, block, cfg, vecs)
        return
    from .intrin import get_wmma_intrin_group
    warps = cfg["block_row_warps"] * cfg["block_col_warps"]
    outer, inner, bx, ty, k0, k1 = _tile_for_tensor_cores(sch, block, cfg, vecs)
    a_frag = sch.cache_read(outer, 0, "wmma.matrix_a")
    b_frag = sch.cache_read(outer, 1, "wmma.matrix_b")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    c_sh = sch.cache_write(outer, 0, "shared")
    c_frag = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(c_frag, ty)
    sch.reverse_compute_at(c_sh, bx)
    ci, cj = sch.get_loops(c_frag)[-2:]
    ci0, ci1 = sch.split(ci, [None, FRAG])
    cj0, cj1 = sch.split(cj, [None, FRAG])
    sch.reorder(ci0, cj0, ci1, cj1)
    init = sch.decompose_reduction(outer, k0)
    init_inner = sch.get_child_blocks(init)[0]
    g = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared", in_dtype="float16",
                              out_dtype="float32", trans_b=True)
    for frag, key in ((a_frag, "load_a"), (b_frag, "load_b")):
        fi, fj = sch.get_loops(frag)[-2:]
        fi0, fi1 = sch.split(fi, [None, FRAG])
        fj0, fj1 = sch.split(fj, [None, FRAG])
        sch.reorder(fi0, fj0, fi1, fj1)
        sch.unroll(fi0)
        sch.unroll(fj0)
        sch.tensorize(fi1, g[key])
    sch.tensorize(sch.get_loops(init_inner)[-2], g["init"])
    sch.tensorize(sch.get_loops(c_frag)[-2], g["store"])
    sch.tensorize(sch.get_loops(inner)[-3], g["compute"])
    _apply_pipeline(sch, k0, cfg.get("stages", 1))
    _inline_consumers(sch, c_sh)  # cast, bias, bn, relu, add applied on the way out
    fused = sch.fuse(*sch.get_loops(c_sh)[-2:])
    _, f1, f2, f3 = sch.split(fused, [None, warps, 32, 4])
    sch.bind(f1, "threadIdx.y")
    sch.bind(f2, "threadIdx.x")
    sch.vectorize(f3)


# ------------------------------------------------------------------ fp16 on tensor cores: mma.sync + ldmatrix

def _ldmatrix_layout(*axes: Any) -> tuple:
    """Index map of a warp-scope fragment buffer [..., rows, cols] onto the mma.sync register layout:
    [..., rows // 16, cols // 16, lane (32), element (8)], as TVM's ldmatrix / mma intrinsics
    expect it (`shared_16x16_to_ldmatrix_32x8_layout`)."""
    from .intrin import shared_16x16_to_ldmatrix_32x8_layout
    *lead, i, j = axes
    return (*lead, i // FRAG, j // FRAG, *shared_16x16_to_ldmatrix_32x8_layout(i % FRAG, j % FRAG))


def schedule_mma(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, cfg: Mapping[str, Any],
                 vecs: tuple[int, int]) -> None:
    """The normalized GEMM on PTX `mma.sync.m16n8k16` (fp16 x fp16 -> fp32) with `ldmatrix.x4`
    fragment loads, from TVM's own intrinsics (`mma_ldmatrix_f16_a_dyn`, `mma_ldmatrix_f16_b_trans_dyn`,
    `mma_f16f16f32_trans_b`, `mma_fill_16x16_f32`: the ones MetaSchedule's tensor-core rule uses).
    Block / warp / K tiling, the padded shared layout, `raster` and the `stages` cp.async pipeline
    are the WMMA schedule's (`_tile_for_tensor_cores`). The fragments live in registers (warp scope,
    re-laid out to the mma lane / element order). There is no shared-memory staging of C: each
    lane applies the fused epilogue (cast, bias, bn scale / shift, relu, add) to its own 8 accumulator
    values per 16x16 fragment and stores them straight to global memory."""
    from .intrin import get_mma_intrin_group
    outer, inner, bx, ty, k0, k1 = _tile_for_tensor_cores(sch, block, cfg, vecs)
    a_w = sch.cache_read(outer, 0, "warp")
    b_w = sch.cache_read(outer, 1, "warp")
    sch.compute_at(a_w, k1)
    sch.compute_at(b_w, k1)
    c_w = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(c_w, ty)
    init = sch.decompose_reduction(outer, k0)
    init_inner = sch.get_child_blocks(init)[0]
    # B is [S, J, K] (K innermost): the "transposed B" intrinsics
    g = get_mma_intrin_group(load_scope="shared.dyn", store_scope="global", in_dtype="float16",
                             out_dtype="float32", trans_a=False, trans_b=True)
    loads = []
    for frag in (a_w, b_w):
        fi, fj = sch.get_loops(frag)[-2:]
        fi0, fi1 = sch.split(fi, [None, FRAG])
        fj0, fj1 = sch.split(fj, [None, FRAG])
        sch.reorder(fi0, fj0, fi1, fj1)
        sch.unroll(fi0)
        sch.unroll(fj0)
        loads.append(fi1)
    sch.transform_layout(a_w, ("write", 0), _ldmatrix_layout)
    sch.transform_layout(b_w, ("write", 0), _ldmatrix_layout)
    sch.transform_layout(c_w, ("read", 0), _ldmatrix_layout)
    sch.tensorize(loads[0], g["load_a"])
    sch.tensorize(loads[1], g["load_b"])
    sch.tensorize(sch.get_loops(init_inner)[-2], g["init"])
    sch.tensorize(sch.get_loops(inner)[-3], g["compute"])
    _apply_pipeline(sch, k0, cfg.get("stages", 1))
    # the epilogue in registers: inline cast / bias / bn / relu / add into the accumulator store, then
    # walk each 16x16 fragment in the mma lane order: row = 8 * r1 + r0, col = 8 * c2 + 2 * c1 + c0
    # with lane = 4 * r0 + c1 and element = 4 * c2 + 2 * r1 + c0 (`_ldmatrix_layout`)
    if cfg.get("split_k", 1) > 1:
        # the store writes the fp32 partial sums to the workspace; the epilogue is the reduction kernel's
        from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumers
        auto_inline_consumers(sch, c_w)  # the reindex / padding copies only
    else:
        _inline_consumers(sch, c_w)
    ci, cj = sch.get_loops(c_w)[-2:]
    ci0, ci1 = sch.split(ci, [None, FRAG])
    cj0, cj1 = sch.split(cj, [None, FRAG])
    r1, r0 = sch.split(ci1, [2, 8])
    c2, c1, c0 = sch.split(cj1, [2, 4, 2])
    sch.reorder(ci0, cj0, r0, c1, c2, r1, c0)
    sch.bind(sch.fuse(r0, c1), "threadIdx.x")
    sch.unroll(c2)
    sch.unroll(r1)
    sch.unroll(c0)


# ------------------------------------------------------------------ split-K (small-M GEMMs)

SPLIT_K_THREADS = 128  # threads per block of the split-K reduction kernel


def split_k_rfactor(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                    split_k: int) -> tuple[s_tir.schedule.SBlockRV, s_tir.schedule.SBlockRV]:
    """Cut the K reduction of `block` (a matmul: loops i, j, k) into `split_k` slices with TVM's
    rfactor: `<name>_rf` computes the fp32 partial sums P[s, i, j] = sum over slice s of A * B into
    an intermediate global buffer (the workspace; a GEMM whose batch axis is the slice s, scheduled
    on the tensor cores with s on blockIdx.z), and the original block becomes the sum over s of
    P[s, i, j], which `schedule_split_k_reduce` turns into a second, small kernel carrying the
    epilogue. No atomics: each partial sum is written once and read once. Returns (rf, write-back)."""
    loops = sch.get_loops(block)
    ext = int(sch.get(loops[-1]).extent)
    if len(loops) != 3 or ext % split_k:
        raise ValueError(f"split_k={split_k} needs a matmul block (i, j, k) whose K ({ext}) it divides")
    ko, _ = sch.split(loops[-1], [split_k, None])
    rf = sch.rfactor(ko, 0)
    i, j, ko, _ = sch.get_loops(rf)
    sch.reorder(ko, i, j)  # loops in the rf block's iterator order (s, i, j, k), as normalize_gemm needs
    return rf, block


def schedule_split_k_reduce(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                            threads: int = SPLIT_K_THREADS) -> None:
    """The split-K write-back (out[i, j] = sum_s P[s, i, j]) as its own kernel: one thread per
    output element (consecutive threads on consecutive j: coalesced workspace reads), the `split_k`
    partial sums added in registers in slice order, then the fused epilogue (bias, relu, cast)
    inlined into the one global store."""
    acc = sch.cache_write(block, 0, "local")
    i, j, ko = sch.get_loops(block)
    bx, tx = sch.split(sch.fuse(i, j), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(ko)
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
    _inline_consumers(sch, acc)


# ------------------------------------------------------------------ fp32 on CUDA cores

def schedule_simt(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, cfg: Mapping[str, Any],
                  vecs: tuple[int, int]) -> None:
    """Shared-memory tiled GEMM on CUDA cores with per-thread register tiles."""
    tx_n, ty_n, mx, my, mk = cfg["threads_x"], cfg["threads_y"], cfg["micro_x"], cfg["micro_y"], cfg["micro_k"]
    sch.pad_einsum(block, [1, ty_n * my, tx_n * mx, mk])
    batch, i, j, k = sch.get_loops(block)
    by, ty, yi = sch.split(i, [None, ty_n, my])
    bx, tx, xi = sch.split(j, [None, tx_n, mx])
    ko, ki = sch.split(k, [None, mk])
    sch.reorder(by, bx, ty, tx, ko, ki, yi, xi)
    sch.bind(batch, "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if cfg["unroll"]:
        sch.annotate(tx, "pragma_auto_unroll_max_step", cfg["unroll"])
        sch.annotate(tx, "pragma_unroll_explicit", 1)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)

    def to_shared(idx: int) -> s_tir.schedule.SBlockRV:
        cr = sch.cache_read(block, idx, "shared")
        n = len(sch.get_loops(cr))
        sch.compute_at(cr, ko, preserve_unit_loops=True)
        loops = sch.get_loops(cr)[-n:]
        fty, ftx, _, fv = sch.split(sch.fuse(*loops), [ty_n, tx_n, None, vecs[idx]])
        sch.vectorize(fv)
        sch.bind(fty, "threadIdx.y")
        sch.bind(ftx, "threadIdx.x")
        sch.storage_align(cr, 0, axis=1, factor=8, offset=cfg["vec"])
        return cr

    a_sh, b_sh = to_shared(0), to_shared(1)
    _inline_producers(sch, a_sh)
    _inline_producers(sch, b_sh)
    _inline_consumers(sch, acc)
    sch.decompose_reduction(block, ko)


# ------------------------------------------------------------------ reading figures back

def _lower(mod: tvm.IRModule, target: tvm.target.Target) -> tuple[tvm.IRModule, dict]:
    """(host module, {target: device module}) of `mod` through TVM's own lowering pipeline."""
    from tvm.tirx.build import split_host_device_mods
    lower = tvm.tirx.get_default_tir_pipeline(target)[0]  # (lowering, host finalize, device finalize)
    bound = tvm.tirx.transform.BindTarget(target.with_host(tvm.target.Target("llvm")))(mod)
    with target:
        return split_host_device_mods(lower(bound))


def measured_shared_bytes(mod: tvm.IRModule, target: tvm.target.Target) -> int:
    """Shared memory per block of the lowered kernel: its static shared allocations plus the
    merged dynamic buffer the launch asks for, read from TVM's own lowering pipeline."""
    _, device_mods = _lower(mod, target)
    from tvm.s_tir.analysis import calculate_allocated_bytes
    total = 0
    for dev_mod in device_mods.values():
        for per_scope in calculate_allocated_bytes(dev_mod).values():
            total += sum(int(v) for scope, v in per_scope.items() if str(scope).startswith("shared"))
    return total


def measured_workspace_bytes(mod: tvm.IRModule, target: tvm.target.Target) -> int:
    """Global memory the lowered module allocates besides its arguments (the split-K workspace:
    an intermediate global buffer the host allocates and passes to the kernels)."""
    host_mod, _ = _lower(mod, target)
    from tvm.s_tir.analysis import calculate_allocated_bytes
    return sum(int(v) for per_scope in calculate_allocated_bytes(host_mod).values()
               for scope, v in per_scope.items() if str(scope) == "global")


def launch_extents(mod: tvm.IRModule, target: tvm.target.Target) -> dict[str, dict[str, int]]:
    """Each lowered kernel's launch extents by thread tag ({kernel: {"blockIdx.z": 4, ...}}), read
    from its `launch_thread` statements (TVM 0.27's Python API has no TIR statement visitor)."""
    import re
    _, device_mods = _lower(mod, target)
    return {gv.name_hint: {tag: int(n) for tag, n in
                           re.findall(r'T\.launch_thread\("((?:blockIdx|threadIdx)\.[xyz])", (\d+)\)', str(func))}
            for dev_mod in device_mods.values() for gv, func in dev_mod.functions.items()}
