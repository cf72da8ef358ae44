"""The tuning loop: next batch -> measure -> record -> update the model -> stop early -> verify.

    >>> from opcompiler.tune import tune
    >>> res = tune("conv2d", "ascend-sim", preset="resnet50.res2_3x3", dtype="float16", trials=128)
    >>> res.best.config, res.best.cycles, res.speedup

Re-running the same call resumes: configs already in the log are not measured again, the
model is trained on them, and `trials` counts the records already there.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import OpcError
from ..ops import get_op, workload as make_workload
from ..target import Target, load_target
from ..template import get_template
from ..workload import Workload
from .cost_model import Sample
from .records import check_writable, now
from .measure import BackendSpec, Measurer, MeasureResult
from ..records import Record, RecordLog, best_of, config_id, default_log_path, fold, record_key
from .search import TUNERS, SearchStrategy, make_strategy
from .space import Space


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """How to tune. `trials` is the total number of measured configs for this workload,
    records already in the log included (so a re-run resumes instead of starting over)."""

    trials: int = 64
    tuner: str = "xgb"
    batch_size: int = 8
    workers: int = 1
    timeout: float = 60.0
    early_stop: int | None = None  # trials without improvement; None = max(32, trials // 2); 0 = never
    transfer: bool = True  # warm-start the model with records of other shapes of this op
    verify: bool = True  # check the best against the reference before marking it verified
    verify_top: int = 5  # candidates tried in cost order until one verifies
    seed: int = 0
    log: str | os.PathLike | None = None  # default: the user's log (`records.default_log_path`)
    allow_shipped: bool = False  # write into the package's shipped records (maintainers' regeneration only)
    progress: bool = True
    backend_factory: str = ""  # "module:callable" building the backend (tests use fakes)
    rpc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.trials, int) or self.trials < 1:
            raise OpcError("must be a positive integer", arg="--trials", value=self.trials, expected="e.g. 64")
        if self.tuner not in TUNERS:
            raise OpcError("unknown tuner", arg="--tuner", value=self.tuner, expected=" | ".join(TUNERS))
        if self.batch_size < 1:
            raise OpcError("must be >= 1", arg="--batch-size", value=self.batch_size)
        if self.timeout <= 0:
            raise OpcError("must be > 0 seconds", arg="--timeout", value=self.timeout)
        if self.early_stop is not None and self.early_stop < 0:
            raise OpcError("must be >= 0 (0 disables it)", arg="--early-stop", value=self.early_stop)

    @property
    def patience(self) -> int:
        if self.early_stop is None:
            return max(32, self.trials // 2)
        return self.early_stop or 10**9


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """What a tuning run found. `best` is the best VERIFIED record (None when nothing verified)."""

    workload: Workload
    target: Target
    template: str
    best: Record | None
    best_measured: Record | None  # best by cost, verified or not
    default: Record | None
    trials: int  # measured configs for this workload in the log (this run and earlier ones)
    new_trials: int  # measured in this run
    invalid: int  # of `trials`, how many failed (invalid, crash, timeout, wrong)
    rejected: int  # refused by the template's check before measuring
    log: Path
    stop_reason: str
    history: list[float] = field(default_factory=list)  # cost of each trial of this run, in order
    failures: dict[str, int] = field(default_factory=dict)  # most common failure reasons
    elapsed: float = 0.0
    measure_stats: dict[str, Any] = field(default_factory=dict)  # candidates, seconds, candidates_per_second...

    @property
    def unit(self) -> str:
        rec = self.best or self.best_measured or self.default
        return "cycles" if rec is not None and rec.cycles is not None else "seconds"

    @property
    def speedup(self) -> float | None:
        """Default cost / best cost (both measured in this log)."""
        if self.best is None or self.default is None or not self.default.valid:
            return None
        return self.default.cost / self.best.cost


def tune(op: str, target: str | Target = "cpu", *, shape: str | Mapping[str, Any] | None = None,
         preset: str | None = None, batch: int | None = None, dtype: str | None = None,
         on_trial: Callable[[int, MeasureResult], None] | None = None, measurer: Measurer | None = None,
         **options: Any) -> TuneResult:
    """Tune `op` at one shape for `target`; keyword options are `TuneOptions` fields. `measurer`:
    one to measure with (and leave open), shared by calls for the same target (`tune_model`)."""
    tgt = target if isinstance(target, Target) else load_target(target)
    wl = make_workload(op, shape, preset=preset, batch=batch, dtype=dtype)
    return Tuner(wl, tgt, TuneOptions(**options)).run(on_trial, measurer=measurer)


class Tuner:
    """One tuning session for one workload on one target."""

    def __init__(self, wl: Workload, target: Target, options: TuneOptions):
        self.wl, self.target, self.opt = wl, target, options
        self.template = get_template(get_op(wl.op).family, target.family)
        self.space = Space.of(wl, target, self.template)
        self.key = record_key(wl, target, self.template.name, self.template.version)
        path = options.log if options.log is not None else default_log_path(target, wl.op)
        self.log = RecordLog(check_writable(path, allow_shipped=options.allow_shipped))

    # -- the loop -------------------------------------------------------------------------

    def run(self, on_trial: Callable[[int, MeasureResult], None] | None = None,
            measurer: Measurer | None = None) -> TuneResult:
        t0 = time.perf_counter()
        opt = self.opt
        everything = self.log.read()
        mine = [r for r in everything if _same(r.key, self.key)]
        states = fold(mine)
        strategy = make_strategy(opt.tuner, self.space, opt.seed,
                                 transfer=self._transfer(everything) if opt.transfer and opt.tuner == "xgb" else ())
        strategy.observe([(s.record.config, s.record.cost) for s in states.values()])
        done = len(states)
        best_cost = min((s.record.cost for s in states.values()), default=math.inf)
        since_best, history = 0, []
        failures: Counter[str] = Counter()
        default_cfg = self.template.config(self.wl, self.target, None)
        # the first batch measures the default (every speedup's baseline) and, for a fused op, its
        # anchor's best record (conv2d's for conv2d_bn_relu), so the search starts from both
        from ..config import inherited
        inh = inherited(self.wl, self.target)
        seeds = _unique([default_cfg] + ([dict(inh.spec)] if inh is not None else []))
        stop = ""
        bar = _progress(opt, total=opt.trials, initial=min(done, opt.trials), desc=f"tune {self.wl.op}")
        invalid = sum(1 for s in states.values() if not s.record.valid)
        spec = BackendSpec(target=self.target, factory=opt.backend_factory, rpc=opt.rpc)
        with (contextlib.nullcontext(measurer) if measurer is not None
              else Measurer(spec, workers=opt.workers, timeout=opt.timeout)) as measurer:
            while done < opt.trials:
                # a batch keeps every worker (or every free RPC server) busy
                want = min(max(opt.batch_size, measurer.parallelism), opt.trials - done)
                first = [c for c in seeds if config_id(c) not in strategy.measured][:want]
                batch = strategy.next_batch(want - len(first)) if want > len(first) else []
                if first:
                    batch = _unique(first + batch)
                if not batch:
                    stop = "every valid config of the space is measured"
                    break
                # each record is appended as its result arrives: an interrupted run keeps every one
                results = measurer.measure(self.wl, batch, seed=opt.seed,
                                           on_result=lambda i, r, b=batch: self.log.append(self._record(b[i], r)))
                strategy.observe([(c, r.cost) for c, r in zip(batch, results)])
                for c, r in zip(batch, results):
                    done += 1
                    history.append(r.cost)
                    if r.status != "ok":
                        invalid += 1
                        failures[_reason(r)] += 1
                    if r.cost < best_cost * (1 - 1e-9):
                        best_cost, since_best = r.cost, 0
                    else:
                        since_best += 1
                    if on_trial:
                        on_trial(done, r)
                if bar is not None:
                    bar.update(len(batch))
                    bar.set_postfix_str(f"best {_fmt_cost(best_cost, self.target)}  invalid {invalid}", refresh=False)
                if since_best >= opt.patience:
                    stop = f"no improvement in {since_best} trials (early stop)"
                    break
                if strategy.exhausted and not strategy.next_batch(1):
                    stop = "every valid config of the space is measured"
                    break
            else:
                stop = stop or f"reached {opt.trials} trials"
            if bar is not None:
                bar.close()
            if opt.verify:
                self._verify(measurer)
            measure_stats = measurer.stats
        mine = [r for r in self.log.read(warn=False) if _same(r.key, self.key)]
        states = fold(mine)
        default_state = states.get(config_id(default_cfg))
        return TuneResult(
            workload=self.wl, target=self.target, template=self.template.name,
            best=best_of(mine, verified_only=True), best_measured=best_of(mine, verified_only=False),
            default=default_state.record if default_state else None, trials=len(states),
            new_trials=len(history), invalid=sum(1 for s in states.values() if not s.record.valid or s.wrong),
            rejected=strategy.rejected, log=self.log.path, stop_reason=stop or f"reached {opt.trials} trials",
            history=history, failures=dict(failures.most_common(3)), elapsed=time.perf_counter() - t0,
            measure_stats=measure_stats)

    def _verify(self, measurer: Measurer) -> None:
        """Check the best candidates against the reference, in cost order, until one passes."""
        states = fold(r for r in self.log.read(warn=False) if _same(r.key, self.key))
        ranked = sorted((s for s in states.values() if s.record.valid and not s.wrong), key=lambda s: s.record.cost)
        for s in ranked[: self.opt.verify_top]:
            if s.verified:
                return
            res = measurer.measure(self.wl, [s.record.config], verify=True, seed=self.opt.seed)[0]
            if res.status == "ok" and res.verified:
                # keep the tuning measurement's numbers: the verified line vouches for that record
                self.log.append(Record(key=self.key, config=s.record.config, status="ok", cycles=s.record.cycles,
                                       seconds=s.record.seconds, metrics={**s.record.metrics, **res.metrics},
                                       verified=True, tuner="verify", timestamp=now()))
                return
            # a crash or hang while checking condemns the kernel as surely as a wrong value
            why = res.error if res.status == "wrong" else f"{res.status} during verification: {res.error}"
            self.log.append(Record(key=self.key, config=s.record.config, status="wrong", metrics=res.metrics,
                                   error=why or "verification failed", tuner="verify", timestamp=now()))

    # -- helpers --------------------------------------------------------------------------

    def _record(self, config: Mapping[str, Any], r: MeasureResult) -> Record:
        return Record(key=self.key, config=dict(config), status=r.status, cycles=r.cycles, seconds=r.seconds,
                      metrics=r.metrics, verified=False, error=r.error, tuner=self.opt.tuner, timestamp=now())

    def _transfer(self, records: list[Record]) -> list[Sample]:
        """Valid-or-not records of OTHER shapes of this op on this target and template version."""
        out = []
        for r in records:
            k = r.key
            if (k["op"] == self.key["op"] and k["target_digest"] == self.key["target_digest"]
                    and k["template"] == self.key["template"] and k["template_version"] == self.key["template_version"]
                    and (k["params"] != self.key["params"] or k["dtype"] != self.key["dtype"])):
                try:
                    wl = Workload.make(k["op"], k["params"], k["dtype"])
                except (TypeError, AttributeError):
                    continue
                out.append(Sample(wl=wl, config=r.config, cost=r.cost))
        return out


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    return [c for c in configs if not (config_id(c) in seen or seen.add(config_id(c)))]


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    from ..records import same_key
    return same_key(a, b)


def _reason(r: MeasureResult) -> str:
    # numbers differ from candidate to candidate; the reason should not
    head = re.sub(r"\d+", "N", r.error.split(";")[0]) if r.error else ""
    return f"{r.status}: {head}".strip().rstrip(":")[:100]


def _fmt_cost(c: float, target: Target) -> str:
    if not math.isfinite(c):
        return "-"
    return f"{c:,.0f} cyc" if target.is_simulator else f"{c * 1e3:.4g} ms"


def _progress(opt: TuneOptions, total: int, initial: int, desc: str) -> Any:
    if not opt.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="trial", dynamic_ncols=True, leave=True)


__all__ = ["tune", "Tuner", "TuneOptions", "TuneResult", "SearchStrategy"]
