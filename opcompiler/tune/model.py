"""Whole-model tuning, the way MetaSchedule's `tune_relax` and Ansor's task scheduler do it.

    >>> res = tune_model(load("resnet18.onnx", batch=1), "ascend-sim", trials=256)
    >>> res.before["cost"], res.after["cost"]       # estimated model seconds, cost-chosen plan

The distinct kernels of both plans (fuse every pattern, fuse nothing) are the tasks, deduplicated
by workload. Trials go out in rounds of `batch_size`: each round to the task with the largest
share of the model's estimated time per trial it already had (share / (1 + trials / batch)), the
share re-estimated from the task's best record after every round. Each round is an ordinary
`tune` call, so records land in the usual logs, a re-run resumes (`trials` counts the records
already there), and `compare --config best` / `graph run --config best` pick the results up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import OpcError
from ..ops import get_op
from ..target import Target, load_target
from ..template import get_template
from ..workload import Workload
from ..records import RecordLog, default_log_path, fold, record_key


@dataclass
class Task:
    """One distinct kernel of the model."""

    wl: Workload
    uses: dict[str, int] = field(default_factory=dict)  # kernels of this workload per plan ("fused", "unfused")
    trials: int = 0  # measured configs in the log
    before: float = 0.0  # seconds per call with the best record (or default) when tuning started
    now: float = 0.0  # seconds per call with the best record so far
    done: bool = False  # the search space is exhausted

    @property
    def label(self) -> str:
        return f"{self.wl.op} {self.wl.shape_str()}"

    def share(self) -> float:
        """Seconds this kernel costs the model per run, over both plans."""
        return self.now * sum(self.uses.values())


@dataclass(kw_only=True)
class ModelTuneResult:
    model: str
    target: Target
    tasks: list[Task]
    skipped: list[str]  # kernels no template on the target can tune (they run untuned)
    before: dict[str, float]  # estimated model seconds per plan ("fused", "unfused", "cost")
    after: dict[str, float]
    trials: int  # measured configs over all tasks, earlier runs included
    new_trials: int
    elapsed: float

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "target": self.target.name, "trials": self.trials,
                "new_trials": self.new_trials, "elapsed_s": round(self.elapsed, 2),
                "estimated_seconds_before": self.before, "estimated_seconds_after": self.after,
                "speedup": {k: self.before[k] / self.after[k] if self.after.get(k) else None for k in self.before},
                "skipped": self.skipped,
                "tasks": [{"op": t.wl.op, "shape": t.wl.shape_str(), "dtype": t.wl.dtype, "uses": t.uses,
                           "trials": t.trials, "seconds_before": t.before, "seconds_after": t.now}
                          for t in self.tasks]}


def extract_tasks(graph: Any, target: Target) -> tuple[list[Task], list[str]]:
    """Distinct kernels of the fused and unfused plans that a template of `target` can tune."""
    from ..graph.plan import make_plan
    tasks: dict[str, Task] = {}
    skipped: list[str] = []
    for mode in ("fused", "unfused"):
        plan = make_plan(graph, target, mode=mode)
        for g in plan.groups:
            wl = plan.workload(g)
            if wl is None:
                continue
            key = wl.key_str()
            if key not in tasks:
                try:
                    get_template(get_op(wl.op).family, target.family).config(wl, target, None)
                except OpcError as e:
                    if f"{wl.op} {wl.shape_str()}" not in skipped:
                        skipped.append(f"{wl.op} {wl.shape_str()}: {e}")
                    continue
                tasks[key] = Task(wl=wl)
            tasks[key].uses[mode] = tasks[key].uses.get(mode, 0) + 1
    return list(tasks.values()), skipped


def estimate(graph: Any, target: Target, dtype: str | None = None) -> dict[str, float]:
    """Estimated model seconds per plan with the best records now: each kernel measured once
    (simulated on the simulators) and summed; "cost" is the cost-chosen plan."""
    from ..graph.cost import cost
    from ..graph.plan import make_plan
    out = {}
    for mode in ("fused", "unfused", "cost"):
        plan = make_plan(graph, target, mode=mode, dtype=dtype)
        total = 0.0
        for g in plan.groups:
            if g.op in ("view", "host"):
                continue
            try:
                total += cost(target, g.op, g.params, plan.dtype)
            except OpcError:
                if plan.fallback is None:
                    raise
        out[mode] = total
    return out


def _logged_trials(task: Task, target: Target) -> int:
    tmpl = get_template(get_op(task.wl.op).family, target.family)
    key = record_key(task.wl, target, tmpl.name, tmpl.version)
    return len(fold(RecordLog(default_log_path(target, task.wl.op)).for_key(key, warn=False)))


def tune_model(graph: Any, target: str | Target, trials: int, *, workers: int = 1, batch_size: int = 16,
               progress: bool = True, seed: int = 0, timeout: float = 60.0, rpc: str = "",
               on_round: Callable[[Task, int], None] | None = None) -> ModelTuneResult:
    """Tune every distinct kernel of `graph` for `target` with `trials` measured configs in all.
    `rpc` (HOST:PORT:KEY): measure on the tracker's servers, one set of sessions for the whole model."""
    from ..graph.cost import cost
    from .tuner import tune
    tgt = target if isinstance(target, Target) else load_target(target)
    if not isinstance(trials, int) or trials < 1:
        raise OpcError("must be a positive integer", arg="--trials", value=trials, expected="e.g. 256")
    t0 = time.perf_counter()
    tasks, skipped = extract_tasks(graph, tgt)
    if not tasks:
        raise OpcError(f"no kernel of the model can be tuned on {tgt.name}", arg="MODEL", value=graph.path,
                       expected="a target with templates for the model's ops (opcompiler ops)")
    for t in tasks:
        t.trials = _logged_trials(t, tgt)
        t.before = t.now = cost(tgt, t.wl.op, dict(t.wl.params), t.wl.dtype)
    before = estimate(graph, tgt)
    done = sum(t.trials for t in tasks)
    start = done
    bar = measurer = None
    if rpc:
        from .measure import BackendSpec, Measurer
        measurer = Measurer(BackendSpec(target=tgt, rpc=rpc), workers=workers, timeout=timeout)
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=trials, initial=min(done, trials), desc=f"tune {graph.name}", unit="trial",
                   dynamic_ncols=True)
    try:
        while done < trials:
            live = [t for t in tasks if not t.done]
            if not live:
                break
            task = max(live, key=lambda t: t.share() / (1 + t.trials / batch_size))
            want = min(max(batch_size, measurer.parallelism if measurer is not None else 0), trials - done)
            if bar is not None:
                bar.set_postfix_str(f"{task.label[:60]}", refresh=True)
            res = tune(task.wl.op, tgt, shape=dict(task.wl.params), dtype=task.wl.dtype,
                       trials=task.trials + want, workers=workers, batch_size=min(8, want), timeout=timeout,
                       early_stop=0, seed=seed, progress=False, rpc=rpc, measurer=measurer)
            got = res.trials - task.trials
            task.trials = res.trials
            if got < want or "every valid config" in res.stop_reason:
                task.done = True
            task.now = cost(tgt, task.wl.op, dict(task.wl.params), task.wl.dtype)  # the best record now
            done += max(got, 0)
            if bar is not None:
                bar.update(max(got, 0))
            if on_round is not None:
                on_round(task, got)
    finally:
        if bar is not None:
            bar.close()
        if measurer is not None:
            measurer.close()
    after = estimate(graph, tgt)
    return ModelTuneResult(model=graph.name, target=tgt, tasks=tasks, skipped=skipped, before=before, after=after,
                           trials=done, new_trials=done - start, elapsed=time.perf_counter() - t0)


__all__ = ["tune_model", "extract_tasks", "estimate", "Task", "ModelTuneResult"]
