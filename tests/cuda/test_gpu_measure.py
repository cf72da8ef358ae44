"""GPU measurement's structure, checked without a GPU: build processes that never initialise
CUDA, one runner process started with `spawn`, and a runner that crashes, hangs or reports a CUDA
fault is replaced while tuning goes on.

The runner here is a test double (`gpu_fakes.FakeRunner`, chosen through `RunnerSpec.factory`
like any runner) that "times" the library the builder wrote and misbehaves on poisoned configs;
the process machinery around it, spawning, pipes, deadlines, restarts, is the real one. The
builds in `test_builders_never_initialise_cuda` are real (TVM + nvcc) in real build processes.
"""
from __future__ import annotations

import os
import shutil

import pytest

from opcompiler.backend.cuda import has_gpu
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.tune.gpu_runner import GpuMeasurer, RunnerSpec
from opcompiler.tune.measure import BackendSpec, Measurer

from . import gpu_fakes

SM80 = load_target("cuda-sm80")
WL = workload("matmul", "m=32,k=64,n=48", dtype="float16")
FAKE_RUNNER = RunnerSpec(target=SM80, factory=gpu_fakes.RUNNER_FACTORY)
FAKE_BUILDER = BackendSpec(target=SM80, factory=gpu_fakes.BUILDER_FACTORY)


def test_a_local_gpu_target_takes_the_builder_runner_path():
    assert Measurer.uses_gpu_runner(BackendSpec(target=SM80), workers=8)
    assert not Measurer.uses_gpu_runner(BackendSpec(target=SM80), workers=0)  # in-process debugging
    assert not Measurer.uses_gpu_runner(BackendSpec(target=SM80, rpc="h:9190:k"), workers=2)  # remote device
    assert not Measurer.uses_gpu_runner(BackendSpec(target=load_target("cpu")), workers=2)


def test_runner_is_spawned_and_replaced_after_a_crash_a_fault_and_a_hang():
    cfgs = [{"a": 1}, {"poison": "exit"}, {"a": 2}, {"poison": "cuda"}, {"a": 3}, {"poison": "hang"}, {"a": 4},
            {"poison": "invalid"}]
    seen: list[int] = []
    with GpuMeasurer(FAKE_BUILDER, workers=2, timeout=4, runner=FAKE_RUNNER) as m:
        res = m.measure(WL, cfgs, on_result=lambda i, r: seen.append(i))
        st = dict(m.stats)
        history = list(m.runner_history)
    status = {tuple(c.items())[0]: r.status for c, r in zip(cfgs, res)}
    assert status == {("a", 1): "ok", ("poison", "exit"): "crash", ("a", 2): "ok", ("poison", "cuda"): "crash",
                      ("a", 3): "ok", ("poison", "hang"): "timeout", ("a", 4): "ok", ("poison", "invalid"): "invalid"}
    by = dict(zip(map(str, cfgs), res))
    assert "runner died (exit code 7)" in by[str({"poison": "exit"})].error
    assert "illegal memory access" in by[str({"poison": "cuda"})].error
    assert [r.seconds for r in res if r.status == "ok"] == pytest.approx([2e-3, 3e-3, 4e-3, 5e-3])
    assert sorted(seen) == list(range(len(cfgs)))  # every candidate reported, none lost
    # one restart per poisoned run (exit, CUDA fault, hang), each runner a fresh spawned interpreter; a
    # replacement starts when there is something to run (none after a poisoned run that came last)
    assert st["runner_restarts"] == 3 and len(history) in (3, 4)
    assert len({h["pid"] for h in history}) == len(history) and os.getpid() not in {h["pid"] for h in history}
    for h in history:
        assert h["start_method"] == "spawn" and any("spawn_main" in a for a in h["argv"])
    assert st["candidates"] == len(cfgs) and st["candidates_per_second"] == pytest.approx(len(cfgs) / st["seconds"])


def test_a_runner_that_cannot_start_fails_each_candidate_in_one_line():
    """The real runner on a machine without a GPU: it cannot start; after two tries every candidate
    says why (and measuring does not hang)."""
    if has_gpu():
        pytest.skip("this machine has a GPU: the runner starts")
    with GpuMeasurer(FAKE_BUILDER, workers=1, timeout=30, runner=RunnerSpec(target=SM80)) as m:
        res = m.measure(WL, [{"a": 1}, {"a": 2}, {"a": 3}])
    assert [r.status for r in res] == ["crash"] * 3
    assert all("runner could not start" in r.error and "no CUDA GPU" in r.error for r in res)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) is not installed")
