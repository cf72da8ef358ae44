"""NVIDIA GPUs through TVM's CUDA codegen and NVRTC or nvcc.

`build` schedules the workload with its `schedules/cuda` template, lowers it with
`tvm.compile` for `Target({"kind": "cuda", "arch": <target's arch>})` and compiles the CUDA
source to a fatbin holding the `sm_XX` cubin and the `compute_XX` PTX (`cuda_compile.py`:
NVRTC when `cuda-bindings` imports, nvcc otherwise), the binary TVM's CUDA module loads through
our `tvm_callback_cuda_compile` hook. ptxas's resource report (registers, spills) is kept in
`Kernel.info` beside the compiler used, so a machine without a GPU can still check what it built.
Building never touches the GPU. `run` and `measure` need one: without it they say so and point at
`--rpc`.

`--target cuda` means the GPU in this machine: the target file whose arch is its compute
capability (`tvm.cuda(0).compute_version`), or `cuda-sm80` (`DEFAULT_TARGET`) when there is no GPU;
`opcompiler.target.resolve_auto_target` picks it, asking `opcompiler.device` for the GPU.
"""
from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tvm

from .. import device
from ..errors import OpcError, OpcFailure
from ..ops import get_op
from ..target import DEFAULT_CUDA, Target, resolve_auto_target  # noqa: F401  (`--target cuda`, for callers)
from ..workload import Workload
from .base import Backend, Kernel, RunResult, device_args
from .cuda_compile import (arch_number, compile_cuda, cuda_compiler, fatbin_entries, nvcc_path,  # noqa: F401
                           ptxas_facts)

NO_GPU = "no CUDA GPU found on this machine; use --rpc HOST:PORT:KEY to measure on a remote device"
DEFAULT_TARGET = DEFAULT_CUDA  # what `--target cuda` builds for on a machine without a GPU

# The GPU in this machine is `opcompiler.device`'s business (below the targets, which resolve
# `--target cuda` through it); its names stay importable from here for the backend's callers.
forbid_cuda, cuda_touched, has_gpu, device_arch = (device.forbid_cuda, device.cuda_touched, device.has_gpu,
                                                   device.device_arch)


def check_servable(target: Target) -> None:
    """Refuse, with one line naming both architectures (OpcError, exit 2), a target whose code this
    machine's GPU cannot run: one built for a newer architecture. An older target is served: its
    module carries PTX, which the driver JIT-compiles for the newer GPU."""
    dev = device.device_arch()
    arch = str(target.extra.get("arch", "sm_80"))
    if dev is None or arch == dev:
        return
    if arch_number(arch) > arch_number(dev) or arch.endswith("a"):
        raise OpcError(f"target {target.name} builds for {arch}, but this machine's GPU is {dev}: "
                       f"{arch} code cannot run on it", arg="--target", value=target.name,
                       expected=f"--target cuda (the GPU present, {dev}) or a target for {dev} or older")


def require_device_or_rpc(rpc_spec: str | None, target: Target | None = None) -> None:
    """Raise the one-line OpcError the CLI prints (exit 2) when there is neither a local GPU
    nor an `--rpc HOST:PORT:KEY` to measure on, or when the local GPU cannot run `target`'s code."""
    if rpc_spec:
        return
    if not device.has_gpu():
        raise OpcError(NO_GPU)
    if target is not None:
        check_servable(target)


def tvm_cuda_target(target: Target) -> tvm.target.Target:
    """The TVM target for one of our CUDA target descriptions (arch and limits from its file)."""
    e = target.extra
    return tvm.target.Target({
        "kind": "cuda", "arch": str(e.get("arch", "sm_80")),
        "max_threads_per_block": int(e.get("max_threads_per_block", 1024)),
        "max_shared_memory_per_block": int(e.get("max_shared_memory_per_block", 48 * 1024)),
        "thread_warp_size": int(e.get("warp_size", 32)),
    })


# ------------------------------------------------------------------ compiling

