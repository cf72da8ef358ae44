"""The tuning side of the record store: checking that a log can be written before tuning starts.

The store itself (records, logs, `find_best`, where records live) is `opcompiler.records`, in the
core below `opcompiler.config`; its names stay importable from here for tuning's callers.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import OpcError
from ..records import (STATUSES, ConfigState, Found, Record, RecordLog, best_of, best_record,  # noqa: F401
                       by_key, config_id, default_log_path, find_best, fold, is_shipped, iter_logs, record_key,
                       same_key, search_paths, shipped_dir, summarize, user_dir, verified_bests)


def check_writable(path: str | os.PathLike, allow_shipped: bool = False) -> Path:
    """Make sure records can be appended to `path` before any candidate is measured.

    Refuses the package's shipped records (unless `allow_shipped`: the maintainer command that
    regenerates them), a directory where a file should be, a file where a directory should be,
    and a location this user cannot write. Raises a one-line `OpcError`; creates the directory."""
    p = Path(path).expanduser().absolute()
    fix = "--log FILE or OPC_LOG_DIR=DIR naming a writable place"
    if is_shipped(p) and not allow_shipped:
        raise OpcError("is inside the records shipped with opcompiler, which tuning never edits", arg="log",
                       value=str(p), expected=f"{fix}; maintainers regenerate shipped records with "
                       "benchmarks/make_tuning_logs.py")
    if p.is_dir():
        raise OpcError("is a directory, not a log file", arg="log", value=str(p), expected=fix)
    for parent in [p.parent, *p.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise OpcError(f"cannot hold the tuning log: {parent} is a file, not a directory", arg="log",
                               value=str(p), expected=fix)
            break
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OpcError(f"cannot create its directory ({e.strerror})", arg="log", value=str(p),
                       expected=fix) from None
    target = p if p.exists() else p.parent
    if not os.access(target, os.W_OK):
        raise OpcError(f"{'the file' if p.exists() else 'its directory'} is not writable", arg="log",
                       value=str(p), expected=fix)
    return p


def now() -> float:
    return time.time()
