"""CUDA templates for the matmul and conv2d families (fused epilogues included).

fp16 runs on the tensor cores (WMMA 16x16x16, or with `mma = mma_sync` PTX mma.sync m16n8k16 fed by
ldmatrix; fp32 accumulate), fp32 on the CUDA cores; both
through one implicit-GEMM normalization (`gemm.py`). Knobs are declared here next to the
schedule that reads them; `check()` states validity from the target description (threads per
block, shared memory per block, registers per thread and per SM, from `targets/cuda-*.toml`).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any, Mapping

import tvm
from tvm import te

from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from . import gemm
from .direct import direct_shared_bytes, schedule_direct

TC_KNOBS = (  # fp16 tensor-core schedule
    Knob("block_row_warps", (1, 2, 4), "warps per block along M"),
    Knob("block_col_warps", (1, 2, 4), "warps per block along N"),
    Knob("warp_row_tiles", (1, 2, 4), "16x16 accumulator fragments per warp along M"),
    Knob("warp_col_tiles", (1, 2, 4), "16x16 accumulator fragments per warp along N"),
    Knob("chunk", (1, 2, 4), "16-wide K slices staged in shared memory per step"),
    Knob("vec", (2, 4, 8), "fp16 elements per vectorized global -> shared load (at most 4 for a strided operand)"),
    Knob("stages", (1, 2, 3), "shared-memory pipeline depth: 1 = load then compute; 2-3 = cp.async multi-stage "
                              "(A and B tiles multi-buffered, loads for step k+stages-1 in flight during step k)"),
    Knob("mma", ("wmma", "mma_sync"), "tensor-core instructions: wmma = WMMA fragments (m16n16k16), epilogue through "
                                      "a shared staging tile; mma_sync = PTX mma.sync.m16n8k16 + ldmatrix.x4, epilogue "
                                      "on the accumulator registers, no staging tile"),
    Knob("raster", (1, 4, 8), "block order: 1 = row-major; g = groups of g M tiles walk one N column before the next "
                              "(L2 reuse; applied where g divides the M tiles)"),
)
# fp16 matmul family only (the conv's implicit GEMM keeps one K loop)
SPLIT_K = Knob("split_k", (1, 2, 4, 8), "split-K for small-M GEMMs (mma_sync only): K cut into s slices computed "
                                        "as a batch over blockIdx.z, fp32 partial sums in a global workspace, then "
                                        "a reduction kernel adds them and applies the epilogue; 1 = off")
SIMT_KNOBS = (  # fp32 CUDA-core schedule
    Knob("threads_x", (8, 16, 32), "threads per block along N"),
    Knob("threads_y", (4, 8, 16), "threads per block along M"),
    Knob("micro_x", (1, 2, 4, 8), "outputs per thread along N (register tile)"),
    Knob("micro_y", (1, 2, 4, 8), "outputs per thread along M (register tile)"),
    Knob("micro_k", (4, 8, 16, 32), "K slice staged in shared memory per step"),
    Knob("vec", (1, 2, 4), "fp32 elements per vectorized global -> shared load"),
    Knob("unroll", (0, 64, 256), "auto-unroll limit of the inner loops"),
)


# measured on an NVIDIA H100 (sm_90, and the sm_80 build through PTX): the fp32 direct conv schedule
# (`direct.py`) returned wrong results (max abs error 118 on an NHWC 3x3 conv, n=4, 19x19, 64 -> 64)
DIRECT_WRONG = ("algo=direct is disabled: the fp32 direct convolution computed wrong results on an H100 "
                "(use the implicit GEMM, the default)")


@lru_cache(maxsize=256)
def _dims(wl: Workload, block: str) -> tuple[int, int, int]:
    """(M, N, K) of the workload's implicit GEMM (batch and output pixels folded into M)."""
    ins, out = get_op(wl.op).compute(wl)
    return gemm.gemm_dims(te.create_prim_func([*ins, out]), block)


def split_k_module(wl: Workload, block: str, split_k: int) -> tvm.IRModule:
    """The split-K compute definition, unscheduled: the op's TE compute with the reduction of
    `block` cut into `split_k` slices (`gemm.split_k_rfactor`: fp32 partial sums, then their sum
    and the epilogue). The CUDA schedule tiles exactly this; any target (llvm) can build it as it is,
    which is how the decomposition is checked against numpy without a GPU."""
    ins, out = get_op(wl.op).compute(wl)
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]).with_attr("global_symbol", "main"))
    gemm.split_k_rfactor(sch, sch.get_sblock(block), split_k)
    return sch.mod


