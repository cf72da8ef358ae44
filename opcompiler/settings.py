"""Settings in one place: environment variables read lazily, with typed defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Settings:
    num_threads: int
    log_dir: Path
    seed: int


@cache
def settings() -> Settings:
    return Settings(
        num_threads=int(os.environ.get("OPC_NUM_THREADS", os.cpu_count() or 1)),
        log_dir=Path(os.environ.get("OPC_LOG_DIR", "tuning_logs")),
        seed=int(os.environ.get("OPC_SEED", "0")),
    )


def init_tvm_threads() -> None:
    """TVM's pool uses half the CPUs unless TVM_NUM_THREADS is set; set it before the runtime starts."""
    os.environ.setdefault("TVM_NUM_THREADS", str(settings().num_threads))
