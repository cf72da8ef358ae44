"""The autotuner: knob spaces and features, measurement in worker processes, an XGBoost
ranking cost model, model-guided search, and JSON-lines tuning records.

    >>> from opcompiler.tune import tune
    >>> res = tune("conv2d", "ascend-sim", preset="resnet50.res2_3x3", dtype="float16", trials=128)

Modules: `space` (knobs, features), `measure` (workers, timeouts), `cost_model` (XGBoost),
`search` (xgb | random | grid), `records` (tuning logs, `best_record`), `tuner` (the loop).
"""
from __future__ import annotations

from typing import Any

from ..records import Record, RecordLog, best_record, default_log_path

_LAZY = {"tune", "Tuner", "TuneOptions", "TuneResult"}


def __getattr__(name: str) -> Any:
    # the loop pulls in TVM; reading records (api.py's `--config best`) should not
    if name in _LAZY:
        from . import tuner
        return getattr(tuner, name)
    raise AttributeError(name)


__all__ = ["tune", "Tuner", "TuneOptions", "TuneResult", "Record", "RecordLog", "best_record", "default_log_path"]
