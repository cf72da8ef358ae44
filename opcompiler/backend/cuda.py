"""NVIDIA GPUs through TVM's CUDA codegen and nvcc.

`build` schedules the workload with its `schedules/cuda` template, lowers it with
`tvm.compile` for `Target({"kind": "cuda", "arch": <target's arch>})` and compiles the CUDA
source with nvcc (through TVM's `tvm_callback_cuda_compile` hook, so the binary TVM loads is
the one nvcc produced). ptxas's resource report (registers, spills) is kept in `Kernel.info`
next to the source, so a machine without a GPU can still check what it built. `run` and
`measure` need a GPU: on a machine without one they say so and point at `--rpc`.
"""
from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tvm

from ..errors import OpcError, OpcFailure
from ..ops import get_op
from ..target import Target
from ..workload import Workload
from . import Backend, Kernel, RunResult, device_args

NO_GPU = "no CUDA GPU found on this machine; use --rpc HOST:PORT:KEY to measure on a remote device"


def has_gpu() -> bool:
    """Whether this process sees a CUDA device (False when TVM has no CUDA runtime)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a TVM build without the CUDA runtime
        return False


def require_device_or_rpc(rpc_spec: str | None) -> None:
    """Raise the one-line OpcError the CLI prints (exit 2) when there is neither a local GPU
    nor an `--rpc HOST:PORT:KEY` to measure on."""
    if not rpc_spec and not has_gpu():
        raise OpcError(NO_GPU)


def tvm_cuda_target(target: Target) -> tvm.target.Target:
    """The TVM target for one of our CUDA target descriptions (arch and limits from its file)."""
    e = target.extra
    return tvm.target.Target({
        "kind": "cuda", "arch": str(e.get("arch", "sm_80")),
        "max_threads_per_block": int(e.get("max_threads_per_block", 1024)),
        "max_shared_memory_per_block": int(e.get("max_shared_memory_per_block", 48 * 1024)),
        "thread_warp_size": int(e.get("warp_size", 32)),
    })


# ------------------------------------------------------------------ nvcc

@cache
def nvcc_path() -> str:
    path = shutil.which("nvcc") or next((str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.exists()), "")
    if not path:
        raise OpcError("nvcc not found: install the CUDA toolkit (or put nvcc on PATH) to build for cuda targets")
    return path


_PTXAS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def nvcc_compile(source: str, arch: str, out: Path | None = None) -> tuple[bytes, dict[str, Any]]:
    """Compile CUDA `source` to a cubin with nvcc; returns (cubin, ptxas facts). A compile error
    is our bug (the templates emitted it), so it raises OpcFailure with nvcc's message."""
    with tempfile.TemporaryDirectory(prefix="opc_nvcc_") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cubin = out or Path(tmp) / "kernel.cubin"
        cmd = [nvcc_path(), "--cubin", "-O3", f"-arch={arch}", "-Xptxas", "-v", "--use_fast_math",
               "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "--expt-relaxed-constexpr",
               "-o", str(cubin), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.splitlines()
            errs = [" ".join(lines[i:i + 2]) for i, ln in enumerate(lines) if "error" in ln and "detected" not in ln]
            raise OpcFailure(f"nvcc failed on the generated kernel ({arch}): {' | '.join(errs)[:1500]}")
        data = cubin.read_bytes()
    log = proc.stderr
    facts: dict[str, Any] = {"nvcc_arch": arch}
    regs = [int(x) for x in _PTXAS.findall(log)]
    spills = [(int(a), int(b)) for a, b in _SPILL.findall(log)]
    smem = [int(x) for x in _SMEM.findall(log)]
    facts["registers_per_thread"] = max(regs) if regs else 0
    facts["spill_bytes"] = sum(a + b for a, b in spills)
    facts["static_smem_bytes"] = max(smem) if smem else 0
    facts["cubin_bytes"] = len(data)
    return data, facts


def _tvm_nvcc_callback(code: str, *_: Any) -> bytearray:
    """TVM's CUDA runtime compiles a module's source when it is loaded on a GPU: do it with
    nvcc for the device actually present."""
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "") if has_gpu() else "sm_80"
    return bytearray(nvcc_compile(code, arch)[0])