def test_builders_never_initialise_cuda():
    """Real builds (schedule, TVM codegen, nvcc/NVRTC, export_library) in the build processes: each
    reports that it never asked TVM for a GPU, that CUDA was not initialised (torch, which TVM's FFI
    imports when installed, says so), that every device was hidden from the driver, and with nvcc
    that no CUDA Python bindings were imported; the runner got a non-empty library for each."""
    cfgs = [{"chunk": 1}, {"chunk": 2}]
    with GpuMeasurer(BackendSpec(target=SM80), workers=1, timeout=300, runner=FAKE_RUNNER) as m:
        res = m.measure(WL, cfgs)
        builds = list(m.build_log)
    assert [r.status for r in res] == ["ok", "ok"], [r.error for r in res]
    assert all(r.metrics["library_bytes"] > 0 and r.metrics["cuda_compiler"] in ("nvrtc", "nvcc") for r in res)
    assert len(builds) == 2
    for b in builds:
        assert b.pid not in (0, os.getpid())
        assert b.cuda_touched is False and b.cuda_initialised is False
        assert b.cuda_visible_devices == ""
        if b.info["cuda_compiler"] == "nvcc":  # NVRTC comes through cuda.bindings; nvcc needs none of it
            assert b.cuda_python_modules == ()
        assert b.info["ptx_embedded"] is True


def test_a_builder_cannot_reach_the_gpu(monkeypatch):
    """What `forbid_cuda` does in a build process: TVM's device API and `has_gpu` refuse."""
    import tvm
    from opcompiler import device
    from opcompiler.backend import cuda
    monkeypatch.setattr(device, "_FORBIDDEN", "")
    monkeypatch.setattr(tvm, "cuda", tvm.cuda)
    monkeypatch.setattr(tvm.runtime, "cuda", getattr(tvm.runtime, "cuda", None), raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cuda.forbid_cuda("a test")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(RuntimeError, match="must not be initialised"):
        tvm.cuda(0)
    with pytest.raises(RuntimeError, match="must not be initialised"):
        cuda.has_gpu()


# ------------------------------------------------------------------ on a GPU

@pytest.mark.skipif(not has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is False)")
@pytest.mark.gpu
def test_real_runner_measures_and_verifies_on_the_gpu():
    from opcompiler.backend.cuda import resolve_auto_target
    t = resolve_auto_target()
    cfgs = [{"chunk": 1}, {"chunk": 2}, {"chunk": 4}, {"chunk": 2, "vec": 4}]
    with Measurer(BackendSpec(target=t), workers=2, timeout=120) as m:
        res = m.measure(WL, cfgs)
        checked = m.measure(WL, cfgs[:1], verify=True)[0]
        st = m.stats
    assert [r.status for r in res] == ["ok"] * 4 and all(r.seconds > 0 for r in res)
    assert checked.status == "ok" and checked.verified
    assert st["runner_restarts"] == 0 and st["candidates_per_second"] > 0


def test_the_runner_loop_loads_times_and_verifies_a_library(tmp_path):
    """`CudaRunner.run` on a library from the build path, with the GPU swapped for the host CPU (a
    cpu kernel, since none can run here on a GPU): loads it, runs it on shared inputs and a fresh
    zeroed output, checks it against numpy, times it and reports the roofline metrics."""
    import tvm
    from opcompiler.backend import get_backend
    from opcompiler.backend.cuda_runner import CudaRunner
    from opcompiler.tune.gpu_runner import RunTask, TaskRunner, build_one

    cpu = load_target("cpu")
    wl = workload("matmul", "m=32,k=64,n=48", dtype="float32")
    b = build_one(get_backend(cpu), wl, {}, str(tmp_path / "k.so"))
    assert b.status == "ok" and os.path.getsize(b.path) > 0
    gpu = CudaRunner.__new__(CudaRunner)
    gpu.target, gpu.number, gpu.repeat, gpu.min_repeat_ms = SM80, 1, 2, 1
    gpu.tvm, gpu.dev, gpu.tvm_target, gpu._inputs = tvm, tvm.cpu(0), tvm.target.Target("llvm"), {}
    runner = TaskRunner(RunnerSpec(target=SM80, repeat=2, min_repeat_ms=1), gpu)
    res, fatal = runner.run(RunTask(wl=wl, path=b.path, entry=b.entry, verify=True))
    assert (res.status, fatal, res.verified) == ("ok", False, True), res.error
    assert res.seconds > 0 and res.metrics["max_abs_err"] < 1e-3 and res.metrics["bound"] in ("compute", "DRAM")
    again, _ = runner.run(RunTask(wl=wl, path=b.path, entry=b.entry))
    assert again.status == "ok" and len(gpu._inputs) == 1  # inputs made once per workload
    broken, fatal = runner.run(RunTask(wl=wl, path=str(tmp_path / "missing.so"), entry="main"))
    assert broken.status == "crash" and not fatal  # not a CUDA error: the runner stays
