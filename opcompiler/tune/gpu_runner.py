"""GPU measurement the AutoTVM / MetaSchedule way: parallel builders, one runner per GPU.

- **Builders** are `measure.py`'s forkserver workers run in build-only mode: schedule, lower,
  compile (NVRTC or nvcc), and export the kernel library (`export_library`, a `.so`) into a
  scratch folder. They never initialise CUDA: `forbid_cuda()` hides every device from the driver
  (`CUDA_VISIBLE_DEVICES=""`) and turns TVM's `tvm.cuda` into an error, so a build that reached for
  the GPU fails loudly instead of creating a context. The forkserver is a fresh interpreter (not a
  fork of the tuning process), so nothing it forks inherits CUDA state.
- **The runner** is one long-lived process per GPU, started with the multiprocessing `spawn`
  context: a fresh interpreter, never a fork of a process that touched CUDA (CUDA does not survive
  a fork: cudaErrorInitializationError). Its `CudaRunner` (the CUDA backend's,
  `opcompiler/backend/cuda_runner.py`) owns the CUDA context, loads each library, times it with
  `time_evaluator` and, when asked, checks it against the op's numpy reference; `TaskRunner`
  turns that into the tuner's `MeasureResult`.
- **Isolation**: a runner that dies (a kernel that kills the process), runs past the timeout, or
  reports a CUDA error (an illegal address poisons the whole context) is killed and a fresh one
  spawned; its candidate is recorded `crash` or `timeout` (not valid) and tuning goes on.

Builds overlap with runs: while the runner times one kernel, the builders compile the next ones.
`GpuMeasurer.stats` says how many candidates per second came out.

`Measurer(...)` picks this path by itself for a cuda target measured locally (no `--rpc`, no test
factory) with `workers >= 1`; `workers` is then the number of builders.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from importlib import import_module
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Mapping, Sequence

from ..backend.cuda_runner import CudaRunner, cuda_state, export_kernel, is_cuda_error  # noqa: F401
from ..device import forbid_cuda
from ..errors import OpcError
from ..settings import mark_worker
from ..target import Target
from ..workload import Workload
from .process import BackendSpec, Child, MeasureResult, _KEEP_METRICS, _clean_sys_path, _context, _one_line, tasks

# imported once by the forkserver, so each build process starts with them (TVM's CUDA tensor
# intrinsics, through schedules/cuda/intrin.py, still take seconds to register)
BUILDER_PRELOAD = ("opcompiler.backend.cuda", "opcompiler.tune.gpu_runner", "opcompiler.schedules.cuda.intrin")

# ------------------------------------------------------------------ builders

@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """One build: `path` to the exported library (status ok) or why not (invalid / crash)."""

    status: str
    path: str = ""
    entry: str = "main"
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    elapsed: float = 0.0
    pid: int = 0
    cuda_touched: bool = False  # the builder asked TVM's device API for a GPU (must stay False)
    cuda_initialised: bool = False  # torch (imported by TVM's FFI when installed) initialised CUDA (must not)
    cuda_python_modules: tuple[str, ...] = ()  # cuda.bindings modules (NVRTC's; none with nvcc)
    cuda_visible_devices: str | None = None


def build_one(backend: Any, wl: Workload, config: Mapping[str, Any], path: str) -> BuildResult:
    """Build one config and export it to `path`. Never raises for a bad config."""
    t0 = time.perf_counter()
    try:
        kernel = backend.build(wl, dict(config))
        entry = export_kernel(kernel, path)
    except OpcError as e:
        return BuildResult(status="invalid", error=_one_line(e), elapsed=time.perf_counter() - t0)
    except Exception as e:
        return BuildResult(status="crash", error=f"build: {type(e).__name__}: {_one_line(e)}",
                           elapsed=time.perf_counter() - t0)
    return BuildResult(status="ok", path=path, entry=entry, info=dict(kernel.info),
                       elapsed=time.perf_counter() - t0)


def _builder_main(conn: Connection, spec: BackendSpec) -> None:
    """Build-only worker: receive (wl, config, path), send back a BuildResult."""
    _clean_sys_path()
    mark_worker()
    forbid_cuda("a build process: builders never initialise CUDA")
    try:
        backend, err = spec.make(), ""
    except BaseException as e:
        backend, err = None, f"cannot create the backend: {type(e).__name__}: {_one_line(e)}"
    from dataclasses import replace
    for task in tasks(conn):
        wl, config, path = task
        if backend is None:
            res = BuildResult(status="crash", error=err)
        else:
            try:
                res = build_one(backend, wl, config, path)
            except BaseException as e:
                res = BuildResult(status="crash", error=f"{type(e).__name__}: {_one_line(e)}")
        conn.send(replace(res, pid=os.getpid(), **cuda_state()))


# ------------------------------------------------------------------ the runner

@dataclass(frozen=True, kw_only=True)
class RunnerSpec:
    """How the runner process measures: on GPU `device` of `target`, `repeat` timings of at least
    `min_repeat_ms` each (median kept). `factory` ("module:callable" taking the spec) swaps in
    another runner (tests)."""

    target: Target
    device: int = 0
    factory: str = ""
    number: int = 1
    repeat: int = 5
    min_repeat_ms: int = 20

    def make(self) -> Any:
        if self.factory:
            mod, fn = self.factory.split(":")
            return getattr(import_module(mod), fn)(self)
        return TaskRunner(self)


@dataclass(frozen=True, kw_only=True)
class RunTask:
    wl: Workload
    path: str
    entry: str = "main"
    config: dict[str, Any] = field(default_factory=dict)
    verify: bool = False
    seed: int = 0


class TaskRunner:
    """The runner process's loop body: one `RunTask` through the CUDA backend's `CudaRunner` (which
    owns the GPU), its outcome as a `MeasureResult` and whether the context is poisoned."""

    def __init__(self, spec: RunnerSpec, runner: CudaRunner | None = None):
        self.spec = spec
        self.runner = runner or CudaRunner(spec.target, spec.device, spec.number, spec.repeat, spec.min_repeat_ms)

    def run(self, task: RunTask) -> tuple[MeasureResult, bool]:
        t0 = time.perf_counter()
        try:
            timed = self.runner.run(task.wl, task.path, task.entry, task.verify, task.seed)
        except OpcError as e:
            return MeasureResult(status="invalid", error=_one_line(e), elapsed=time.perf_counter() - t0), False
        except Exception as e:
            fatal = is_cuda_error(e)
            return MeasureResult(status="crash", error=f"run: {type(e).__name__}: {_one_line(e)}",
                                 elapsed=time.perf_counter() - t0), fatal
        m = timed.metrics
        metrics = {"max_abs_err": m["max_abs_err"]} if "max_abs_err" in m else {}
        if timed.wrong:
            return MeasureResult(status="wrong", metrics=metrics, elapsed=time.perf_counter() - t0,
                                 error=timed.wrong), False
        if timed.seconds <= 0:
            return MeasureResult(status="crash", error="the runner measured no time"), False
        metrics.update({k: m[k] for k in (*_KEEP_METRICS, "device_arch", "loaded_as") if k in m})
        return MeasureResult(status="ok", seconds=timed.seconds, metrics=metrics, verified=task.verify,
                             elapsed=time.perf_counter() - t0), False


def _runner_main(conn: Connection, spec: RunnerSpec) -> None:
    """The runner process: say who it is, then measure tasks until told to stop. After a CUDA error
    that poisons the context it answers and exits, and the parent starts a fresh one."""
    _clean_sys_path()
    hello = {"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv)),
             "start_method": mp.get_start_method(allow_none=True)}
    try:
        runner = spec.make()
    except BaseException as e:
        conn.send(("failed", f"the GPU runner could not start: {type(e).__name__}: {_one_line(e)}"))
        return
    conn.send(("ready", hello))
    for task in tasks(conn):
        try:
            res, fatal = runner.run(task)
        except BaseException as e:
            res, fatal = MeasureResult(status="crash", error=f"{type(e).__name__}: {_one_line(e)}\n"
                                                            f"{traceback.format_exc(limit=3)}"[:500]), True
        conn.send(("result", res, fatal))
        if fatal:
            conn.close()
            os._exit(3)


class _Builder(Child):
    """The parent's handle on one build process (forked by the forkserver, build-only)."""

    def __init__(self, ctx: Any, spec: BackendSpec):
        super().__init__(ctx, _builder_main, spec, name="opcompiler-builder")


