"""Measuring candidates in worker processes, with a timeout, through the `Backend` interface.

A worker builds the kernel (`backend.build`: an `OpcError` such as `CapacityError` means the
config is invalid), times it (`backend.measure`: timing mode on simulators, repeated runs on
devices) and, when asked, runs it functionally and compares it with the op's numpy reference
(`verify.compare`). A worker that crashes or hangs is killed and replaced; its candidate is
recorded as `crash` / `timeout` and tuning goes on.

Workers come from a forkserver (TVM's thread pool does not survive a plain `fork` of a process
that ran kernels) and keep their backend between tasks. `workers=0` measures in this process (no isolation; for debugging).

A cuda target measured on this machine's GPU goes another way (`gpu_runner.py`): `workers` build
processes that never initialise CUDA feed one runner process per GPU, started with `spawn`.
A simulator target with an RPC spec goes to the servers a TVM tracker has under the key
(`remote.py`): candidates travel as data, as many in flight as there are free servers.
"""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Mapping, Sequence

from ..backend import Backend, capabilities
from ..errors import OpcError
from ..settings import mark_worker, worker_threads
from ..workload import Workload
from .process import _KEEP_METRICS, BackendSpec, Child, MeasureResult, _clean_sys_path, _context, _one_line, tasks


def measure_one(backend: Backend, wl: Workload, config: Mapping[str, Any], verify: bool = False,
                seed: int = 0) -> MeasureResult:
    """Build, time and (if `verify`) check one config in this process. Never raises for a bad config."""
    t0 = time.perf_counter()
    try:
        kernel = backend.build(wl, dict(config))
    except OpcError as e:
        return MeasureResult(status="invalid", error=_one_line(e), elapsed=time.perf_counter() - t0)
    except Exception as e:  # a build that blows up is a bad candidate, not the end of tuning
        return MeasureResult(status="crash", error=f"build: {type(e).__name__}: {_one_line(e)}",
                             elapsed=time.perf_counter() - t0)
    try:
        res = backend.measure(kernel)
    except OpcError as e:
        return MeasureResult(status="invalid", error=_one_line(e), elapsed=time.perf_counter() - t0)
    except Exception as e:
        return MeasureResult(status="crash", error=f"measure: {type(e).__name__}: {_one_line(e)}",
                             elapsed=time.perf_counter() - t0)
    metrics = {k: res.metrics[k] for k in _KEEP_METRICS if k in res.metrics}
    cycles = int(res.cycles) if res.cycles is not None else None
    seconds = float(res.seconds) if res.seconds is not None else None
    if (cycles is None and not seconds) or (cycles is not None and cycles <= 0):
        return MeasureResult(status="crash", error="backend reported no time", elapsed=time.perf_counter() - t0)
    verified = False
    if verify:
        ok, err, why = check_result(backend, kernel, wl, seed)
        metrics["max_abs_err"] = err
        if not ok:
            return MeasureResult(status="wrong", cycles=cycles, seconds=seconds, metrics=metrics, error=why,
                                 elapsed=time.perf_counter() - t0)
        verified = True
    return MeasureResult(status="ok", cycles=cycles, seconds=seconds, metrics=metrics, verified=verified,
                         elapsed=time.perf_counter() - t0)


def check_result(backend: Backend, kernel: Any, wl: Workload, seed: int = 0) -> tuple[bool, float, str]:
    """Run functionally and compare with the reference: (ok, max abs error, why not)."""
    from ..ops import get_op
    from ..verify import compare
    d = get_op(wl.op)
    inputs = d.make_inputs(wl, seed)
    try:
        res = backend.run(kernel, inputs)
    except Exception as e:
        return False, float("inf"), f"run: {type(e).__name__}: {_one_line(e)}"
    if not res.outputs:
        return False, float("inf"), "run returned no outputs"
    ok, err = compare(res.outputs[0], d.reference(wl, inputs))
    return ok, err, "" if ok else f"wrong result: max abs error {err:.3g} beyond tolerance"


def _worker_main(conn: Connection, spec: BackendSpec) -> None:
    """Worker loop: receive (wl, config, verify, seed), send back a MeasureResult."""
    _clean_sys_path()
    mark_worker()
    if spec.threads:  # share the cores among workers instead of oversubscribing them
        worker_threads(spec.threads)
    try:
        backend = spec.make()
    except BaseException as e:  # tell the parent once, then every task fails the same way
        backend, err = None, f"cannot create the backend: {type(e).__name__}: {_one_line(e)}"
    for task in tasks(conn):
        wl, config, verify, seed = task
        if backend is None:
            conn.send(MeasureResult(status="crash", error=err))
            continue
        try:
            res = measure_one(backend, wl, config, verify, seed)
        except BaseException as e:
            res = MeasureResult(status="crash", error=f"{type(e).__name__}: {_one_line(e)}\n"
                                                      f"{traceback.format_exc(limit=3)}"[:500])
        conn.send(res)


class _Worker(Child):
    def __init__(self, ctx: Any, spec: BackendSpec):
        super().__init__(ctx, _worker_main, spec)