def nvcc_compile(source: str, arch: str, out: Path | None = None) -> tuple[bytes, dict[str, Any]]:
    """Compile CUDA `source` to a plain cubin with nvcc (`opcompiler build --cubin`); returns (cubin,
    ptxas facts). A compile error is our bug (the templates emitted it): OpcFailure with nvcc's message."""
    import subprocess
    import tempfile
    from .cuda_compile import _FLAGS, _errors
    with tempfile.TemporaryDirectory(prefix="opc_nvcc_") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cubin = out or Path(tmp) / "kernel.cubin"
        cmd = [nvcc_path(), "--cubin", "-O3", f"-arch={arch}", "-Xptxas", "-v", *_FLAGS,
               "--expt-relaxed-constexpr", "-o", str(cubin), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OpcFailure(f"nvcc failed on the generated kernel ({arch}): {_errors(proc.stderr)}")
        data = cubin.read_bytes()
    return data, {"nvcc_arch": arch, **ptxas_facts(proc.stderr), "cubin_bytes": len(data)}


def _hook_arch() -> str:
    """The arch TVM's compile hook builds for: the current TVM target's (a build, or a runner loading a
    module under its kernel's target), else the GPU present (a module loaded by an RPC server), else
    the default target's."""
    cur = tvm.target.Target.current(allow_none=True)
    if cur is not None and cur.kind.name == "cuda" and cur.attrs.get("arch"):
        return str(cur.attrs["arch"])
    if not device.cuda_forbidden() and (dev := device.device_arch()):
        return dev
    from ..target import builtin_targets
    return str(builtin_targets()[DEFAULT_TARGET].extra["arch"])


def _tvm_compile_hook(code: str, *_: Any) -> bytearray:
    """TVM's `tvm_callback_cuda_compile`: CUDA source -> fatbin (cubin + PTX) for `_hook_arch()`."""
    return bytearray(compile_cuda(code, _hook_arch()).data)


@cache
def install_compile_hook() -> None:
    """Route TVM's CUDA compilation (at build time where TVM has its CUDA runtime, else when a
    module is loaded) to `compile_cuda`: NVRTC or nvcc, PTX embedded."""
    tvm.register_global_func("tvm_callback_cuda_compile", _tvm_compile_hook, override=True)


install_nvcc_hook = install_compile_hook  # the name `opcompiler.rpc` servers used


# ------------------------------------------------------------------ roofline

def roofline(target: Target, wl: Workload, seconds: float) -> dict[str, Any]:
    """Which ceiling bounds this kernel on `target`, from the target file's figures: compute (peak
    FLOP/s for the dtype), DRAM (HBM bandwidth, the kernel's compulsory traffic: inputs read and the
    output written once) or L2 (where the file gives an L2 bandwidth: the same traffic through L2).
    `roofline_seconds` is the ceiling's time, `percent_of_roofline` how close the kernel came."""
    op = get_op(wl.op)
    flops = float(op.flops(wl))
    nbytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for _, shape, dt in op.inputs(wl))
    oshape, odt = op.output_spec(wl)
    nbytes += int(np.prod(oshape)) * np.dtype(odt).itemsize
    times: dict[str, float] = {}
    if peak := target.peak_flops(wl.dtype):
        times["compute"] = flops / peak
    for name, label in (("HBM", "DRAM"), ("L2", "L2")):
        level = next((m for m in target.memories if m.name == name), None)
        if level is not None and level.bandwidth_gbps:
            times[label] = nbytes / (level.bandwidth_gbps * 1e9)
    if not times:
        return {}
    bound = max(times, key=times.get)
    out: dict[str, Any] = {"bound": bound, "roofline_seconds": times[bound],
                           "arithmetic_intensity": flops / nbytes if nbytes else 0.0, "dram_bytes": nbytes}
    if seconds > 0:
        out["percent_of_roofline"] = 100.0 * times[bound] / seconds
    return out


# ------------------------------------------------------------------ the backend

