"""The autotuner: knob spaces and features, measurement in worker processes, an XGBoost
ranking cost model and model-guided search, writing JSON-lines tuning records.

    >>> from opcompiler.tune import tune
    >>> res = tune("conv2d", "ascend-sim", preset="resnet50.res2_3x3", dtype="float16", trials=128)

Modules: `space` (knobs, features), `measure` (workers, timeouts), `cost_model` (XGBoost),
`search` (xgb | random | grid), `records` (a log checked writable before tuning), `tuner` (the
loop). The record store itself (`Record`, `RecordLog`, `best_record`) is `opcompiler.records`, in
the core, re-exported here.
"""
from __future__ import annotations

from typing import Any

from ..records import Record, RecordLog, best_record, default_log_path

_LAZY = {"tune", "Tuner", "TuneOptions", "TuneResult"}


def __getattr__(name: str) -> Any:
    # the loop pulls in TVM (and every template); reading records should not
    if name in _LAZY:
        from . import tuner
        return getattr(tuner, name)
    raise AttributeError(name)


__all__ = ["tune", "Tuner", "TuneOptions", "TuneResult", "Record", "RecordLog", "best_record", "default_log_path"]