class Measurer:
    """Measures batches of configs on `workers` processes, `timeout` seconds per candidate.

    The first task of a fresh worker also pays for its start-up (imports, backend creation),
    so its deadline is `timeout + startup_timeout`."""

    def __init__(self, spec: BackendSpec, workers: int = 1, timeout: float = 60.0, startup_timeout: float = 120.0,
                 context: Any = None):
        if workers < 0:
            raise OpcError("must be >= 0", arg="--workers", value=workers, expected="0 (in process), 1, 2, ...")
        if workers > 1 and not spec.threads:
            spec = replace(spec, threads=max(1, (os.cpu_count() or 1) // workers))
        self.spec, self.n, self.timeout, self.startup_timeout = spec, workers, timeout, startup_timeout
        self._delegate: Any = None  # a GpuMeasurer or a RemoteMeasurer measures instead
        if spec.rpc and capabilities(spec.target).simulator:
            # a simulator target on the servers a tracker has under the key (remote.py)
            from .remote import RemoteMeasurer
            self._delegate = RemoteMeasurer(spec.target, spec.rpc, timeout=timeout, startup_timeout=startup_timeout)
            return
        if self.uses_gpu_runner(spec, workers):
            # a local GPU: parallel build processes feeding one spawned runner process (gpu_runner.py)
            from .gpu_runner import GpuMeasurer
            self._delegate = GpuMeasurer(spec, workers=workers, timeout=timeout,
                                         startup_timeout=max(startup_timeout, 180.0))
            return
        self._ctx = context or _context()  # a server's session forks its worker from itself (remote.py)
        self._workers: list[_Worker] = []
        self._fresh: set[int] = set()
        self._local: Backend | None = None
        self._t_measuring, self._n_measured = 0.0, 0

    @staticmethod
    def uses_gpu_runner(spec: BackendSpec, workers: int) -> bool:
        """A cuda target measured on this machine's GPU, in worker processes (not in-process, not over
        RPC, not a test factory): build processes feeding one spawned runner (`gpu_runner.py`)."""
        return workers > 0 and capabilities(spec.target).device_runner and not spec.rpc and not spec.factory

    @property
    def parallelism(self) -> int:
        """Candidates measured at once: the workers, or the servers' sessions under an RPC key."""
        if self._delegate is not None and hasattr(self._delegate, "parallelism"):
            return self._delegate.parallelism
        return max(1, self.n)

    @property
    def stats(self) -> dict[str, Any]:
        """Candidates measured, wall seconds spent measuring them, candidates per second (and on a GPU
        the builders, runner restarts, build and run seconds)."""
        if self._delegate is not None:
            return dict(self._delegate.stats)
        rate = self._n_measured / self._t_measuring if self._t_measuring > 0 else 0.0
        return {"candidates": self._n_measured, "seconds": self._t_measuring, "candidates_per_second": rate}

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._delegate is not None:
            self._delegate.close()
            return
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in self._workers:
            w.proc.join(timeout=2)
            w.kill()
        self._workers = []

    def _spawn(self) -> _Worker:
        w = _Worker(self._ctx, self.spec)
        self._fresh.add(id(w))
        return w

    def measure(self, wl: Workload, configs: Sequence[Mapping[str, Any]], verify: bool = False, seed: int = 0,
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure every config; results in input order. `on_result(i, res)` fires as each finishes."""
        if self._delegate is not None:
            return self._delegate.measure(wl, configs, verify=verify, seed=seed, on_result=on_result)
        t0 = time.perf_counter()
        try:
            return self._measure(wl, configs, verify, seed, on_result)
        finally:
            self._t_measuring += time.perf_counter() - t0
            self._n_measured += len(configs)

    def _measure(self, wl: Workload, configs: Sequence[Mapping[str, Any]], verify: bool, seed: int,
                 on_result: Callable[[int, MeasureResult], None] | None) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [None] * len(configs)
        if self.n == 0:
            if self._local is None:
                self._local = self.spec.make()
            for i, c in enumerate(configs):
                results[i] = measure_one(self._local, wl, c, verify, seed)
                if on_result:
                    on_result(i, results[i])
            return results  # type: ignore[return-value]
        while len(self._workers) < self.n:
            self._workers.append(self._spawn())
        pending = list(range(len(configs)))[::-1]
        busy: list[_Worker] = []
        while pending or busy:
            for w in self._workers:
                if w.task is None and pending:
                    i = pending.pop()
                    fresh = id(w) in self._fresh
                    w.deadline = time.monotonic() + self.timeout + (self.startup_timeout if fresh else 0.0)
                    try:
                        w.conn.send((wl, dict(configs[i]), verify, seed))
                        w.task = i
                        busy.append(w)
                    except (OSError, BrokenPipeError):
                        pending.append(i)
                        self._replace(w)
                        break
            if not busy:
                continue
            wait_for = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=wait_for)
            for w in list(busy):
                i = w.task
                res: MeasureResult | None = None
                if w.conn in ready:
                    try:
                        res = w.conn.recv()
                        self._fresh.discard(id(w))
                    except (EOFError, OSError):
                        res = MeasureResult(status="crash", error=f"worker died (exit code {w.proc.exitcode})")
                elif w.proc.sentinel in ready:
                    w.proc.join(timeout=1)
                    res = MeasureResult(status="crash", error=f"worker died (exit code {w.proc.exitcode})")
                elif time.monotonic() >= w.deadline:
                    res = MeasureResult(status="timeout", error=f"no result within the {self.timeout:g} s timeout")
                if res is None:
                    continue
                busy.remove(w)
                w.task = None
                results[i] = res
                if res.status in ("crash", "timeout"):
                    self._replace(w)
                if on_result:
                    on_result(i, res)
        return results  # type: ignore[return-value]

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._fresh.discard(id(w))
        self._workers[self._workers.index(w)] = self._spawn()
