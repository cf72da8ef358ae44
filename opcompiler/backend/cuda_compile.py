"""CUDA C -> a loadable GPU binary, with NVRTC or nvcc, PTX embedded beside the SASS.

One function, `compile_cuda(source, arch)`, serves the build (ptxas's resource report for
`Kernel.info`) and TVM's `tvm_callback_cuda_compile` hook (the binary TVM's CUDA module loads
with `cuModuleLoadData`); results are cached by (source, arch, compiler), so a build compiles once.

The binary is a fatbin holding the `sm_XX` cubin AND the `compute_XX` PTX (uncompressed, so it can
be read back: `fatbin_entries`), as `nvcc -gencode arch=compute_XX,code=[sm_XX,compute_XX]` makes it: the cubin loads on the
architecture it was built for, and the driver JIT-compiles the PTX on any newer GPU (a module
built for sm_80 then also loads on an sm_90 H100).

Which compiler: NVRTC when the `cuda-bindings` package imports and the CUDA headers are found
(`pip install 'opcompiler[cuda]'`), nvcc otherwise; `OPC_CUDA_COMPILER=nvcc|nvrtc` forces one.
Neither available is a one-line `OpcError` saying what to install. Neither compiler needs a GPU
or initialises CUDA (importing `cuda.bindings.nvrtc` loads the compiler library only).
"""
from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..device import arch_digits
from ..errors import OpcError, OpcFailure
from ..settings import cuda_homes, forced_cuda_compiler

COMPILERS = ("nvrtc", "nvcc")
NO_COMPILER = ("no CUDA compiler found: install NVRTC with pip install 'opcompiler[cuda]' (cuda-bindings), "
               "or put the CUDA toolkit's nvcc on PATH")


@dataclass(frozen=True)
class CudaBinary:
    """What a compile produced: `data` is a fatbin (cubin + PTX) or, failing a fatbin tool, a cubin."""

    data: bytes
    kind: str  # "fatbin" | "cubin"
    compiler: str  # "nvrtc" | "nvcc"
    arch: str  # "sm_80"
    facts: dict[str, Any] = field(default_factory=dict)  # ptxas: registers, spills, static smem

    @property
    def ptx_embedded(self) -> bool:
        return any(e["kind"] == "ptx" for e in fatbin_entries(self.data)) if self.kind == "fatbin" else False


def arch_number(arch: str) -> int:
    """`sm_90` / `sm_90a` / `compute_80` / `9.0` -> 90 / 90 / 80 / 90."""
    n = arch_digits(arch)
    if n is None:
        raise OpcError(f"not a CUDA architecture: {arch!r}", expected="sm_80, sm_90, ...")
    return n


# ------------------------------------------------------------------ which compiler

@cache
def nvcc_path() -> str:
    path = shutil.which("nvcc") or next((str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.exists()), "")
    if not path:
        raise OpcError("nvcc not found: put the CUDA toolkit's nvcc on PATH, or pip install 'opcompiler[cuda]' "
                       "to compile with NVRTC")
    return path


def _has_nvcc() -> bool:
    try:
        nvcc_path()
        return True
    except OpcError:
        return False


@cache
def nvrtc_include_dirs() -> tuple[str, ...]:
    """The CUDA headers NVRTC needs (cuda_fp16.h, mma.h, cuda/std/...): the toolkit's (CUDA_HOME or
    nvcc's), else those pip's CUDA wheels installed. Empty when none are found."""
    roots: list[Path] = cuda_homes()
    if nv := shutil.which("nvcc"):
        roots.append(Path(nv).resolve().parents[1])
    roots.append(Path("/usr/local/cuda"))
    for root in roots:
        cands = [root / "include", *sorted(root.glob("targets/*/include"))]
        dirs = [d for d in cands if d.is_dir()]
        dirs += [d / "cccl" for d in dirs if (d / "cccl").is_dir()]
        if any((d / "cuda_fp16.h").is_file() for d in dirs) and any((d / "mma.h").is_file() for d in dirs):
            return tuple(dict.fromkeys(str(d) for d in dirs))
    try:  # headers from pip wheels (cuda-toolkit[cudart,cccl]), found the way cuda-bindings finds libraries
        from cuda import pathfinder  # type: ignore[import-not-found]
        dirs = [pathfinder.find_nvidia_header_directory(n) for n in ("cudart", "cccl")]
        if all(dirs):
            return tuple(str(d) for d in dirs)
    except Exception:
        pass
    return ()


@cache
def _nvrtc_module() -> Any:
    """`cuda.bindings.nvrtc` when the package imports and its library loads; None otherwise."""
    try:
        from cuda.bindings import nvrtc  # type: ignore[import-not-found]
        err, *_ = nvrtc.nvrtcVersion()
        return nvrtc if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None
    except Exception:
        return None


def nvrtc_available() -> bool:
    return _nvrtc_module() is not None and bool(nvrtc_include_dirs())


