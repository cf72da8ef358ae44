"""Settings in one place: environment variables read lazily, with typed defaults.

Every environment variable the package reads, and the ones it sets for the processes it starts,
goes through here (the export folders' runtime, `opcompiler/export/runtime.py` and
`torch_binding.py`, is copied into each folder and runs without the package: it sets TVM's own
variables itself):

    OPC_LOG_DIR, XDG_DATA_HOME   the user's tuning records (`user_log_dir`)
    OPC_NUM_THREADS, OPC_SEED    `settings()`
    OPC_DEBUG                    the CLI shows an internal error's traceback (`debug`)
    OPCOMPILER_KEEP_HEAP         0: leave glibc's malloc settings alone (`keep_heap`)
    OPC_CUDA_COMPILER            force nvrtc or nvcc (`forced_cuda_compiler`)
    CUDA_HOME, CUDA_PATH         where the CUDA toolkit is (`cuda_homes`)
    CUDA_VISIBLE_DEVICES         the GPUs a process may see (`visible_devices`)
    TVM_NUM_THREADS, OMP_NUM_THREADS, OPC_IN_WORKER, PYTHONSAFEPATH
                                 set for TVM's pool and the measuring workers (`init_tvm_threads`,
                                 `worker_threads`, `mark_worker`, `environ`)
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Iterator

__version__ = "0.1.0"  # the package's version (pyproject.toml says the same); `opcompiler.__version__` re-exports it

# Set by the package (`opcompiler/__init__.py`, which stands above every layer): what loads the shipped
# templates when a lookup finds the registry empty. The core calls it and imports no template.
template_loader = None


@dataclass(frozen=True, kw_only=True)
class Settings:
    num_threads: int
    log_dir: Path  # the user's tuning records (see `user_log_dir`)
    log_dir_from: str  # "OPC_LOG_DIR" or "default": what chose `log_dir`
    seed: int


def user_log_dir() -> tuple[Path, str]:
    """Where `opcompiler tune` writes records: `$OPC_LOG_DIR`, else
    `$XDG_DATA_HOME/opcompiler/tuning_logs` (default `~/.local/share/opcompiler/tuning_logs`).
    Never the current directory, never the package: tuning must not edit tracked or shipped files."""
    env = os.environ.get("OPC_LOG_DIR")
    if env:
        return Path(env).expanduser().absolute(), "OPC_LOG_DIR"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser().absolute() / "opcompiler" / "tuning_logs", "default"


@cache
def settings() -> Settings:
    return Settings(
        num_threads=int(os.environ.get("OPC_NUM_THREADS", os.cpu_count() or 1)),
        log_dir=user_log_dir()[0],
        log_dir_from=user_log_dir()[1],
        seed=int(os.environ.get("OPC_SEED", "0")),
    )


def init_tvm_threads() -> None:
    """TVM's pool uses half the CPUs unless TVM_NUM_THREADS is set; set it before the runtime starts."""
    os.environ.setdefault("TVM_NUM_THREADS", str(settings().num_threads))


def debug() -> bool:
    """OPC_DEBUG set: the CLI raises an internal error's traceback instead of one line."""
    return bool(os.environ.get("OPC_DEBUG"))


def keep_heap() -> bool:
    """Whether glibc may keep freed heap memory for TVM's schedule primitives (OPCOMPILER_KEEP_HEAP=0: no)."""
    return os.environ.get("OPCOMPILER_KEEP_HEAP", "1") != "0"


def forced_cuda_compiler() -> str:
    """OPC_CUDA_COMPILER, lower-cased ("" when unset): the CUDA compiler a user forces."""
    return os.environ.get("OPC_CUDA_COMPILER", "").strip().lower()


def cuda_homes() -> list[Path]:
    """The CUDA toolkit roots the environment names (CUDA_HOME, then CUDA_PATH)."""
    return [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]


def visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as this process has it (None when unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def mark_worker() -> None:
    """Mark this process as a measuring worker (OPC_IN_WORKER=1) unless it already says."""
    os.environ.setdefault("OPC_IN_WORKER", "1")


def worker_threads(n: int) -> None:
    """TVM's and OpenMP's threads in this worker: `n` (workers share the cores instead of each taking all)."""
    os.environ["TVM_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(n)


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration (a process started inside inherits them), then
    put back what was there. Not thread-safe: callers that start processes from threads lock."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
