"""The fp16 `mma = mma_sync` path: PTX mma.sync.m16n8k16 fed by ldmatrix, epilogue on the accumulators.

Compile-side checks (no GPU needed, only a CUDA compiler): the PTX embedded in the very fatbin the
kernel loads contains `mma.sync.aligned.m16n8k16` and `ldmatrix.sync.aligned.m8n8.x4` and no WMMA;
the fragments stay in registers (no local memory in the PTX, no ptxas stack frame, no spills);
ptxas's registers fit the kernel's `__launch_bounds__` and the SM's register file; the shared memory
TVM's lowering allocates is what `check()` predicted and fits the target; the fused epilogue (bias,
bn scale / shift, relu) is in the one kernel with no shared staging tile. Whether the kernels are
right is checked on a GPU (the last test); whether they are faster is a GPU measurement
(`benchmarks/cuda_mma_vs_peers.py`), not claimed here.
"""
from __future__ import annotations

import re
import shutil

import pytest

from opcompiler.backend.cuda import CudaBackend, cuda_source, has_gpu, tvm_cuda_target
from opcompiler.backend.cuda_compile import compile_cuda, embedded_ptx
from opcompiler.ops import get_op, workload
from opcompiler.schedules.cuda import gemm
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.verify import compare


from .compiler import needs_compiler

pytestmark = needs_compiler

SM80, SM90 = load_target("cuda-sm80"), load_target("cuda-sm90")
T2x2 = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2, "warp_col_tiles": 2, "chunk": 2}
BIG = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 4, "warp_col_tiles": 2, "chunk": 4}

# (target, op, preset or shape, config): plain GEMM, fused conv epilogues (NHWC and NCHW), M and K not
# multiples of the tile (7x7 outputs, conv1's K = 147), the fc (m = 1), pipelined and rasterized tiles
CASES = [
    (SM80, "matmul", "m=256,k=256,n=256", {**T2x2}),
    (SM80, "conv2d_bias_relu", "n=2,c=64,h=14,w=14,k=64,r=3,s=3,pad=1,layout=NHWC", {**T2x2, "stages": 2}),
    (SM80, "conv2d_bn_relu", "resnet50.res2_3x3", {**T2x2, "stages": 3, "raster": 4}),
    (SM80, "conv2d", "resnet50.conv1", {}),
    (SM80, "matmul_bias_relu", "m=64,k=96,n=80", {}),
    (SM80, "matmul", "resnet50.fc", {"stages": 2}),
    (SM90, "conv2d_bn_relu", "resnet50.res5_3x3", {**BIG, "stages": 3, "vec": 8}),
    (SM90, "conv2d", "n=32,c=256,h=14,w=14,k=256,r=3,s=3,pad=1,layout=NHWC", {**BIG, "stages": 3, "raster": 8}),
]
IDS = [f"{t.name}-{op}-{shape.split(',')[0]}-{'-'.join(f'{k}{v}' for k, v in cfg.items() if k in ('stages', 'raster'))}"
       for t, op, shape, cfg in CASES]


def _wl(op: str, shape: str):
    return workload(op, shape if "=" in shape else None, preset=None if "=" in shape else shape, dtype="float16")


