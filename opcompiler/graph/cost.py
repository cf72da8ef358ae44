"""Kernels built once, and what each costs: the shared cache behind plans, runs and fusion choices.

A graph's plans (fuse nothing, fuse every pattern, cost-chosen) and a whole-model tuning run ask
for the same kernels over and over. `built()` builds each distinct (target, workload, config)
once per process; `cost()` measures it once: simulated cycles on the simulators (deterministic),
the median of repeated runs on real devices. `config` is "best" (the best verified tuning
record, the template default when none: `api.resolve_config`) or "default".
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import choose
from ..backend import Backend, Kernel, capabilities, get_backend
from ..ops import workload
from ..target import Target
from ..workload import Workload

_LOCK = threading.Lock()
_KERNELS: dict[tuple, Kernel] = {}  # (target, workload, config) -> the kernel, built once
_COSTS: dict[tuple, float] = {}
_BACKENDS: dict[tuple[str, str], Backend] = {}
MAX_CACHED = 4096  # kernels kept per process (a DenseNet-121 has a few hundred distinct ones)


@dataclass(frozen=True)
class Built:
    kernel: Kernel
    config_source: str  # "tuning record", "inherited from conv2d's record" or "template default"


def backend_for(target: Target) -> Backend:
    key = (target.name, target.digest)
    if key not in _BACKENDS:
        _BACKENDS[key] = get_backend(target)
    return _BACKENDS[key]


def _key(target: Target, wl: Workload, cfg: Mapping[str, Any] | None) -> tuple:
    return (target.name, target.digest, wl.key_str(), json.dumps(cfg, sort_keys=True, default=str))


def built(target: Target, wl: Workload, config: str = "best", backend: Backend | None = None) -> Built:
    """The kernel of `wl` on `target` with its best record (or default), built once per process.
    Raises what `backend.build` raises (an `OpcError` when the target cannot build it)."""
    cfg, source = _resolve(wl, target, config)
    key = _key(target, wl, cfg)
    with _LOCK:
        kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = (backend or backend_for(target)).build(wl, cfg)
        with _LOCK:
            if len(_KERNELS) >= MAX_CACHED:
                _KERNELS.pop(next(iter(_KERNELS)))
            _KERNELS[key] = kernel
    return Built(kernel, source)


def _resolve(wl: Workload, target: Target, config: str | None) -> tuple[Any, str]:
    """(knobs or None for the template default, where they came from: "tuning record", "inherited
    from conv2d's record" for a fused op with no record of its own, or "template default")."""
    if config in (None, "default"):
        return None, "template default"
    c = choose(wl, target, config)
    if c.inherited_from:
        return c.spec, f"inherited from {c.inherited_from}'s record"
    return c.spec, "tuning record" if c.spec is not None else "template default"


def prebuild(target: Target, wls: list[Workload], config: str = "best", workers: int | None = None) -> int:
    """Build every kernel of `wls` not built yet, `workers` at a time. On the CPU each build is
    mostly LLVM, which runs outside Python's lock, so threads build in parallel (2x on 2 cores);
    the simulators' builds are Python and are left to `built` on demand. Returns how many were
    built here; a kernel that fails to build is left for `built` to report."""
    if not capabilities(target).threaded_build:
        return 0
    todo: dict[tuple, tuple[Workload, Any]] = {}
    for wl in wls:
        cfg, _ = _resolve(wl, target, config)
        key = _key(target, wl, cfg)
        if key not in _KERNELS and key not in todo:
            todo[key] = (wl, cfg)
    workers = workers or min(os.cpu_count() or 1, 8)
    if workers < 2 or len(todo) < 2:
        return 0
    from concurrent.futures import ThreadPoolExecutor
    backend = backend_for(target)

    def one(item: tuple[tuple, tuple[Workload, Any]]) -> bool:
        key, (wl, cfg) = item
        try:
            kernel = backend.build(wl, cfg)
        except Exception:  # `built` raises the real error, in order, when the plan asks for it
            return False
        with _LOCK:
            _KERNELS[key] = kernel
        return True

    with ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix="opc-build") as pool:
        return sum(pool.map(one, todo.items()))


def cost(target: Target, op: str, params: Mapping[str, Any], dtype: str, config: str = "best") -> float:
    """Seconds one kernel takes on `target` (simulated or measured), measured once per process."""
    wl = workload(op, dict(params), dtype=dtype)
    return seconds_of(built(target, wl, config).kernel, backend_for(target))


def seconds_of(kernel: Kernel, backend: Backend, measured: float | None = None) -> float:
    """The time of one built kernel, once per process: every plan that runs it (fused, unfused,
    cost-chosen) reports the same figure, so their totals differ by what differs between the
    plans and not by timing noise. `measured` records a time taken elsewhere (the first run)."""
    key = _key(backend.target, kernel.workload, dict(kernel.config)) + ("cost",)
    with _LOCK:
        hit = _COSTS.get(key)
    if hit is not None:
        return hit
    secs = measured if measured is not None else float(backend.measure(kernel).seconds)  # a median of repeats
    with _LOCK:
        _COSTS[key] = secs
    return secs


def clear() -> None:
    """Forget every built kernel and measured cost (tests; after tuning changed the records)."""
    with _LOCK:
        _KERNELS.clear()
        _COSTS.clear()


__all__ = ["Built", "built", "prebuild", "cost", "seconds_of", "clear", "backend_for"]