class CudaBackend(Backend):
    """Build for an NVIDIA GPU; run and time on the local GPU when there is one."""

    family = "cuda"
    repeats = 20

    def __init__(self, target: Target):
        super().__init__(target)
        install_compile_hook()

    def build(self, wl: Workload, config: Mapping[str, Any] | None = None) -> Kernel:
        tmpl, cfg, mod = self.schedule(wl, config)
        target = tvm_cuda_target(self.target)
        compiler = cuda_compiler()  # a missing compiler is one line (exit 2) before any lowering
        # use_async_copy: copies inside a pipelined loop's async stage become cp.async (the `stages` knob)
        with target, tvm.transform.PassContext(config={"tirx.use_async_copy": True}):
            ex = tvm.compile(mod, target=target)
        dev_mods = [m for m in ex.mod.imports if m.kind == "cuda"]
        if not dev_mods:
            raise OpcFailure(f"{tmpl.name}: TVM produced no CUDA module for {wl.op}")
        source = dev_mods[0].inspect_source()
        # where TVM has its CUDA runtime it compiled the source through our hook inside tvm.compile
        # (this is then a cache hit); elsewhere it keeps the source and compiles it when the module is
        # loaded on a GPU. Compiling here makes a template that emits bad CUDA fail at build time and
        # gives ptxas's resource report.
        binary = compile_cuda(source, str(target.arch), compiler)
        images = fatbin_entries(binary.data) if binary.kind == "fatbin" else [{"kind": "elf"}]
        info: dict[str, Any] = {
            "arch": str(target.arch), "tensor_core": "wmma::mma_sync" in source or "mma.sync" in source,
            "threads_per_block": tmpl.tiles(wl, cfg).threads if hasattr(tmpl, "tiles") else None,
            "shared_bytes_per_block": tmpl.tiles(wl, cfg).shared_bytes if hasattr(tmpl, "tiles") else None,
            "cuda_compiler": binary.compiler, "binary": binary.kind,
            "ptx_embedded": any(e["kind"] == "ptx" for e in images),
            "nvcc_arch": binary.arch,  # the SASS architecture (name kept from the nvcc-only days)
            **binary.facts,
        }
        return Kernel(workload=wl, target=self.target, template=tmpl.name, template_version=tmpl.version,
                      config=cfg, artifact=ex, info=info)

    # -- on a GPU ---------------------------------------------------------------------------

    def _device(self) -> tvm.runtime.Device:
        if not device.has_gpu():
            raise OpcError(NO_GPU)
        check_servable(self.target)
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
        return cuda_metrics(self.target, kernel.workload, seconds)


def cuda_source(kernel: Kernel) -> str:
    """The CUDA C source of a kernel built by `CudaBackend` (what nvcc compiled)."""
    mods = [m for m in kernel.artifact.mod.imports if m.kind == "cuda"]
    if not mods:
        raise OpcFailure(f"kernel {kernel.template} holds no CUDA module")
    return mods[0].inspect_source()


def cuda_metrics(target: Target, wl: Workload, seconds: float) -> dict[str, Any]:
    """What a timed cuda run reports: % of peak, the roofline bound, and the GPU it ran on (whose code
    path: its own SASS, or PTX JIT-compiled by the driver when the target is older than the GPU)."""
    flops = get_op(wl.op).flops(wl)
    out: dict[str, Any] = {"percent_of_peak": percent_of_peak(target, wl.dtype, flops, seconds),
                           "tflops": flops / seconds / 1e12 if seconds > 0 else 0.0, **roofline(target, wl, seconds)}
    if not device.cuda_forbidden() and (dev := device.device_arch()):
        arch = str(target.extra.get("arch", ""))
        out["device_arch"] = dev
        out["loaded_as"] = "sass" if arch == dev else f"ptx jit ({arch} ptx on {dev})"
    return out


def percent_of_peak(target: Target, dtype: str, flops: float, seconds: float) -> float:
    """Achieved share of the target's peak for `dtype` (0 when the peak is unknown)."""
    peak = target.peak_flops(dtype)
    return 100.0 * flops / seconds / peak if peak and seconds > 0 else 0.0