class _Runner(Child):
    """The parent's handle on one runner process (a fresh interpreter: spawn)."""

    def __init__(self, ctx: Any, spec: RunnerSpec):
        super().__init__(ctx, _runner_main, spec, name="opcompiler-gpu-runner", safe_path=True)
        self.ready = False
        self.hello: dict[str, Any] = {}


# ------------------------------------------------------------------ the measurer

class GpuMeasurer:
    """`workers` build processes feeding one spawned runner process per GPU (one GPU: `runner.device`).
    Same interface as `measure.Measurer`; results in input order."""

    def __init__(self, spec: BackendSpec, workers: int = 1, timeout: float = 60.0, startup_timeout: float = 180.0,
                 runner: RunnerSpec | None = None):
        if workers < 1:
            raise OpcError("must be >= 1 for GPU measurement", arg="--workers", value=workers,
                           expected="the number of build processes, e.g. 8")
        self.spec, self.n, self.timeout, self.startup_timeout = spec, workers, timeout, startup_timeout
        self.runner_spec = runner or RunnerSpec(target=spec.target)
        self._bctx = _context(BUILDER_PRELOAD)
        self._rctx = mp.get_context("spawn")
        self._builders: list[_Builder] = []
        self._fresh: set[int] = set()
        self._runner: _Runner | None = None
        self._runner_failures = 0
        self._dir = tempfile.mkdtemp(prefix="opc_gpu_builds_")
        self.runner_history: list[dict[str, Any]] = []  # hello of every runner started
        self.build_log: deque[BuildResult] = deque(maxlen=256)  # the latest builds, as the builders reported them
        self.stats: dict[str, Any] = {"candidates": 0, "seconds": 0.0, "candidates_per_second": 0.0,
                                      "builders": workers, "runner_restarts": 0, "build_seconds": 0.0,
                                      "run_seconds": 0.0}
        self._seq = 0

    def __enter__(self) -> "GpuMeasurer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in self._builders:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        if self._runner is not None:
            try:
                self._runner.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for w in self._builders:
            w.proc.join(timeout=2)
            w.kill()
        self._builders = []
        if self._runner is not None:
            self._runner.proc.join(timeout=5)
            self._runner.kill()
            self._runner = None
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- processes ----------------------------------------------------------------------------

    def _new_builder(self) -> "_Builder":
        w = _Builder(self._bctx, self.spec)
        self._fresh.add(id(w))
        return w

    def _replace_builder(self, w: "_Builder") -> None:
        w.kill()
        self._fresh.discard(id(w))
        self._builders[self._builders.index(w)] = self._new_builder()

    def _drop_runner(self, restart: bool) -> None:
        if self._runner is not None:
            self._runner.kill()
            self._runner = None
            if restart:
                self.stats["runner_restarts"] += 1

    @property
    def runner_pid(self) -> int | None:
        return self._runner.proc.pid if self._runner is not None else None

    # -- measuring ----------------------------------------------------------------------------

    def measure(self, wl: Workload, configs: Sequence[Mapping[str, Any]], verify: bool = False, seed: int = 0,
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        t_start = time.perf_counter()
        results: list[MeasureResult | None] = [None] * len(configs)
        builds: dict[int, BuildResult] = {}
        while len(self._builders) < self.n:
            self._builders.append(self._new_builder())
        to_build = deque(range(len(configs)))
        to_run: deque[int] = deque()

        def finish(i: int, res: MeasureResult) -> None:
            results[i] = res
            b = builds.get(i)
            if b is not None and b.path:
                try:
                    os.remove(b.path)
                except OSError:
                    pass
            if on_result:
                on_result(i, res)

        while any(r is None for r in results):
            now = time.monotonic()
            for w in self._builders:  # feed idle builders
                if w.task is None and to_build:
                    i = to_build.popleft()
                    self._seq += 1
                    path = os.path.join(self._dir, f"k{self._seq}.so")
                    w.deadline = now + self.timeout + (self.startup_timeout if id(w) in self._fresh else 0.0)
                    try:
                        w.conn.send((wl, dict(configs[i]), path))
                        w.task = i
                    except (OSError, BrokenPipeError):
                        to_build.appendleft(i)
                        self._replace_builder(w)
                        break
            self._feed_runner(wl, configs, builds, to_run, verify, seed, finish)
            busy = [w for w in self._builders if w.task is not None]
            r = self._runner if self._runner is not None and (self._runner.task is not None or not self._runner.ready) \
                else None
            waitables: list[Any] = [x for w in busy for x in (w.conn, w.proc.sentinel)]
            deadlines = [w.deadline for w in busy]
            if r is not None:
                waitables += [r.conn, r.proc.sentinel]
                deadlines.append(r.deadline)
            if not waitables:
                continue
            ready = wait(waitables, timeout=max(0.0, min(deadlines) - time.monotonic()))
            for w in busy:
                i = w.task
                b: BuildResult | None = None
                dead = False
                if w.conn in ready:
                    try:
                        b = w.conn.recv()
                        self._fresh.discard(id(w))
                    except (EOFError, OSError):
                        w.proc.join(timeout=1)
                        b, dead = BuildResult(status="crash", error=f"build worker died (exit code "
                                                                    f"{w.proc.exitcode})"), True
                elif w.proc.sentinel in ready:
                    w.proc.join(timeout=1)
                    b, dead = BuildResult(status="crash", error=f"build worker died (exit code {w.proc.exitcode})"), True
                elif time.monotonic() >= w.deadline:
                    b, dead = BuildResult(status="timeout", error=f"build not done within the {self.timeout:g} s "
                                                                   "timeout"), True
                if b is None:
                    continue
                w.task = None
                builds[i] = b
                self.build_log.append(b)
                self.stats["build_seconds"] += b.elapsed
                if b.status == "ok":
                    to_run.append(i)
                else:
                    finish(i, MeasureResult(status=b.status, error=b.error, elapsed=b.elapsed))
                if dead:
                    self._replace_builder(w)
            if r is not None:
                self._collect_runner(r, ready, builds, to_run, finish)
        wall = time.perf_counter() - t_start
        self.stats["candidates"] += len(configs)
        self.stats["seconds"] += wall
        self.stats["candidates_per_second"] = self.stats["candidates"] / self.stats["seconds"] \
            if self.stats["seconds"] > 0 else 0.0
        return results  # type: ignore[return-value]

    def _feed_runner(self, wl: Workload, configs: Sequence[Mapping[str, Any]], builds: dict[int, BuildResult],
                     to_run: deque, verify: bool, seed: int, finish: Callable[[int, MeasureResult], None]) -> None:
        if not to_run:
            return
        if self._runner is not None and self._runner.ready and self._runner.task is None \
                and not self._runner.proc.is_alive():  # died while idle: blame no candidate
            self._drop_runner(restart=True)
        if self._runner is None:
            if self._runner_failures >= 2:  # the runner cannot start at all: say why for every candidate
                while to_run:
                    i = to_run.popleft()
                    finish(i, MeasureResult(status="crash", error=self._runner_error))
                return
            self._runner = _Runner(self._rctx, self.runner_spec)
            self._runner.deadline = time.monotonic() + self.startup_timeout
        r = self._runner
        if not r.ready or r.task is not None:
            return
        i = to_run.popleft()
        b = builds[i]
        task = RunTask(wl=wl, path=b.path, entry=b.entry, config=dict(configs[i]), verify=verify, seed=seed)
        try:
            r.conn.send(task)
        except (OSError, BrokenPipeError):
            to_run.appendleft(i)
            self._drop_runner(restart=True)
            return
        r.task, r.deadline = i, time.monotonic() + self.timeout

    _runner_error = ""

    def _collect_runner(self, r: _Runner, ready: list, builds: dict[int, BuildResult], to_run: deque,
                        finish: Callable[[int, MeasureResult], None]) -> None:
        i = r.task
        died = r.proc.sentinel in ready
        if r.conn in ready:
            try:
                msg = r.conn.recv()
            except (EOFError, OSError):
                msg, died = None, True
            if msg is not None and msg[0] == "ready":
                r.ready, r.hello = True, msg[1]
                r.deadline = 0.0
                self._runner_failures = 0
                self.runner_history.append(msg[1])
                return
            if msg is not None and msg[0] == "failed":
                self._runner_error = msg[1]
                self._runner_failures += 1
                self._drop_runner(restart=False)
                return
            if msg is not None and msg[0] == "result":
                _, res, fatal = msg
                b = builds[i]
                self.stats["run_seconds"] += res.elapsed
                r.task = None
                finish(i, _with_build(res, b))
                if fatal:  # the context is gone: the runner exits, a fresh one is spawned on demand
                    self._drop_runner(restart=True)
                return
        elif not died and time.monotonic() < r.deadline:
            return
        # died (its pipe or its sentinel closed) or hung past the deadline
        if died:
            r.proc.join(timeout=5)
        alive = not died
        if not r.ready:
            self._runner_error = (f"the GPU runner did not start within {self.startup_timeout:g} s" if alive else
                                  f"the GPU runner died while starting (exit code {r.proc.exitcode})")
            self._runner_failures += 1
            self._drop_runner(restart=False)
            return
        res = MeasureResult(status="timeout", error=f"no result within the {self.timeout:g} s timeout") if alive \
            else MeasureResult(status="crash", error=f"the GPU runner died (exit code {r.proc.exitcode}) "
                                                       "running this kernel")
        self._drop_runner(restart=True)
        if i is not None:
            finish(i, _with_build(res, builds[i]))


def _with_build(res: MeasureResult, b: BuildResult) -> MeasureResult:
    """The runner's result with the build's facts (compiler, registers...) and its time added."""
    from dataclasses import replace
    keep = {k: b.info[k] for k in ("cuda_compiler", "registers_per_thread", "spill_bytes") if k in b.info}
    return replace(res, metrics={**keep, **res.metrics}, elapsed=res.elapsed + b.elapsed)
