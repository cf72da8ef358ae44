"""Search strategies: which configs to measure next.

`RandomSearch` and `GridSearch` are the honest baselines. `ModelSearch` ranks candidates with
the XGBoost cost model: it scores the whole (checked) space when it is small, and otherwise
runs simulated annealing over the model's predictions from the best measured points; a
fraction of every batch stays random (exploration) so a wrong model cannot trap the search.
Every strategy skips configs already measured and configs `Template.check` rejects.
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..template import Config
from .cost_model import Sample, XGBConfig, XGBCostModel
from .space import FeatureExtractor, Space

TUNERS = ("xgb", "random", "grid")


class SearchStrategy:
    """Proposes batches of unmeasured, check-valid configs and learns from results."""

    name = "base"

    def __init__(self, space: Space, seed: int = 0):
        self.space = space
        self.rng = random.Random(seed)
        self.measured: set[str] = set()
        self.rejected = 0  # configs `check` refused before measuring
        self._valid: dict[str, bool] = {}
        self.exhausted = False

    def is_valid(self, config: Mapping[str, Any]) -> bool:
        cid = self.space.id(config)
        ok = self._valid.get(cid)
        if ok is None:
            ok = self._valid[cid] = self.space.why_invalid(config) is None
            self.rejected += not ok
        return ok

    def observe(self, results: Sequence[tuple[Mapping[str, Any], float]]) -> None:
        """Tell the strategy what was measured: (config, cost) with inf for invalid."""
        for c, _ in results:
            self.measured.add(self.space.id(c))

    def next_batch(self, n: int) -> list[Config]:
        raise NotImplementedError

    def _random_unmeasured(self, n: int, exclude: set[str], max_tries: int = 0) -> list[Config]:
        out: list[Config] = []
        tries = max_tries or max(200, 50 * n)
        seen = set(exclude)
        for _ in range(tries):
            if len(out) >= n:
                break
            c = self.space.random(self.rng)
            cid = self.space.id(c)
            if cid in seen or cid in self.measured:
                continue
            seen.add(cid)
            if self.is_valid(c):
                out.append(c)
        if len(out) < n and self.space.size <= 200_000:  # sampling ran dry: sweep what is left
            for c in self.space:
                if len(out) >= n:
                    break
                cid = self.space.id(c)
                if cid not in seen and cid not in self.measured:
                    seen.add(cid)
                    if self.is_valid(c):
                        out.append(c)
            if len(out) < n:
                self.exhausted = True
        return out


class RandomSearch(SearchStrategy):
    """Uniform random sampling without replacement (the baseline every tuner must beat)."""

    name = "random"

    def next_batch(self, n: int) -> list[Config]:
        return self._random_unmeasured(n, set())


class GridSearch(SearchStrategy):
    """The space in its natural order (exhaustive when the budget allows)."""

    name = "grid"

    def __init__(self, space: Space, seed: int = 0):
        super().__init__(space, seed)
        self._it: Iterator[Config] = iter(space)

    def next_batch(self, n: int) -> list[Config]:
        out: list[Config] = []
        for c in self._it:
            if self.space.id(c) not in self.measured and self.is_valid(c):
                out.append(c)
                if len(out) >= n:
                    return out
        self.exhausted = True
        return out


@dataclass(frozen=True, kw_only=True)
class ModelSearchConfig:
    """Knobs of the model-guided search."""

    explore: float = 0.15  # fraction of each batch drawn at random
    warmup: int = 16  # random trials before the model is trusted (fewer with transfer records)
    exhaustive_limit: int = 20_000  # score the whole space when it is at most this big
    chains: int = 48  # simulated-annealing chains
    steps: int = 80
    temperature: float = 1.0


class ModelSearch(SearchStrategy):
    """XGBoost-ranked search: exhaustive scoring or simulated annealing, plus exploration."""

    name = "xgb"

    def __init__(self, space: Space, seed: int = 0, config: ModelSearchConfig | None = None,
                 xgb: XGBConfig | None = None, transfer: Sequence[Sample] = ()):
        super().__init__(space, seed)
        self.cfg = config or ModelSearchConfig()
        self.model = XGBCostModel(FeatureExtractor(space), xgb or XGBConfig(seed=seed))
        self.samples: list[Sample] = []
        self.transfer = list(transfer)
        if self.transfer:
            self.model.add_transfer(self.transfer)
            self.model.fit([])
        self._pool: list[Config] | None = None

    def observe(self, results: Sequence[tuple[Mapping[str, Any], float]]) -> None:
        super().observe(results)
        self.samples += [Sample(wl=self.space.wl, config=dict(c), cost=cost) for c, cost in results]
        if any(math.isfinite(s.cost) for s in self.samples):
            self.model.fit(self.samples)

    def next_batch(self, n: int) -> list[Config]:
        warm = self.cfg.warmup // 2 if self.transfer else self.cfg.warmup
        if not self.model.trained or len(self.samples) < warm:
            return self._random_unmeasured(n, set())
        n_explore = int(round(n * self.cfg.explore))
        picked = self._best_predicted(n - n_explore)
        chosen = {self.space.id(c) for c in picked}
        picked += self._random_unmeasured(n - len(picked), chosen)
        return picked

    def _candidates(self) -> list[Config] | None:
        """The whole check-valid space when small enough to score at once."""
        if self._pool is None and self.space.size <= self.cfg.exhaustive_limit:
            self._pool = [c for c in self.space if self.is_valid(c)]
        return self._pool

    def _best_predicted(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        pool = self._candidates()
        if pool is not None:
            todo = [c for c in pool if self.space.id(c) not in self.measured]
            if not todo:
                self.exhausted = True
                return []
            scores = self.model.predict(todo)
            order = np.argsort(-scores, kind="stable")
            return [todo[i] for i in order[:n]]
        return self._anneal(n)

    def _anneal(self, n: int) -> list[Config]:
        """Simulated annealing over predicted scores; keeps the n best unmeasured points seen."""
        valid = sorted((s for s in self.samples if math.isfinite(s.cost)), key=lambda s: s.cost)
        starts = [dict(s.config) for s in valid[: self.cfg.chains // 2]]
        while len(starts) < self.cfg.chains:
            starts.append(self.space.random(self.rng))
        cur = starts
        cur_s = self.model.predict(cur)
        heap: list[tuple[float, int, str, Config]] = []
        seen: set[str] = set()
        tick = 0

        def offer(c: Config, s: float) -> None:
            nonlocal tick
            cid = self.space.id(c)
            if cid in seen or cid in self.measured:
                return
            seen.add(cid)
            if not self.is_valid(c):
                return
            tick += 1
            item = (float(s), tick, cid, c)
            if len(heap) < n:
                heapq.heappush(heap, item)
            elif s > heap[0][0]:
                heapq.heapreplace(heap, item)

        for c, s in zip(cur, cur_s):
            offer(c, s)
        spread = float(np.std(cur_s)) or 1.0
        for step in range(self.cfg.steps):
            temp = self.cfg.temperature * (1 - step / self.cfg.steps) * spread + 1e-9
            nxt = [self.space.mutate(c, self.rng) for c in cur]
            nxt_s = self.model.predict(nxt)
            for i, (c, s) in enumerate(zip(nxt, nxt_s)):
                offer(c, s)
                if s >= cur_s[i] or self.rng.random() < math.exp((s - cur_s[i]) / temp):
                    cur[i], cur_s[i] = c, s
        return [c for _, _, _, c in sorted(heap, reverse=True)]


def make_strategy(tuner: str, space: Space, seed: int = 0, transfer: Sequence[Sample] = ()) -> SearchStrategy:
    """`xgb` | `random` | `grid` -> a strategy for `space`."""
    from ..errors import OpcError
    if tuner == "xgb":
        return ModelSearch(space, seed, transfer=transfer)
    if tuner == "random":
        return RandomSearch(space, seed)
    if tuner == "grid":
        return GridSearch(space, seed)
    raise OpcError("unknown tuner", arg="--tuner", value=tuner, expected=" | ".join(TUNERS))