def cuda_compiler() -> str:
    """"nvrtc" when cuda-bindings imports (and the CUDA headers are there), else "nvcc"; raises the
    one-line OpcError (exit 2) when neither is available. `OPC_CUDA_COMPILER` forces one."""
    forced = forced_cuda_compiler()
    if forced:
        if forced not in COMPILERS:
            raise OpcError(f"OPC_CUDA_COMPILER={forced!r} is not a CUDA compiler", expected="nvrtc or nvcc")
        if forced == "nvrtc" and not nvrtc_available():
            raise OpcError("OPC_CUDA_COMPILER=nvrtc but NVRTC is not available: pip install 'opcompiler[cuda]' "
                           "(cuda-bindings) and make the CUDA headers findable (CUDA_HOME), or unset it to use nvcc")
        if forced == "nvcc":
            nvcc_path()
        return forced
    if nvrtc_available():
        return "nvrtc"
    if _has_nvcc():
        return "nvcc"
    raise OpcError(NO_COMPILER)


# ------------------------------------------------------------------ compiling

_PTXAS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame")
_FLAGS = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "--use_fast_math"]


def ptxas_facts(log: str) -> dict[str, Any]:
    """Registers per thread, spill bytes and static shared memory from ptxas's `-v` report."""
    regs = [int(x) for x in _PTXAS.findall(log)]
    spills = [(int(a), int(b)) for a, b in _SPILL.findall(log)]
    smem = [int(x) for x in _SMEM.findall(log)]
    stack = [int(x) for x in _STACK.findall(log)]
    return {"registers_per_thread": max(regs) if regs else 0, "spill_bytes": sum(a + b for a, b in spills),
            "static_smem_bytes": max(smem) if smem else 0,
            "stack_frame_bytes": max(stack) if stack else 0}  # local memory per thread (arrays not in registers)


def _sm(arch: str) -> str:
    return f"{arch_number(arch)}"


