"""What every measuring process shares: how a worker gets its backend (`BackendSpec`), what it
sends back (`MeasureResult`), a `sys.path` without the current directory, and the forkserver
the workers start from. Both the CPU/simulator workers (`measure.py`) and the GPU runner
(`gpu_runner.py`) build on it; it imports neither, so they do not import each other for it.
"""
from __future__ import annotations

import copyreg
import multiprocessing as mp
import sys
import threading
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from types import MappingProxyType
from typing import Any, Sequence

from ..backend import Backend, get_backend
from ..settings import environ
from ..target import Target


def _mappingproxy(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


# Targets hold MappingProxyType fields; let them cross the process boundary as dicts.
copyreg.pickle(MappingProxyType, lambda m: (_mappingproxy, (dict(m),)))


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """How a worker gets its backend: `get_backend(target)`, an RPC spec, or a factory
    `"module:callable"` taking the target (tests register fake backends this way)."""

    target: Target
    factory: str = ""
    rpc: str = ""
    threads: int = 0  # TVM / OpenMP threads per worker (0 = leave the environment alone)

    def make(self) -> Backend:
        if self.factory:
            mod, fn = self.factory.split(":")
            return getattr(import_module(mod), fn)(self.target)
        if self.rpc:
            from ..backend.rpc import rpc_backend
            return rpc_backend(self.target, self.rpc)
        return get_backend(self.target)


@dataclass(frozen=True, kw_only=True)
class MeasureResult:
    """What one candidate did: status as in `records.STATUSES`, cycles and/or seconds, metrics."""

    status: str
    cycles: int | None = None
    seconds: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    verified: bool = False
    error: str = ""
    elapsed: float = 0.0  # wall time of the measurement itself

    @property
    def cost(self) -> float:
        if self.status != "ok":
            return float("inf")
        return float(self.cycles) if self.cycles is not None else float(self.seconds or float("inf"))


_KEEP_METRICS = ("percent_of_peak", "bound", "tflops", "gflops", "pipe_ratios", "bytes_by_level")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def tasks(conn: Any):
    """A worker's tasks as its parent sends them, until the parent sends None or hangs up."""
    while True:
        try:
            task = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if task is None:
            return
        yield task


def _clean_sys_path() -> None:
    """Drop the current directory from `sys.path` (multiprocessing copies the parent's, which has
    it under `python -m`), unless that is where this opcompiler itself was imported from."""
    home = Path(__file__).resolve().parents[2]  # the folder this opcompiler package sits in
    cwd = Path.cwd().resolve()

    def is_cwd(p: str) -> bool:
        where = Path(p or ".").resolve()
        return where == cwd and where != home

    sys.path[:] = [p for p in sys.path if not is_cwd(p)]


def _context(extra_preload: Sequence[str] = ()) -> Any:
    """A forkserver that has imported TVM once: fresh workers (after a crash or a hang) start in
    milliseconds instead of re-importing. The server itself never runs a kernel, so no TVM
    thread pool is forked. `extra_preload`: more modules for the server to import, if this call
    starts it (the GPU builders' CUDA backend)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tvm", "opcompiler.ops.catalogue", "opcompiler.backend", "opcompiler.tune.measure",
                                *extra_preload])
    _start_forkserver_clean()
    return ctx


_ENV_LOCK = threading.Lock()


class Child:
    """The parent's handle on one worker process: `main(conn, spec)` runs in it; `conn` is the
    parent's end of their pipe, `task` / `deadline` what it runs now and until when. `safe_path`:
    a fresh interpreter (spawn), which must not put the current directory first on `sys.path`."""

    def __init__(self, ctx: Any, main: Any, spec: Any, name: str | None = None, safe_path: bool = False):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=main, args=(child, spec), daemon=True, name=name)
        if safe_path:
            with _ENV_LOCK, environ(PYTHONSAFEPATH="1"):
                self.proc.start()
        else:
            self.proc.start()
        child.close()
        self.task: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


def _start_forkserver_clean() -> None:
    """Start the forkserver with a clean `sys.path`. It runs `python -c ...`, which would put the
    current directory first on `sys.path`; from a source checkout that directory's `opcompiler/`
    would then shadow the installed package in every worker. PYTHONSAFEPATH=1 (Python >= 3.11)
    drops it, and the workers forked from the server (and their own subprocesses) inherit that."""
    from multiprocessing import forkserver
    with _ENV_LOCK, environ(PYTHONSAFEPATH="1"):
        forkserver.ensure_running()
