"""split-K on the fp16 `mma = mma_sync` matmul path (the `split_k` knob): small-M GEMMs such as the fc.

With split_k = s > 1 the K reduction is cut into s slices (`gemm.split_k_rfactor`, TVM's rfactor):
one tensor-core kernel computes the fp32 partial sums of every slice as a batch over blockIdx.z into
a global workspace [s, m_pad, n_pad], a second small kernel adds the s partial sums per output
element and applies the epilogue (bias, relu, cast). No atomics.

Compile-side (needs only a CUDA compiler): the GEMM kernel's PTX still has mma.sync + ldmatrix,
ptxas reports no spills and registers within both kernels' launch bounds, the GEMM grid's z extent
is split_k, the workspace and shared memory are what `tiles()` predicts. Numerically (no GPU, no
CUDA compiler): the split-K compute definition the schedule tiles (`templates.split_k_module`) is
built for llvm and compared with numpy. Whether split-K is faster is a GPU measurement
(`benchmarks/cuda_mma_vs_peers.py`, fc row), not claimed here.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from opcompiler.backend.cuda import CudaBackend, cuda_source, has_gpu, tvm_cuda_target
from opcompiler.ops import get_op, workload
from opcompiler.schedules.cuda import gemm
from opcompiler.schedules.cuda.templates import split_k_module
from opcompiler.target import load_target
from opcompiler.template import get_template


from .compiler import WHY as _WHY, needs_compiler

SM80, SM90 = load_target("cuda-sm80"), load_target("cuda-sm90")
MMA = {"mma": "mma_sync"}
# (target, op, shape, config): ResNet-50's fc at batch 32 with bias + relu, the batch-1 fc (m = 1,
# padded to one 16-row fragment), a transposed-B fc with bias on sm_90
CASES = [
    (SM80, "matmul_bias_relu", "m=32,k=2048,n=1000",
     {**MMA, "block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 1, "warp_col_tiles": 2, "chunk": 2,
      "stages": 2, "split_k": 4}),
    (SM80, "matmul", "m=1,k=2048,n=1000",
     {**MMA, "block_row_warps": 1, "block_col_warps": 4, "warp_row_tiles": 1, "warp_col_tiles": 2, "chunk": 4,
      "stages": 3, "split_k": 8}),
    (SM90, "matmul_bias", "m=32,k=2048,n=1000,trans_b=1",
     {**MMA, "block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 1, "warp_col_tiles": 4, "chunk": 4,
      "stages": 3, "split_k": 2}),
]
IDS = [f"{t.name}-{op}-{shape.split(',')[0]}-split{cfg['split_k']}" for t, op, shape, cfg in CASES]


def _wl(op: str, shape: str):
    return workload(op, shape, dtype="float16")


@pytest.fixture(scope="module")
def built() -> dict:
    if _WHY is not None:
        pytest.skip(f"no CUDA compiler (NVRTC or nvcc): {_WHY}")
    return {id(c): CudaBackend(c[0]).build(_wl(c[1], c[2]), c[3]) for c in CASES}


def _kernels(src: str) -> dict[str, str]:
    """{kernel name: its body} of a CUDA source with one or more __global__ functions."""
    heads = list(re.finditer(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^)]*\) \{', src))
    return {h.group(1): src[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(src)]
            for i, h in enumerate(heads)}


@needs_compiler
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_k_ptx_has_mma_sync_and_ldmatrix_no_spills(built, case):
    from opcompiler.backend.cuda_compile import compile_cuda, embedded_ptx
    k = built[id(case)]
    assert k.config["split_k"] == case[3]["split_k"]
    src = cuda_source(k)
    kernels = _kernels(src)
    assert len(kernels) == 2, f"expected the partial-sum GEMM and the reduction kernel, got {list(kernels)}"
    ptx = embedded_ptx(compile_cuda(src, k.info["arch"]).data)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "wmma" not in ptx and "cp.async" in ptx  # stages > 1 in every case
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    assert k.info["stack_frame_bytes"] == 0 and k.info["spill_bytes"] == 0
    # ptxas's registers (the larger of the two kernels) fit the larger launch bound and the SM
    lim = gemm.cuda_limits(case[0])
    bounds = {int(x) for x in re.findall(r"__launch_bounds__\((\d+)\)", src)}
    tmpl = get_template("matmul", "cuda")
    assert bounds == {tmpl.tiles(k.workload, k.config).threads, gemm.SPLIT_K_THREADS}
    assert 0 < k.info["registers_per_thread"] <= min(lim["max_registers_per_thread"],
                                                     lim["registers_per_sm"] // max(bounds))
    # the epilogue is the reduction kernel's: the GEMM kernel reads no bias and stores fp32 partial sums
    gemm_k, red_k = (kernels[n] for n in sorted(kernels, key=lambda n: "mma" not in kernels[n]))
    assert "mma" in gemm_k and "mma" not in red_k
    if "bias" in k.workload.op:
        assert "bias" in red_k and "bias" not in gemm_k
    if "relu" in k.workload.op:
        assert "max(" in red_k


@needs_compiler
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_k_grid_workspace_and_shared_memory_as_predicted(built, case):
    target = case[0]
    k = built[id(case)]
    wl, cfg = k.workload, k.config
    tmpl = get_template("matmul", "cuda")
    t = tmpl.tiles(wl, cfg)
    mod = tmpl.apply(wl, target, cfg).mod
    tt = tvm_cuda_target(target)
    ext = gemm.launch_extents(mod, tt)
    assert len(ext) == 2
    gemm_ext = next(e for e in ext.values() if "blockIdx.z" in e)
    red_ext = next(e for e in ext.values() if "blockIdx.z" not in e)
    # the partial-sum GEMM: one grid z index per K slice, the M x N block tiles along x
    assert gemm_ext["blockIdx.z"] == cfg["split_k"]
    assert gemm_ext["blockIdx.x"] == t.output_tiles and t.blocks == t.output_tiles * cfg["split_k"]
    assert gemm_ext["threadIdx.x"] * gemm_ext["threadIdx.y"] == t.threads
    # the reduction: one thread per output element
    m, n = (wl["m"], wl["n"])
    assert red_ext["threadIdx.x"] == gemm.SPLIT_K_THREADS
    assert red_ext["blockIdx.x"] == -(-m * n // gemm.SPLIT_K_THREADS)
    # the fp32 workspace [split_k, m_pad, n_pad], allocated by the host and passed to both kernels
    assert gemm.measured_workspace_bytes(mod, tt) == t.workspace_bytes == cfg["split_k"] * t.m_pad * t.n_pad * 4
    assert re.search(r"float\* __restrict__ \w*rf\w*_ptr", cuda_source(k))
    # shared memory: the operand tiles only, as without split-K
    assert gemm.measured_shared_bytes(mod, tt) == t.shared_bytes == k.info["shared_bytes_per_block"]
    assert t.shared_bytes == cfg["stages"] * (t.bm + t.bn) * (t.bk + gemm.SMEM_PAD_HALF) * 2
    assert k.info["static_smem_bytes"] == 0


# ------------------------------------------------------------------ the decomposition, numerically, on llvm

NUMERIC = [  # (op, shape, split_k)
    ("matmul", "m=1,k=2048,n=1000", 8),
    ("matmul_bias_relu", "m=32,k=2048,n=1000", 4),
    ("matmul_bias", "m=32,k=512,n=200,trans_b=1", 2),
    ("matmul", "m=48,k=256,n=64,trans_a=1", 4),
]


@pytest.mark.parametrize("op,shape,split_k", NUMERIC, ids=[f"{o}-{s.split(',')[0]}-split{n}" for o, s, n in NUMERIC])
def test_split_k_decomposition_matches_numpy_on_llvm(op, shape, split_k):
    """fp16 inputs, fp32 partial sums and fp32 sum of the slices, fp16 output: the only difference
    to numpy's fp32 matmul is the summation order, i.e. at most the output's fp16 rounding
    (relative 2^-10 < 1e-3); values that round to about zero (relu) get atol 1e-3."""
    wl = _wl(op, shape)
    mod = split_k_module(wl, "matmul", split_k)
    text = str(mod)
    assert f"matmul_rf = T.sblock_alloc_buffer(({split_k}, {wl['m']}, {wl['n']}))" in text  # fp32 partial sums
    d = get_op(op)
    inputs = d.make_inputs(wl, seed=3)
    dev = tvm.cpu()
    ref = d.reference(wl, inputs)

    def run(m: tvm.IRModule) -> np.ndarray:
        args = [tvm.runtime.tensor(a, dev) for a in inputs] + [tvm.runtime.empty(ref.shape, ref.dtype, dev)]
        tvm.compile(m, target="llvm")(*args)
        return args[-1].numpy()
    got = run(mod)
    assert got.dtype == ref.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-3, atol=1e-3)
    ins, out = d.compute(wl)
    whole = tvm.IRModule({"main": tvm.te.create_prim_func([*ins, out]).with_attr("global_symbol", "main")})
    np.testing.assert_allclose(got.astype(np.float32), run(whole).astype(np.float32), rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ the knob: space, defaults, check()

def test_split_k_knob_space_and_default():
    """fp16 matmul family only, default 1; split_k = 1 schedules exactly what the config without it does."""
    tmpl = get_template("matmul", "cuda")
    for op in ("matmul", "matmul_bias", "matmul_bias_relu"):
        wl = workload(op, "m=32,k=2048,n=1000", dtype="float16")
        assert next(k for k in tmpl.space(wl, SM80) if k.name == "split_k").values == (1, 2, 4, 8)
        assert tmpl.default(wl, SM80)["split_k"] == 1
    wl32 = workload("matmul", "m=32,k=2048,n=1000", dtype="float32")
    assert "split_k" not in {k.name for k in tmpl.space(wl32, SM80)}
    conv = workload("conv2d", preset="resnet50.res3_3x3", dtype="float16")
    assert "split_k" not in {k.name for k in get_template("conv2d", "cuda").space(conv, SM80)}
    wl = workload("matmul_bias_relu", "m=32,k=2048,n=1000", dtype="float16")
    cfg = {**CASES[0][3]}
    del cfg["split_k"]
    base = {k: v for k, v in tmpl.default(wl, SM80).items() if k != "split_k"}
    assert str(tmpl.apply(wl, SM80, {**base, **cfg}).mod) == str(tmpl.apply(wl, SM80, {**base, **cfg, "split_k": 1}).mod)


def test_check_refuses_split_k_where_it_cannot_or_need_not_be_used():
    tmpl = get_template("matmul", "cuda")
    wl = workload("matmul", "m=32,k=2048,n=1000", dtype="float16")
    good = tmpl.config(wl, SM80, CASES[0][3])
    assert tmpl.check(wl, SM80, good) is None
    # mma_sync only
    assert "mma_sync" in tmpl.check(wl, SM80, {**good, "mma": "wmma"})
    # K / split_k not a whole number of chunk-wide K steps: 2016 / 4 = 504, not a multiple of 32 (chunk 2);
    # 2016 / 2 = 1008 is 63 steps of 16 (chunk 1)
    odd = workload("matmul", "m=32,k=2016,n=1000", dtype="float16")
    assert "whole number" in tmpl.check(odd, SM80, tmpl.config(odd, SM80, CASES[0][3]))
    assert tmpl.check(odd, SM80, tmpl.config(odd, SM80, {**CASES[0][3], "split_k": 2, "chunk": 1})) is None
    # large M: the output tiles alone fill the SMs (4096 / 32 x 1000 / 64 = 2048 blocks >= 108 SMs)
    big = workload("matmul", "m=4096,k=2048,n=1000", dtype="float16")
    assert "buys nothing" in tmpl.check(big, SM80, tmpl.config(big, SM80, CASES[0][3]))
    assert tmpl.check(big, SM80, tmpl.config(big, SM80, {**CASES[0][3], "split_k": 1})) is None
    # fewer K steps per slice than pipeline stages: 512 / 8 = 64, one K step of 64 (chunk 4) for 3 stages
    short = workload("matmul", "m=32,k=512,n=1000", dtype="float16")
    assert "pipeline stages" in tmpl.check(short, SM80, tmpl.config(short, SM80, {**CASES[1][3]}))


def test_split_k_is_a_cost_model_feature():
    tmpl = get_template("matmul", "cuda")
    wl = workload("matmul_bias_relu", "m=32,k=2048,n=1000", dtype="float16")
    cfg = tmpl.config(wl, SM80, CASES[0][3])
    f = tmpl.features(wl, SM80, cfg)
    t = tmpl.tiles(wl, cfg)
    assert f["split_k"] == 4 and f["workspace_bytes"] == 4 * t.m_pad * t.n_pad * 4 and f["blocks"] == 4 * t.output_tiles
    f1 = tmpl.features(wl, SM80, {**cfg, "split_k": 1})
    assert f1["split_k"] == 1 and f1["workspace_bytes"] == 0 and f1["blocks"] == t.output_tiles


# ------------------------------------------------------------------ on a GPU

@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is False); split-K kernel "
                                          "correctness on the device runs where one is")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_k_kernels_match_numpy_on_gpu(built, case):
    from opcompiler.backend.cuda import device_arch
    from opcompiler.verify import compare
    target = case[0]
    if int(str(target.extra["arch"])[3:]) > int(device_arch()[3:]):
        pytest.skip(f"{target.name} code cannot run on this GPU ({device_arch()})")
    k = built[id(case)]
    d = get_op(k.workload.op)
    inputs = d.make_inputs(k.workload, seed=1)
    res = CudaBackend(target).run(k, inputs)
    ok, err = compare(res.outputs[0], d.reference(k.workload, inputs))
    assert ok, f"max abs error {err}"


def test_benchmark_tunes_split_k_for_the_fc_row():
    """`benchmarks/cuda_mma_vs_peers.py` times the fc's mma_sync config at every split_k check() allows
    and keeps the fastest (here with a stand-in backend and made-up times: no GPU figure)."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import cuda_mma_vs_peers as bench
    finally:
        sys.path.pop(0)
    tmpl = get_template("matmul", "cuda")
    wl = workload("matmul", preset="resnet50.fc", batch=256, dtype="float16")  # the benchmark's fc row
    fake_seconds = {1: 4.0, 2: 3.0, 4: 2.0, 8: 2.5}

    class Backend:
        def build(self, wl, cfg):
            return SimpleNamespace(config=tmpl.config(wl, SM90, cfg))

        def measure(self, k, inputs):
            return SimpleNamespace(seconds=fake_seconds[k.config["split_k"]])

    be = Backend()
    start = be.build(wl, {"mma": "mma_sync"})
    assert start.config["split_k"] == 1
    best, sweep = bench.best_split_k(be, SM90, wl, start, None)
    assert set(sweep) == {1, 2, 4, 8}
    allowed = {s for s, v in sweep.items() if isinstance(v, float)}
    assert 1 in allowed and len(allowed) > 1
    assert all(v.startswith("refused: ") for s, v in sweep.items() if s not in allowed)
    assert best.config["split_k"] == min(allowed, key=fake_seconds.get)
    assert {k: v for k, v in best.config.items() if k != "split_k"} == {k: v for k, v in start.config.items()
                                                                        if k != "split_k"}