def compile_nvcc(source: str, arch: str) -> CudaBinary:
    """nvcc -> fatbin with `-gencode arch=compute_XX,code=[sm_XX,compute_XX]` (SASS + PTX)."""
    n = _sm(arch)
    with tempfile.TemporaryDirectory(prefix="opc_nvcc_") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.fatbin"
        src.write_text(source)
        cmd = [nvcc_path(), "--fatbin", "-O3", "-gencode", f"arch=compute_{n},code=[sm_{n},compute_{n}]",
               "-Xptxas", "-v", "-Xfatbin=-compress=false", *_FLAGS, "--expt-relaxed-constexpr", "-o", str(out),
               str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OpcFailure(f"nvcc failed on the generated kernel (sm_{n}): {_errors(proc.stderr)}")
        data = out.read_bytes()
    return CudaBinary(data=data, kind="fatbin", compiler="nvcc", arch=f"sm_{n}",
                      facts={**ptxas_facts(proc.stderr), "cubin_bytes": _elf_bytes(data)})


def compile_nvrtc(source: str, arch: str) -> CudaBinary:
    """NVRTC (cuda-bindings): one program compiled for `sm_XX` gives the cubin and its PTX; nvFatbin
    (or the toolkit's `fatbinary`) puts both in one fatbin. Without either tool: the cubin alone."""
    nvrtc = _nvrtc_module()
    if nvrtc is None:
        raise OpcError(NO_COMPILER)
    n = _sm(arch)
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, None, None)
    if err != ok:
        raise OpcFailure(f"NVRTC could not create a program: {err}")
    try:
        opts = [f"--gpu-architecture=sm_{n}", "-default-device", "--ptxas-options=-v", *_FLAGS,
                *(f"-I{d}" for d in nvrtc_include_dirs())]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.decode(errors="replace").rstrip("\0")
        if err != ok:
            raise OpcFailure(f"NVRTC failed on the generated kernel (sm_{n}): {_errors(log_text)}")
        cubin = _nvrtc_get(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        ptx = _nvrtc_get(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    facts = {**ptxas_facts(log_text), "cubin_bytes": len(cubin)}
    fat = make_fatbin(cubin, ptx, n)
    if fat is None:
        return CudaBinary(data=cubin, kind="cubin", compiler="nvrtc", arch=f"sm_{n}", facts=facts)
    return CudaBinary(data=fat, kind="fatbin", compiler="nvrtc", arch=f"sm_{n}", facts=facts)


def _nvrtc_get(nvrtc: Any, prog: Any, size_fn: Any, get_fn: Any) -> bytes:
    err, size = size_fn(prog)
    buf = bytearray(size)
    (err2,) = get_fn(prog, buf)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or err2 != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise OpcFailure(f"NVRTC returned no output ({err}, {err2})")
    return bytes(buf)


def make_fatbin(cubin: bytes, ptx: bytes, sm: str) -> bytes | None:
    """A fatbin of `cubin` (sm_XX) and `ptx` (compute_XX): nvFatbin from cuda-bindings, else the
    toolkit's `fatbinary`; None when neither is there."""
    try:
        from cuda.bindings import nvfatbin  # type: ignore[import-not-found]
        h = nvfatbin.create(["-compress=false"], 1)
        try:
            nvfatbin.add_cubin(h, cubin, len(cubin), sm, "opc_kernel")
            nvfatbin.add_ptx(h, ptx, len(ptx), sm, "opc_kernel", "")
            out = bytearray(nvfatbin.size(h))
            nvfatbin.get(h, out)
            return bytes(out)
        finally:
            nvfatbin.destroy(h)
    except Exception:
        pass
    tool = shutil.which("fatbinary")
    if not tool:
        return None
    with tempfile.TemporaryDirectory(prefix="opc_fatbin_") as tmp:
        c, p, f = Path(tmp) / "k.cubin", Path(tmp) / "k.ptx", Path(tmp) / "k.fatbin"
        c.write_bytes(cubin)
        p.write_bytes(ptx.rstrip(b"\0"))
        proc = subprocess.run([tool, "--64", "--compress=false", f"--create={f}", f"--image3=kind=elf,sm={sm},file={c}",
                               f"--image3=kind=ptx,sm={sm},file={p}"], capture_output=True, text=True)
        return f.read_bytes() if proc.returncode == 0 and f.exists() else None


def _errors(log: str) -> str:
    lines = log.splitlines()
    errs = [" ".join(lines[i:i + 2]) for i, ln in enumerate(lines) if "error" in ln and "detected" not in ln]
    return (" | ".join(errs) or log.strip())[:1500]


_CACHE: OrderedDict[tuple[str, str, str], CudaBinary] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def compile_cuda(source: str, arch: str, compiler: str | None = None) -> CudaBinary:
    """Compile `source` for `arch` (fatbin: SASS + PTX) with `compiler` (default: `cuda_compiler()`);
    cached by content, so the build and TVM's compile hook share one compilation."""
    compiler = compiler or cuda_compiler()
    key = (hashlib.sha1(source.encode()).hexdigest(), f"sm_{_sm(arch)}", compiler)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    out = compile_nvrtc(source, arch) if compiler == "nvrtc" else compile_nvcc(source, arch)
    with _CACHE_LOCK:
        _CACHE[key] = out
        while len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return out


# ------------------------------------------------------------------ reading a fatbin

FATBIN_MAGIC = 0xBA55ED50
_KINDS = {1: "ptx", 2: "elf"}


def fatbin_entries(data: bytes) -> list[dict[str, Any]]:
    """The images in a CUDA fatbin: [{"kind": "elf"|"ptx", "arch": 80, "bytes": N, "offset": where the
    image starts, "compressed": bool, PTX only: "ptx_isa": "9.0"}, ...], what `cuobjdump --list-elf
    --list-ptx` lists. The container: a 16-byte header (magic 0xBA55ED50,
    version, header size, payload size), then per image a header (kind u16: 1 PTX, 2 ELF; header
    size u32 at +4; padded payload size u64 at +8; for PTX the ISA version (minor, major u16) at +24;
    SM u32 at +28; flags u64 at +40, 0x2000 (LZ4) or 0x8000 (zstd) = compressed) and its payload. Raises ValueError
    on anything else."""
    if len(data) < 16:
        raise ValueError("not a fatbin: shorter than its header")
    magic, _version, hsize, total = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        raise ValueError(f"not a fatbin: magic {magic:#x}")
    out, off, end = [], hsize, min(len(data), hsize + total)
    while off + 32 <= end:
        kind, _v, ehsize, size = struct.unpack_from("<HHIQ", data, off)
        if ehsize < 32 or off + ehsize + size > len(data):
            raise ValueError(f"fatbin image at byte {off} is truncated")
        sm = struct.unpack_from("<I", data, off + 28)[0]
        flags = struct.unpack_from("<Q", data, off + 40)[0] if ehsize >= 48 else 0
        entry = {"kind": _KINDS.get(kind, f"kind{kind}"), "arch": sm, "bytes": size, "offset": off + ehsize,
                 "compressed": bool(flags & 0xA000)}
        if kind == 1:  # PTX: the ISA version the driver must know to JIT it
            minor, major = struct.unpack_from("<HH", data, off + 24)
            entry["ptx_isa"] = f"{major}.{minor}"
        out.append(entry)
        off += ehsize + size
    return out


def embedded_ptx(fatbin: bytes) -> str:
    """The PTX text a fatbin carries (its first uncompressed PTX image), "" when it has none."""
    for e in fatbin_entries(fatbin):
        if e["kind"] == "ptx" and not e["compressed"]:
            return fatbin[e["offset"]:e["offset"] + e["bytes"]].split(b"\0", 1)[0].decode(errors="replace")
    return ""


def _elf_bytes(fatbin: bytes) -> int:
    try:
        return sum(e["bytes"] for e in fatbin_entries(fatbin) if e["kind"] == "elf")
    except ValueError:
        return len(fatbin)


def elf_arch(cubin: bytes) -> int:
    """The SM a cubin was compiled for, from its ELF header's e_flags: bits 8-15 in the newer CUDA ELF
    ABI (EI_ABIVERSION >= 8, CUDA 12.8 on), bits 0-7 before."""
    if cubin[:4] != b"\x7fELF":
        raise ValueError("not an ELF cubin")
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF
