"""Load and call an exported kernel folder with numpy arrays (the `lib` binding).

This module is copied verbatim into every export folder as `opc_runtime.py`, so a folder
exported for the CPU runs with only numpy and the TVM runtime installed; opcompiler itself
is needed only for simulator-target folders, which rebuild the saved program through the
simulator backend. Keep it free of opcompiler imports at module level.

    >>> k = load("out/conv")          # reads out/conv/manifest.json
    >>> y = k(x, w, scale, shift)     # numpy in, numpy out; shapes and dtypes checked
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

try:  # inside opcompiler the error is an OpcError (CLI exit 2); standalone a plain ValueError
    from opcompiler.errors import OpcError as _Base
except ImportError:  # pragma: no cover - the folder used without opcompiler installed
    _Base = ValueError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
ALIGN = 64  # TVM's DLPack import refuses data not aligned to 64 bytes


class KernelInputError(_Base):
    """A call with a shape, dtype or layout the kernel was not built for: names expected and got."""


if __name__ != "opcompiler.export.runtime":  # a folder's copy: raise opcompiler's class when installed
    try:
        from opcompiler.export.runtime import KernelInputError
    except ImportError:
        pass


def check_arg(name: str, spec: dict[str, Any], shape: Sequence[int], dtype: str, kernel: str) -> None:
    """Raise KernelInputError unless `shape` and `dtype` are exactly what `spec` says."""
    want_shape, want_dt = tuple(spec["shape"]), spec["dtype"]
    if tuple(int(s) for s in shape) != want_shape or dtype != want_dt:
        raise KernelInputError(
            f"{kernel}: input {name!r} ({spec['layout']}): expected {want_dt}{list(want_shape)}, "
            f"got {dtype}{[int(s) for s in shape]}; this kernel was built for one shape and dtype "
            f"and never reshapes or casts (export again with the shape you need)")


def check_count(n: int, specs: Sequence[dict[str, Any]], kernel: str) -> None:
    if n != len(specs):
        names = ", ".join(s["name"] for s in specs)
        raise KernelInputError(f"{kernel}: expected {len(specs)} inputs ({names}), got {n}")


def check_layout(given: str | None, manifest: dict[str, Any]) -> None:
    """A caller that states its layout must state the one the kernel was built for."""
    want = manifest["layout"]
    if given is not None and want and given != want:
        raise KernelInputError(f"{manifest['name']}: layout: expected {want}, got {given} "
                               f"(the kernel was built for {want}; nothing transposes silently)")


def layout_error(name: str, spec: dict[str, Any], kernel: str, got: str) -> KernelInputError:
    return KernelInputError(f"{kernel}: input {name!r}: expected a dense row-major {spec['layout']} "
                            f"{spec['dtype']}{list(spec['shape'])} tensor, got {got}; nothing is "
                            f"transposed or copied silently (make it contiguous in {spec['layout']} first)")


def aligned_empty(shape: Sequence[int], dtype: str) -> np.ndarray:
    """A C-contiguous numpy array whose data is 64-byte aligned (zero-copy into TVM)."""
    dt = np.dtype(dtype)
    n = math.prod(shape)
    raw = np.empty(n * dt.itemsize + ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + n * dt.itemsize].view(dt).reshape(tuple(shape))


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise _Base(f"{folder}: no {MANIFEST} here; pass a folder written by `opcompiler export`")
    m = json.loads(path.read_text())
    if m.get("format_version") != FORMAT_VERSION:
        raise _Base(f"{path}: format_version {m.get('format_version')!r} is not {FORMAT_VERSION}; "
                    f"export again with this opcompiler")
    return m


class ExportedKernel:
    """A loaded export folder: call it on numpy arrays (inputs in manifest order), get the output."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder).resolve()
        self.manifest = read_manifest(self.folder)
        self.name: str = self.manifest["name"]
        self.inputs: list[dict[str, Any]] = self.manifest["inputs"]
        self.output: dict[str, Any] = self.manifest["output"]
        if self.manifest.get("verification", {}).get("correct") is False:
            v = self.manifest["verification"]
            raise _Base(f"{self.folder}: this kernel failed verification at export (max abs error "
                        f"{v.get('max_abs_err')}); it is kept for inspection only")
        kind = self.manifest["artifact"]["kind"]
        if kind == "tvm-library":
            self._fn = _load_library(self.folder, self.manifest)
            self._sim = None
        elif kind == "simulator-program":
            self._fn = None
            self._sim = _SimulatorProgram(self.folder, self.manifest)
        else:
            raise _Base(f"{self.folder}: unknown artifact kind {kind!r}")
        dev_kind = device_kind(self.manifest)
        self._dev = _tvm().device(dev_kind, 0) if kind == "tvm-library" and dev_kind != "cpu" else None
        self.last_run: dict[str, Any] = {}  # simulator runs: seconds, cycles, metrics of the last call
        self._want = [(tuple(s["shape"]), np.dtype(s["dtype"])) for s in self.inputs]  # fast path of check()

    def check(self, arrays: Sequence[Any], layout: str | None = None) -> None:
        """Raise KernelInputError unless `arrays` match the manifest (count, shape, dtype, layout)."""
        check_layout(layout, self.manifest)
        check_count(len(arrays), self.inputs, self.name)
        for spec, a in zip(self.inputs, arrays):
            check_arg(spec["name"], spec, np.shape(a), str(np.asarray(a).dtype), self.name)

    def __call__(self, *arrays: np.ndarray, layout: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Run the kernel. `layout`, when given, must be the one the kernel was built for."""
        if layout is not None or len(arrays) != len(self._want) or not all(
                isinstance(a, np.ndarray) and a.shape == shp and a.dtype == dt for a, (shp, dt) in zip(arrays, self._want)):
            self.check(arrays, layout)  # the slow path names what is wrong
        for spec, a in zip(self.inputs, arrays):
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                raise layout_error(spec["name"], spec, self.name, f"a strided view (strides {a.strides})")
        if self._sim is not None:
            res = self._sim.run([np.asarray(a) for a in arrays])
            self.last_run = res
            return res["output"]
        if self._dev is not None:  # a device kernel (cuda): copy in, run, copy back
            return self._run_on_device(arrays, out)
        if out is None:
            out = aligned_empty(self.output["shape"], self.output["dtype"])
        else:
            check_arg("out", self.output, out.shape, str(out.dtype), self.name)
        self._fn(*[_tvm_view(np.asarray(a)) for a in arrays], _tvm_view(out, writable=True))
        return out


    def _run_on_device(self, arrays: Sequence[np.ndarray], out: np.ndarray | None) -> np.ndarray:
        tvm = _tvm()
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), self._dev) for a in arrays]
        dout = tvm.runtime.tensor(np.zeros(self.output["shape"], self.output["dtype"]), self._dev)
        self._fn(*args, dout)
        res = dout.numpy()
        if out is not None:
            out[...] = res
            return out
        return res


def load(folder: str | os.PathLike) -> ExportedKernel:
    """Load an export folder; the result is a callable on numpy arrays."""
    return ExportedKernel(folder)


def device_kind(m: dict[str, Any]) -> str:
    """The TVM device a library kernel runs on, as the exporting backend declared it
    (`Capabilities.rpc_device`, written as `target.device`); a folder written before the manifest
    said so names its family, which was the device's name."""
    return str(m["target"].get("device") or m["target"]["family"])


@cache
def _tvm():
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))  # TVM uses half the cores otherwise
    import tvm
    return tvm


