"""The cost model: XGBoost with a pairwise ranking objective, trained online on the records.

A tuner only needs the order of candidates right, so the model learns a ranking: within
each workload (one XGBoost query group per shape), a faster config gets a higher relevance
(`best_cost / cost`, in (0, 1]); invalid ones get 0. Records of other shapes of the same op,
target and template join as extra groups (transfer) so the first batches are not blind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..workload import Workload
from .space import FeatureExtractor


@dataclass(frozen=True, kw_only=True)
class XGBConfig:
    """XGBoost parameters of the ranking model (change one with `dataclasses.replace`)."""

    objective: str = "rank:pairwise"
    max_depth: int = 6
    eta: float = 0.2
    min_child_weight: float = 1.0
    subsample: float = 1.0
    rounds: int = 60
    nthread: int = 1  # the other core is measuring
    seed: int = 0

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective, "max_depth": self.max_depth, "eta": self.eta,
                "min_child_weight": self.min_child_weight, "subsample": self.subsample,
                "nthread": self.nthread, "seed": self.seed, "verbosity": 0}


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One training point: a config of a workload and its measured cost (inf = invalid)."""

    wl: Workload
    config: Mapping[str, Any]
    cost: float


class XGBCostModel:
    """Predicts a score per config (higher = predicted faster) from its features."""

    def __init__(self, features: FeatureExtractor, config: XGBConfig | None = None):
        self.features = features
        self.config = config or XGBConfig()
        self._booster: Any = None
        self._transfer: list[Sample] = []
        self._cache: dict[tuple[Workload, str], np.ndarray] = {}

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def add_transfer(self, samples: Sequence[Sample]) -> None:
        """Records of other shapes (same op, target, template) that warm-start every fit."""
        self._transfer = list(samples)

    def _row(self, wl: Workload, config: Mapping[str, Any]) -> np.ndarray:
        from ..records import config_id
        key = (wl, config_id(config))
        row = self._cache.get(key)
        if row is None:
            row = self._cache[key] = self.features.vector(config, wl)
        return row

    def _matrix(self, samples: Sequence[Sample]) -> np.ndarray:
        rows = [self._row(s.wl, s.config) for s in samples]
        width = max(len(r) for r in rows)
        if any(len(r) != width for r in rows):  # other shapes may carry other params
            rows = [np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows]
        return np.stack(rows)

    def fit(self, samples: Sequence[Sample]) -> None:
        """Retrain from scratch on `samples` plus the transfer records (fast: trees are small)."""
        import xgboost as xgb
        groups: dict[Workload, list[Sample]] = {}
        for s in list(self._transfer) + list(samples):
            groups.setdefault(s.wl, []).append(s)
        # A group with one valid point teaches no order; keep groups that do.
        groups = {wl: g for wl, g in groups.items() if sum(np.isfinite(s.cost) for s in g) >= 1 and len(g) >= 2}
        if not groups:
            return
        ordered = [s for g in groups.values() for s in g]
        labels = []
        for g in groups.values():
            best = min((s.cost for s in g if np.isfinite(s.cost)), default=np.inf)
            labels += [best / s.cost if np.isfinite(s.cost) and s.cost > 0 else 0.0 for s in g]
        dm = xgb.DMatrix(self._matrix(ordered), label=np.asarray(labels, dtype=np.float32), missing=np.nan,
                         nthread=self.config.nthread)
        dm.set_group([len(g) for g in groups.values()])
        self._booster = xgb.train(self.config.params(), dm, num_boost_round=self.config.rounds)
        self._width = dm.num_col()

    def predict(self, configs: Sequence[Mapping[str, Any]], wl: Workload | None = None) -> np.ndarray:
        """Scores of `configs` (higher = predicted better); zeros before the first fit."""
        if not configs:
            return np.zeros(0)
        if self._booster is None:
            return np.zeros(len(configs))
        wl = wl or self.features.space.wl
        x = self._matrix([Sample(wl=wl, config=c, cost=0.0) for c in configs])
        if x.shape[1] < self._width:
            x = np.pad(x, ((0, 0), (0, self._width - x.shape[1])), constant_values=np.nan)
        # inplace_predict skips building a DMatrix (which costs more than the prediction itself)
        return self._booster.inplace_predict(x[:, : self._width], missing=np.nan)