@cache
def install_nvcc_hook() -> None:
    """TVM's default hook wants NVRTC (the cuda-bindings package); route it to nvcc instead."""
    tvm.register_global_func("tvm_callback_cuda_compile", _tvm_nvcc_callback, override=True)


# ------------------------------------------------------------------ the backend

class CudaBackend(Backend):
    """Build for an NVIDIA GPU; run and time on the local GPU when there is one."""

    family = "cuda"
    repeats = 20

    def build(self, wl: Workload, config: Mapping[str, Any] | None = None) -> Kernel:
        tmpl, cfg, mod = self.schedule(wl, config)
        target = tvm_cuda_target(self.target)
        with target:
            ex = tvm.compile(mod, target=target)
        dev_mods = [m for m in ex.mod.imports if m.kind == "cuda"]
        if not dev_mods:
            raise OpcFailure(f"{tmpl.name}: TVM produced no CUDA module for {wl.op}")
        source = dev_mods[0].inspect_source()
        # TVM keeps the source and compiles it when the module is loaded on a GPU; compile it now
        # so a template that emits bad CUDA fails here, and keep ptxas's resource report
        _, facts = nvcc_compile(source, str(target.arch))
        info: dict[str, Any] = {
            "arch": str(target.arch), "tensor_core": "wmma::mma_sync" in source or "mma.sync" in source,
            "threads_per_block": tmpl.tiles(wl, cfg).threads if hasattr(tmpl, "tiles") else None,
            "shared_bytes_per_block": tmpl.tiles(wl, cfg).shared_bytes if hasattr(tmpl, "tiles") else None,
            **facts,
        }
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=cfg, artifact=ex, info=info)

    # -- on a GPU ---------------------------------------------------------------------------

    def _device(self) -> tvm.runtime.Device:
        if not has_gpu():
            raise OpcError(NO_GPU)
        install_nvcc_hook()
        return tvm.cuda(0)

    def _args(self, kernel: Kernel, inputs: Sequence[np.ndarray], dev: tvm.runtime.Device) -> list:
        return device_args(kernel.workload, inputs, dev)

    def _time(self, kernel: Kernel, args: list, dev: tvm.runtime.Device) -> float:
        ex = kernel.artifact
        f = ex.mod.time_evaluator(ex.mod.entry_name, dev, number=10, repeat=self.repeats, min_repeat_ms=10)
        ex(*args)  # warm-up (module load, first launch)
        dev.sync()
        return float(statistics.median(f(*args).results))

    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        dev = self._device()
        args = self._args(kernel, inputs, dev)
        kernel.artifact(*args)
        dev.sync()
        out = args[-1].numpy()
        secs = self._time(kernel, args, dev)
        return RunResult(outputs=[out], seconds=secs, metrics=self._metrics(kernel, secs))

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        dev = self._device()
        if inputs is None:
            inputs = get_op(kernel.workload.op).make_inputs(kernel.workload)
        args = self._args(kernel, inputs, dev)
        secs = self._time(kernel, args, dev)
        return RunResult(outputs=None, seconds=secs, metrics=self._metrics(kernel, secs))

    def _metrics(self, kernel: Kernel, seconds: float) -> dict[str, Any]:
        flops = get_op(kernel.workload.op).flops(kernel.workload)
        return {"percent_of_peak": percent_of_peak(self.target, kernel.workload.dtype, flops, seconds)}


def cuda_source(kernel: Kernel) -> str:
    """The CUDA C source of a kernel built by `CudaBackend` (what nvcc compiled)."""
    mods = [m for m in kernel.artifact.mod.imports if m.kind == "cuda"]
    if not mods:
        raise OpcFailure(f"kernel {kernel.template} holds no CUDA module")
    return mods[0].inspect_source()


def percent_of_peak(target: Target, dtype: str, flops: float, seconds: float) -> float:
    """Achieved share of the target's peak for `dtype` (0 when the peak is unknown)."""
    peak = target.peak_flops(dtype)
    return 100.0 * flops / seconds / peak if peak and seconds > 0 else 0.0