def _load_library(folder: Path, m: dict[str, Any]):
    tvm = _tvm()
    art = m["artifact"]
    kind = device_kind(m)
    if kind != "cpu":
        if not tvm.device(kind, 0).exist:
            raise _Base(f"{folder}: the kernel is for a {m['target']['family']} device and none is present here")
    mod = tvm.runtime.load_module(str(folder / art["file"]))
    return mod[art["entry"]]


def _tvm_view(a: np.ndarray, writable: bool = False):
    """A zero-copy TVM tensor over `a` when it is aligned; else one copy into an aligned buffer."""
    tvm = _tvm()
    if a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous and (a.flags.writeable or not writable):
        try:
            return tvm.runtime.from_dlpack(a)
        except (RuntimeError, BufferError, TypeError):  # e.g. a read-only array numpy will not export
            pass
    if writable:
        raise _Base("output buffer must be a writable, 64-byte aligned, C-contiguous array "
                    "(use opc_runtime.aligned_empty)")
    b = aligned_empty(a.shape, str(a.dtype))
    b[...] = a
    return tvm.runtime.from_dlpack(b)


class _SimulatorProgram:
    """A simulator-target export: the saved workload, config and target file, rebuilt through
    the simulator backend at load time and run functionally (values and simulated time)."""

    def __init__(self, folder: Path, m: dict[str, Any]):
        try:
            from opcompiler.backend import get_backend
            from opcompiler.target import parse_target
            from opcompiler.workload import Workload
        except ImportError:
            raise _Base(f"{folder}: a {m['target']['name']} export runs on opcompiler's simulator; "
                        f"install opcompiler to load it") from None
        art = m["artifact"]
        target = parse_target(folder / art["target_file"])
        if target.digest != m["target"]["digest"]:
            raise _Base(f"{folder}: target file digest {target.digest} differs from the manifest's "
                        f"{m['target']['digest']}; the folder was edited")
        wl = Workload.make(m["op"], m["params"], m["dtype"])
        self.backend = get_backend(target)
        self.kernel = self.backend.build(wl, m["config"])

    def run(self, arrays: list[np.ndarray]) -> dict[str, Any]:
        res = self.backend.run(self.kernel, arrays)
        if not res.outputs:
            raise _Base("the simulator returned no output")
        return {"output": res.outputs[0], "seconds": res.seconds, "cycles": res.cycles, "metrics": res.metrics}
