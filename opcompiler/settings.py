"""Settings in one place: environment variables read lazily, with typed defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

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
