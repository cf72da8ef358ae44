"""The search space of one (workload, target, template) and the features the cost model sees.

`Space` wraps a template's knobs: it enumerates, samples, mutates and checks configs
(`Template.check` rejects points before anything is measured). `FeatureExtractor` turns a
config into a fixed-length vector: each knob's value (log2 of numeric values, one-hot of
categorical ones), the workload's shape, and the template's derived quantities (bytes per
memory level, arithmetic intensity, buffer occupancy, alignment waste, trip counts, work per
core) from `Template.features`.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from ..target import Target
from ..template import Config, Knob, Template
from ..workload import Workload
from ..records import config_id


@dataclass(frozen=True)
class Space:
    """The knob space of one template for one workload on one target."""

    wl: Workload
    target: Target
    template: Template
    knobs: tuple[Knob, ...]

    @staticmethod
    def of(wl: Workload, target: Target, template: Template) -> "Space":
        return Space(wl, target, template, tuple(template.space(wl, target)))

    @property
    def size(self) -> int:
        return math.prod(len(k.values) for k in self.knobs)

    def default(self) -> Config:
        return dict(self.template.default(self.wl, self.target))

    def why_invalid(self, config: Mapping[str, Any]) -> str | None:
        """The template's reason a config cannot work (capacity, alignment), or None."""
        return self.template.check(self.wl, self.target, config)

    def __iter__(self) -> Iterator[Config]:
        return self.template.iter_space(self.wl, self.target)

    def random(self, rng: random.Random) -> Config:
        return {k.name: rng.choice(k.values) for k in self.knobs}

    def mutate(self, config: Mapping[str, Any], rng: random.Random) -> Config:
        """Change one knob to a neighbouring value (or any value, for unordered knobs)."""
        out = dict(config)
        movable = [k for k in self.knobs if len(k.values) > 1]
        if not movable:
            return out
        k = rng.choice(movable)
        vals = list(k.values)
        i = vals.index(out[k.name]) if out.get(k.name) in vals else 0
        if _numeric(k) and rng.random() < 0.8:  # ordered knobs mostly step to a neighbour
            j = min(max(i + rng.choice((-1, 1)), 0), len(vals) - 1)
            if j == i:
                j = i - 1 if i > 0 else i + 1
        else:
            j = rng.choice([x for x in range(len(vals)) if x != i])
        out[k.name] = vals[j]
        return out

    def id(self, config: Mapping[str, Any]) -> str:
        return config_id(config)


def _numeric(k: Knob) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in k.values)


class FeatureExtractor:
    """Config -> feature vector, with a stable column order for one space.

    Columns: knob values, then the workload's numeric shape params (so records of other
    shapes of the same op can train one model), then the template's derived features
    (names fixed by the first config seen; missing ones are NaN, which XGBoost handles)."""

    def __init__(self, space: Space):
        self.space = space
        self._derived: list[str] | None = None

    def knob_columns(self) -> list[str]:
        cols = []
        for k in self.space.knobs:
            if _numeric(k):
                cols.append(f"knob.{k.name}")
            else:
                cols += [f"knob.{k.name}={v}" for v in k.values]
        return cols

    def _knob_values(self, config: Mapping[str, Any]) -> list[float]:
        out = []
        for k in self.space.knobs:
            v = config.get(k.name)
            if _numeric(k):
                out.append(_log2(v))
            else:
                out += [1.0 if v == x else 0.0 for x in k.values]
        return out

    def _shape_values(self, wl: Workload) -> list[float]:
        return [_log2(v) for _, v in wl.params if isinstance(v, (int, float)) and not isinstance(v, bool)]

    def derived(self, config: Mapping[str, Any], wl: Workload | None = None) -> dict[str, float]:
        wl = wl or self.space.wl
        try:
            return dict(self.space.template.features(wl, self.space.target, config))
        except Exception:  # a template's feature code must not stop tuning; the knobs remain
            return {}

    def vector(self, config: Mapping[str, Any], wl: Workload | None = None) -> np.ndarray:
        """The feature row of `config` (for `wl`, this space's workload by default)."""
        wl = wl or self.space.wl
        d = self.derived(config, wl)
        if self._derived is None:
            self._derived = sorted(d)
        derived = [_safe(d.get(n, float("nan"))) for n in self._derived]
        return np.asarray(self._knob_values(config) + self._shape_values(wl) + derived, dtype=np.float32)

    def matrix(self, configs: list[Mapping[str, Any]], wls: list[Workload] | None = None) -> np.ndarray:
        if not configs:
            return np.zeros((0, 0), dtype=np.float32)
        rows = [self.vector(c, wls[i] if wls else None) for i, c in enumerate(configs)]
        width = max(len(r) for r in rows)  # other shapes may have other param sets: pad with NaN
        return np.stack([np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows])


def _log2(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return math.log2(v) if v > 0 else (-1.0 if v == 0 else -math.log2(-v) - 2)
    return float("nan")


def _safe(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f if math.isfinite(f) else float("nan")
