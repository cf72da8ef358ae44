"""The fp16 tensor-core template's `stages` knob: cp.async multi-stage shared-memory pipelining.

Compile-time checks only (no GPU): the generated CUDA issues `cp.async` copies (predicated with
zero-fill for the padded im2col gather) and waits on commit groups; ptxas's register and spill
report stays within the target's budget; the shared memory the lowered kernel allocates is what
`check()` predicted from the knobs (the operand tiles multi-buffered `stages` times), so a config
over a part's shared memory is rejected before it is built. Whether pipelining is faster is a GPU
measurement (the tuner decides per layer); no speed is claimed here.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import replace
from types import MappingProxyType

import pytest

from opcompiler.backend.cuda import CudaBackend, cuda_source, has_gpu, tvm_cuda_target
from opcompiler.ops import get_op, workload
from opcompiler.schedules.cuda import gemm
from opcompiler.target import load_target
from opcompiler.template import get_template

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not installed")

SM80, SM90 = load_target("cuda-sm80"), load_target("cuda-sm90")
CONV = workload("conv2d_bn_relu", "n=2,c=64,h=14,w=14,k=64,r=3,s=3,pad=1,layout=NHWC", dtype="float16")
MM = workload("matmul", "m=256,k=256,n=256", dtype="float16")
CFG = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2, "warp_col_tiles": 2, "chunk": 2, "vec": 8}


@pytest.mark.parametrize("target,wl,stages", [(SM80, CONV, 2), (SM80, CONV, 3), (SM90, CONV, 3), (SM80, MM, 2),
                                               (SM90, MM, 3)],
                         ids=["sm80-conv-2", "sm80-conv-3", "sm90-conv-3", "sm80-mm-2", "sm90-mm-3"])
def test_pipelined_kernels_use_cp_async_and_fit(target, wl, stages):
    tmpl = get_template(get_op(wl.op).family, "cuda")
    cfg = tmpl.config(wl, target, {**CFG, "stages": stages})
    assert tmpl.check(wl, target, cfg) is None
    k = CudaBackend(target).build(wl, cfg)
    src = cuda_source(k)
    assert re.search(r"cp\.async\.c[ga]\.shared\.global", src), "no cp.async copy in the kernel"
    assert f"cp.async.wait_group {stages - 1}" in src and "cp.async.commit_group" in src
    if wl is CONV:  # the padded gather: cp.async predicated, zero-filling the halo
        assert "@p cp.async" in src and "@!p st.shared" in src
    lim = gemm.cuda_limits(target)
    assert 0 < k.info["registers_per_thread"] <= lim["max_registers_per_thread"]
    assert k.info["registers_per_thread"] * k.info["threads_per_block"] <= lim["registers_per_sm"]
    assert k.info["spill_bytes"] == 0 and k.info["ptx_embedded"] is True
    # the lowered kernel allocates what the knobs predicted: the operand tiles `stages` times
    measured = gemm.measured_shared_bytes(tmpl.apply(wl, target, cfg).mod, tvm_cuda_target(target))
    one = tmpl.tiles(wl, {**cfg, "stages": 1})
    assert measured == k.info["shared_bytes_per_block"] == tmpl.tiles(wl, cfg).shared_bytes
    assert measured - one.static_shared_bytes == stages * (one.shared_bytes - one.static_shared_bytes)


def test_one_stage_is_the_unpipelined_kernel():
    k = CudaBackend(SM80).build(CONV, {**CFG, "stages": 1})
    assert "cp.async" not in cuda_source(k)


def test_stages_are_checked_against_the_target():
    tmpl = get_template("conv2d", "cuda")
    cfg = tmpl.config(CONV, SM80, {**CFG, "block_row_warps": 4, "warp_row_tiles": 2})  # 128 x 64 x 32 tiles
    small = replace(SM80, extra=MappingProxyType({**SM80.extra, "max_shared_memory_per_block": 49152}))
    assert tmpl.check(CONV, small, {**cfg, "stages": 1}) is None  # 15 KB of operands + 32 KB staging
    why = tmpl.check(CONV, small, {**cfg, "stages": 2})
    assert why is not None and "shared memory" in why and "49152" in why
    turing = replace(SM80, extra=MappingProxyType({**SM80.extra, "arch": "sm_75"}))
    assert "cp.async" in (tmpl.check(CONV, turing, {**cfg, "stages": 2}) or "")
    assert "stages" in {k.name for k in tmpl.space(CONV, SM80)}


def test_a_gathered_operand_is_not_copied_with_a_wide_cp_async():
    """TVM's cp.async injection copies `vec * 2` contiguous bytes from the first element of a
    vectorized copy, ignoring a gather's stride: the fc matmul's B (k x n, N-contiguous, gathered
    along K) then read wrong elements from a misaligned address (cudaErrorMisalignedAddress on an
    H100). Pipelined, a gathered operand is copied element-wise; the K-contiguous A keeps cp.async."""
    wl = workload("matmul", preset="resnet50.fc", batch=256, dtype="float16")
    k = CudaBackend(SM90).build(wl, {**CFG, "stages": 2})
    src = cuda_source(k)
    calls = re.findall(r"ptx_cp_async\w*\(buf_dyn_shmem_ptr, [^;]*?, (tensor_\w+_ptr)", src)
    assert calls and set(calls) == {"tensor_a_ptr"}, calls


@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("wl,stages", [(workload("matmul", preset="resnet50.fc", batch=256, dtype="float16"), 2),
                                       (workload("matmul", preset="resnet50.fc", batch=256, dtype="float16"), 3),
                                       (CONV, 2), (CONV, 3)], ids=["fc-2", "fc-3", "conv-2", "conv-3"])
def test_pipelined_kernels_match_numpy_on_gpu(wl, stages):
    """Every pipelined kernel crashed the H100 (misaligned cp.async) before the gather fix."""
    from opcompiler.backend.cuda import resolve_auto_target
    from opcompiler.verify import compare
    target = resolve_auto_target()
    backend = CudaBackend(target)
    op = get_op(wl.op)
    inputs = op.make_inputs(wl, seed=3)
    res = backend.run(backend.build(wl, {**CFG, "stages": stages}), inputs)
    ok, err = compare(res.outputs[0], op.reference(wl, inputs))
    assert ok, f"max abs error {err}"