@pytest.fixture(scope="module")
def built() -> dict:
    out = {}
    for case in CASES:
        target, op, shape, cfg = case
        out[id(case)] = CudaBackend(target).build(_wl(op, shape), {**cfg, "mma": "mma_sync"})
    return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ptx_has_mma_sync_and_ldmatrix(built, case):
    k = built[id(case)]
    binary = compile_cuda(cuda_source(k), k.info["arch"])  # cached: the binary the build made
    ptx = embedded_ptx(binary.data)
    assert ptx, "the fatbin carries no PTX"
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "wmma" not in ptx and "wmma" not in cuda_source(k)
    # the fragments are registers: no local-memory array survives to PTX, ptxas keeps no stack frame
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    assert k.info["stack_frame_bytes"] == 0
    if k.config.get("stages", 1) > 1 and k.workload.layout != "NCHW":
        # (an NCHW conv's operands have no contiguous K run of 8: both are copied element-wise with
        # plain loads, as on the WMMA path, see gemm.operand_vectors)
        assert "cp.async.cg.shared.global" in ptx or "cp.async.ca.shared.global" in ptx
    assert k.info["tensor_core"] is True


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ptxas_registers_within_launch_bounds_no_spills(built, case):
    target = case[0]
    k = built[id(case)]
    lim = gemm.cuda_limits(target)
    src = cuda_source(k)
    bounds = {int(x) for x in re.findall(r"__launch_bounds__\((\d+)\)", src)}
    assert bounds == {k.info["threads_per_block"]}
    regs = k.info["registers_per_thread"]
    assert k.info["spill_bytes"] == 0
    assert 0 < regs <= min(lim["max_registers_per_thread"], lim["registers_per_sm"] // k.info["threads_per_block"])
    # check()'s estimate is not below what ptxas used by more than the addressing slack it allows
    tmpl = get_template(get_op(k.workload.op).family, "cuda")
    assert tmpl.tiles(k.workload, k.config).registers + 32 >= regs


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shared_memory_fits_and_matches_the_model(built, case):
    target, op, shape, _ = case
    k = built[id(case)]
    wl = k.workload
    tmpl = get_template(get_op(wl.op).family, "cuda")
    t = tmpl.tiles(wl, k.config)
    measured = gemm.measured_shared_bytes(tmpl.apply(wl, target, k.config).mod, tvm_cuda_target(target))
    assert measured == t.shared_bytes == k.info["shared_bytes_per_block"]
    assert measured <= target.extra["max_shared_memory_per_block"]
    # no accumulator staging tile: the operand tiles (multi-buffered `stages` times) are all there is
    assert t.static_shared_bytes == 0 and k.info["static_smem_bytes"] == 0
    assert t.shared_bytes == k.config.get("stages", 1) * (t.bm + t.bn) * (t.bk + gemm.SMEM_PAD_HALF) * 2


def test_epilogue_is_applied_to_the_accumulators(built):
    """bias / bn scale and shift / relu are read and applied in the same kernel, between the
    accumulator registers and the global store, with no shared staging of C."""
    for case in CASES:
        k = built[id(case)]
        src = cuda_source(k)
        assert len(set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', src))) == 1
        assert not re.search(r"__shared__ .*float", src)
        if "bias" in k.workload.op:
            assert "bias" in src and "max(" in src
        if "bn" in k.workload.op:
            assert "scale" in src and "shift" in src and "max(" in src


def test_defaults_are_unchanged():
    """mma_sync is a knob value the tuner explores; without a GPU measurement the default stays WMMA."""
    for op, preset in (("conv2d", "resnet50.res3_3x3"), ("matmul", "resnet50.fc")):
        wl = workload(op, preset=preset, dtype="float16")
        tmpl = get_template(op, "cuda")
        d = tmpl.default(wl, SM80)
        assert d["mma"] == "wmma" and d["raster"] == 1
        assert {"wmma", "mma_sync"} == set(next(k for k in tmpl.space(wl, SM80) if k.name == "mma").values)


def test_mma_sync_needs_less_shared_memory_than_wmma():
    """The WMMA path stages the fp32 block tile in (static) shared memory for its epilogue; mma_sync
    does not, so tiles that WMMA cannot launch fit (128 x 128 fp32 = 64 KB static, over CUDA's 48 KB)."""
    wl = workload("conv2d", preset="resnet50.res3_3x3", dtype="float16")
    tmpl = get_template("conv2d", "cuda")
    wide = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 4, "warp_col_tiles": 4, "chunk": 4,
            "stages": 3}
    assert "static shared memory" in (tmpl.check(wl, SM90, tmpl.config(wl, SM90, wide)) or "")
    cfg = tmpl.config(wl, SM90, {**wide, "mma": "mma_sync"})
    assert tmpl.check(wl, SM90, cfg) is None


def test_raster_groups_blocks_only_where_it_divides():
    """raster = g reorders the block index (g M tiles down one N column, then the next column); where
    g does not divide the M tiles, or covers all of them, the schedule keeps the row-major order."""
    tmpl = get_template("matmul", "cuda")
    base = {**T2x2, "mma": "mma_sync"}  # 64 x 64 block tiles

    def lowered(m: int, g: int) -> str:
        wl = workload("matmul", f"m={m},k=64,n=256", dtype="float16")
        return str(tmpl.apply(wl, SM80, tmpl.config(wl, SM80, {**base, "raster": g})).mod)

    assert lowered(512, 4) != lowered(512, 1)  # 8 M tiles in groups of 4
    assert lowered(512, 8) == lowered(512, 1)  # one group of all 8: left row-major
    assert lowered(320, 4) == lowered(320, 1)  # 5 M tiles: 4 does not divide


gpu = pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is False); "
                                                "mma_sync kernel correctness runs where one is")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_mma_sync_kernels_match_numpy_on_gpu(built, case):
    target = case[0]
    if str(target.extra["arch"]) != f"sm_{tvm_cuda_arch()}" and int(target.extra["arch"][3:]) > tvm_cuda_arch():
        pytest.skip(f"{target.name} code cannot run on this GPU (sm_{tvm_cuda_arch()})")
    k = built[id(case)]
    wl = k.workload
    op = get_op(wl.op)
    inputs = op.make_inputs(wl, seed=1)
    res = CudaBackend(target).run(k, inputs)
    ok, err = compare(res.outputs[0], op.reference(wl, inputs))
    assert ok, f"max abs error {err}"


def tvm_cuda_arch() -> int:
    from opcompiler.backend.cuda import device_arch
    return int(device_arch()[3:])


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: the no-GPU exit does not apply")
def test_benchmark_says_no_gpu_and_exits_2():
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_mma_vs_peers.py"
    proc = subprocess.run([sys.executable, str(script), "--layers", "fc"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "needs an NVIDIA GPU (nothing was measured)" in proc.stderr