def _pick(pairs: list[tuple[int, int]], limit: int) -> tuple[int, int]:
    """The largest (warps, tiles) pair whose 16 * warps * tiles fits `limit` (balanced first)."""
    fitting = [p for p in pairs if gemm.FRAG * p[0] * p[1] <= max(limit, gemm.FRAG)]
    return max(fitting, key=lambda p: (p[0] * p[1], -abs(p[0] - p[1]), p[0]))


class CudaGemmTemplate(Template):
    """Common part of the CUDA templates: knobs by dtype, validity, schedule dispatch."""

    target_family = "cuda"
    version = 3  # 2: the `stages` knob (cp.async pipelining); 3: fixes found on an H100 (element-wise
    # gather under cp.async, the 48 KB static + dynamic launch rule, the fp32 direct conv disabled)
    block = ""  # name of the reduction block in the DSL compute

    def _check_dtype(self, wl: Workload) -> None:
        if wl.dtype not in ("float16", "float32"):
            raise OpcError(f"{self.name} has no {wl.dtype} schedule", arg="--dtype", value=wl.dtype,
                           expected="float16 (tensor cores) or float32 (CUDA cores)")

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_dtype(wl)
        return list(TC_KNOBS if wl.dtype == "float16" else SIMT_KNOBS)

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        self._check_dtype(wl)
        m, n, k = _dims(wl, self.block)
        if wl.dtype == "float16":
            pairs = [(w, t) for w in (1, 2, 4) for t in (1, 2, 4) if w * t <= 4]
            brw, wr = _pick(pairs, m)
            bcw, wc = _pick(pairs, n)
            chunk = 2 if k > 16 else 1
            return {"block_row_warps": brw, "block_col_warps": bcw, "warp_row_tiles": wr,
                    "warp_col_tiles": wc, "chunk": chunk, "vec": 8, "stages": 1, "mma": "wmma", "raster": 1}
        return {"threads_x": 16 if n >= 64 else 8, "threads_y": 8 if m >= 32 else 4, "micro_x": 4 if n >= 64 else 1,
                "micro_y": 4 if m >= 32 else 1, "micro_k": 16, "vec": 2, "unroll": 256}

    def tiles(self, wl: Workload, config: Mapping[str, Any]) -> gemm.GemmTiles:
        m, n, k = _dims(wl, self.block)
        if config.get("algo") == "direct":
            p = wl.p
            sh = direct_shared_bytes(config, p["r"], p["s"], wl.layout, p["k"], p["c"] // p["groups"])
            base = gemm.simt_tiles(m, n, k, config)
            return dataclasses.replace(base, shared_bytes=sh, static_shared_bytes=sh)
        return (gemm.tensor_core_tiles if wl.dtype == "float16" else gemm.simt_tiles)(m, n, k, config)

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        if config.get("algo") == "direct":
            return DIRECT_WRONG
        if (why := self._check_split_k(wl, target, config)) is not None:
            return why
        if wl.dtype == "float16" and "float16" not in target.units.get("tensor_core", {}).get("dtypes", ()):
            return f"{target.name} declares no fp16 tensor core"
        if config.get("stages", 1) > 1 and gemm.arch_of(target) < 80:
            return f"stages={config['stages']} needs cp.async (sm_80 or newer); {target.name} is sm_{gemm.arch_of(target)}"
        return gemm.check_tiles(self.tiles(wl, config), target)

    def _check_split_k(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        """Why `split_k` cannot or should not be used with this config, or None (also for split_k = 1)."""
        split = config.get("split_k", 1)
        if split == 1:
            return None
        if wl.dtype != "float16" or config.get("mma", "wmma") != "mma_sync":
            return f"split_k={split} is a mma_sync schedule (fp16, mma=mma_sync)"
        m, n, k = _dims(wl, self.block)
        t = self.tiles(wl, config)
        if k % (split * t.bk):
            return (f"split_k={split} cuts K={k} into slices of {k / split:g}, not a whole number of "
                    f"{t.bk}-wide K steps (chunk={config['chunk']})")
        if t.output_tiles >= target.cores:
            return (f"split_k={split} buys nothing: the {m}x{n} output already makes {t.output_tiles} blocks of "
                    f"{t.bm}x{t.bn} for the target's {target.cores} SMs")
        steps = k // (split * t.bk)
        if steps < config.get("stages", 1):
            return (f"split_k={split} leaves {steps} K step(s) of {t.bk} per slice, fewer than the "
                    f"{config['stages']} pipeline stages")
        return None

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> tvm.s_tir.Schedule:
        ins, out = get_op(wl.op).compute(wl)
        func = te.create_prim_func([*ins, out]).with_attr("global_symbol", "main")
        sch = tvm.s_tir.Schedule(func)
        main = sch.get_sblock(self.block)
        if config.get("algo") == "direct":
            schedule_direct(sch, main, config, wl.layout)
            return sch
        vecs = gemm.operand_vectors(sch.get(main), config["vec"], async_copy=config.get("stages", 1) > 1)
        if config.get("split_k", 1) > 1:  # the partial-sum GEMM is scheduled below; the reduction kernel here
            main, write_back = gemm.split_k_rfactor(sch, main, config["split_k"])
            gemm.schedule_split_k_reduce(sch, write_back)
        gemm.normalize_gemm(sch, main)
        if wl.dtype == "float16":
            gemm.schedule_tensor_core(sch, main, config, vecs)
        else:
            gemm.schedule_simt(sch, main, config, vecs)
        return sch

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m, n, k = _dims(wl, self.block)
        t = self.tiles(wl, config)
        elt = 2 if wl.dtype == "float16" else 4
        sms = max(target.cores, 1)
        return {
            "gemm_m": m, "gemm_n": n, "gemm_k": k, "tile_m": t.bm, "tile_n": t.bn, "tile_k": t.bk,
            "threads_per_block": t.threads, "shared_bytes": t.shared_bytes, "registers_est": t.registers,
            "stages": config.get("stages", 1),
            "mma_sync": 1.0 if config.get("mma", "wmma") == "mma_sync" else 0.0,
            "raster": config.get("raster", 1),
            "split_k": config.get("split_k", 1), "workspace_bytes": t.workspace_bytes,
            "blocks": t.blocks, "waves": t.blocks / sms,
            "pad_waste": t.m_pad * t.n_pad * t.k_pad / (m * n * k) - 1.0,
            # FLOPs per byte staged into shared memory per K step
            "block_intensity": 2 * t.bm * t.bn * t.bk / ((t.bm + t.bn) * t.bk * elt),
            "global_bytes": elt * (t.m_pad * t.k_pad * (t.n_pad // t.bn) + t.n_pad * t.k_pad * (t.m_pad // t.bm)),
        }


@register_template
class CudaMatmul(CudaGemmTemplate):
    """matmul (+ bias + relu): tensor cores for fp16, CUDA cores for fp32."""

    name = "cuda.matmul.gemm"
    op_families = ("matmul",)
    block = "matmul"

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        knobs = super().space(wl, target)
        return knobs + [SPLIT_K] if wl.dtype == "float16" else knobs

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        cfg = super().default(wl, target)
        return {**cfg, "split_k": 1} if wl.dtype == "float16" else cfg


@register_template
class CudaConv2d(CudaGemmTemplate):
    """conv2d (+ bias / bn + relu), NCHW or NHWC: an implicit GEMM (the im2col gather done by the
    global -> shared copy, never materialized; fp16 on tensor cores), or for fp32 optionally a
    direct convolution (`algo = direct`, `direct.py`)."""

    name = "cuda.conv2d"
    op_families = ("conv2d",)
    block = "conv2d"

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        knobs = super().space(wl, target)
        if wl.dtype == "float32" and wl.p["groups"] == 1:  # fp32 may also run the direct schedule
            # the direct schedule is off the search (and refused by check()) until fixed: see DIRECT_WRONG
            knobs.append(Knob("algo", ("implicit_gemm",), "implicit GEMM (the direct convolution is disabled)"))
        return knobs

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        cfg = super().default(wl, target)
        if wl.dtype == "float32" and wl.p["groups"] == 1:
            cfg["algo"] = "implicit_gemm"
        return cfg
