"""Derived defaults: a config ranked for the workload and the machine, with no measurement.

TBE and CANN compute a tiling per shape from the hardware; AutoTVM's transfer learning and
MetaSchedule's pre-trained models rank configs of a shape nobody measured from what was measured
on other shapes. This module does the latter for the simulator templates: an XGBoost model per
(target, template), shipped with the package (`opcompiler/default_models/<target family>.<template>.json`), trained by
`benchmarks/train_default_model.py` on configs of *synthetic* workloads measured in the simulator
(none of the shipped records' shapes: the benchmark that judges the defaults,
`benchmarks/default_quality.py`, measures them on those held-out shapes).

The default of a workload is then the config of the template's default candidate set (the tunable
knobs, with every core and double buffering) that the model predicts fastest and that passes the
template's `check`. Nothing is measured; ranking ~1,000 candidates costs milliseconds per config
and is cached per workload. `measure_top(k)` is the opt-in "benchmark mode" (cuDNN's): the k
best-predicted candidates are timed in the simulator and the fastest is taken.

A template without a shipped model keeps its own `default` (its preferred order).
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .target import Target
from .workload import Workload

MODEL_DIR = Path(__file__).resolve().parent / "default_models"
FORMAT = 1
# Knobs the candidate set pins: every core, ping-pong buffers (single-buffered only when nothing
# double-buffered fits), A in fractal layout (the host packs it).
PINNED = {"double_buffer": 1, "a_layout": "zZ"}


def model_path(target: Target, template_name: str) -> Path:
    return MODEL_DIR / f"{target.family}.{template_name}.json"


@lru_cache(maxsize=None)
def _load(path: str) -> tuple[Any, list[str], str] | None:
    p = Path(path)
    if not p.is_file():
        return None
    obj = json.loads(p.read_text())
    if obj.get("format") != FORMAT:
        return None
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(obj["model"].encode()))
    booster.set_param({"nthread": 1})
    return booster, list(obj["columns"]), str(obj.get("label", LABEL_CYCLES))


# what a model predicts: log2(cycles), or log2(cycles / the op's FLOPs) -- time per unit of work,
# which a tree model carries to shapes larger than any it was trained on (its absolute cycles
# would stop at the largest trained ones and no longer rank the candidates)
LABEL_CYCLES, LABEL_PER_FLOP = "log2_cycles", "log2_cycles_per_flop"


def load_model(target: Target, template_name: str) -> tuple[Any, list[str], str] | None:
    """(booster, feature columns, label) of the shipped model, or None when there is none."""
    return _load(str(model_path(target, template_name)))


def candidates(template: Any, wl: Workload, target: Target, single_buffer: bool = False) -> list[dict]:
    """The default candidate set: every combination of the tile knobs, with every core and the
    pinned knobs (`PINNED`); `single_buffer` gives the same set single-buffered."""
    import itertools

    space = template.space(wl, target)
    fixed, free = {}, []
    for k in space:
        if k.name == "block_dim":
            fixed[k.name] = max(k.values)
        elif k.name in PINNED and PINNED[k.name] in k.values:
            fixed[k.name] = PINNED[k.name]
        else:
            free.append(k)
    if single_buffer and "double_buffer" in fixed:
        fixed["double_buffer"] = 0
    order = [k.name for k in space]
    out = []
    for combo in itertools.product(*(k.values for k in free)):
        cfg = {**fixed, **dict(zip((k.name for k in free), combo))}
        out.append({name: cfg[name] for name in order})  # the template's knob order, as users read it
    return out


def _log2(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return math.log2(v) if v > 0 else -1.0
    return float("nan")


def feature_dict(template: Any, wl: Workload, target: Target, cfg: Mapping[str, Any],
                 knob_values: Mapping[str, tuple] | None = None) -> dict[str, float]:
    """Named features of one config: knobs (log2; a named value by its place among the knob's
    values) and shape (log2), the machine (cores), the fused epilogue's length, and the template's
    derived quantities (log2 of sizes, ratios as they are). `knob_values`: the template's space
    as {name: values}, when the caller has it."""
    from .ops import get_op

    if knob_values is None:
        knob_values = {k.name: k.values for k in template.space(wl, target)}
    out: dict[str, float] = {}
    for k, v in cfg.items():
        out[f"knob.{k}"] = float(knob_values[k].index(v)) if isinstance(v, str) else _log2(v)
    for k, v in wl.params:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"shape.{k}"] = _log2(v)
    out["machine.cores"] = float(target.cores)
    op = get_op(wl.op)
    out["op.epilogue"] = float(len(op.unfused(wl)) - 1)
    out["op.flops"] = _log2(op.flops(wl))
    for k, v in template.features(wl, target, cfg).items():
        v = float(v)
        out[f"t.{k}"] = v if -1.0 <= v <= 1.0 or k.startswith("occupancy") else _log2(v)
    return out


def rows(columns: list[str], feats: list[dict[str, float]]) -> np.ndarray:
    return np.asarray([[f.get(c, np.nan) for c in columns] for f in feats], dtype=np.float32)


_RANKED: dict[tuple, list[tuple[float, dict]]] = {}


def ranked(template: Any, wl: Workload, target: Target) -> list[tuple[float, dict]] | None:
    """The valid candidates, fastest predicted first, as (predicted cycles, config); None when
    the template has no shipped model. Cached per (template, workload, target)."""
    from .ops import get_op

    model = load_model(target, template.name)
    if model is None:
        return None
    key = (template.name, template.version, wl, target.digest)
    hit = _RANKED.get(key)
    if hit is not None:
        return hit
    booster, columns, label = model
    shift = math.log2(max(get_op(wl.op).flops(wl), 1)) if label == LABEL_PER_FLOP else 0.0
    out: list[tuple[float, dict]] = []
    for single in (False, True):
        valid = [c for c in candidates(template, wl, target, single) if template.check(wl, target, c) is None]
        if valid:
            values = {k.name: k.values for k in template.space(wl, target)}
            pred = booster.inplace_predict(rows(columns, [feature_dict(template, wl, target, c, values)
                                                          for c in valid]), missing=np.nan)
            out = sorted(((float(2.0 ** (p + shift)), c) for p, c in zip(pred, valid)), key=lambda t: t[0])
            break
    _RANKED[key] = out
    return out


def derived_default(template: Any, wl: Workload, target: Target) -> dict | None:
    """The best-predicted valid candidate, or None (no model, or no candidate fits)."""
    for _, cfg in ranked(template, wl, target) or ():
        if template.check(wl, target, cfg) is None:  # the ranking is cached; the check is asked again
            return dict(cfg)
    return None


def measure_top(template: Any, wl: Workload, target: Target, k: int, backend: Any) -> tuple[dict, int] | None:
    """Benchmark mode: time the `k` best-predicted candidates in the simulator (timing mode) and
    return (the fastest config, its cycles), or None when there is no model or nothing fits."""
    r = ranked(template, wl, target)
    if not r:
        return None
    best: tuple[dict, int] | None = None
    for _, cfg in r[:max(1, k)]:
        cyc = backend.measure(backend.build(wl, cfg)).cycles
        if cyc is not None and (best is None or cyc < best[1]):
            best = (dict(cfg), int(cyc))
    return best


__all__ = ["candidates", "derived_default", "feature_dict", "load_model", "measure_top", "model_path", "ranked"]
