"""Space, features, the XGBoost ranking model and the annealing search, on the fake machine."""
from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from opcompiler.tune.cost_model import Sample, XGBCostModel
from opcompiler.tune.search import ModelSearch, ModelSearchConfig, RandomSearch, SearchStrategy
from opcompiler.tune.space import FeatureExtractor, Space

from . import fakes


@pytest.fixture(scope="module")
def space() -> Space:
    return Space.of(fakes.small_matmul(), fakes.fake_target(), fakes.FakeMatmulTemplate())


def _cost(c: dict) -> float:
    if c["tile_m"] * c["tile_n"] > 512 and c["unroll"] == 8:
        return math.inf
    return float(fakes.fake_cycles(fakes.small_matmul(), c))


def test_mutate_changes_exactly_one_knob_within_range(space: Space) -> None:
    rng = random.Random(0)
    c = space.default()
    for _ in range(200):
        m = space.mutate(c, rng)
        diff = [k.name for k in space.knobs if m[k.name] != c[k.name]]
        assert len(diff) == 1 and all(m[k.name] in k.values for k in space.knobs)
        c = m


def test_features_fixed_width_with_one_hot_and_derived(space: Space) -> None:
    fx = FeatureExtractor(space)
    rows = fx.matrix([space.default(), space.random(random.Random(1))])
    # 4 numeric knobs + 3 one-hot (order) + 5 numeric shape params + 2 template features
    assert rows.shape == (2, 4 + 3 + 5 + 2)
    assert rows[0][:3].tolist() == [2.0, 2.0, 2.0]  # log2 of tile 4
    assert rows[0][3:6].tolist() == [1.0, 0.0, 0.0]  # order = mnk
    assert rows[0][-1] == 4.0 * (16 + 16 + 16)  # tile_bytes of the default (derived names sorted)


def _kendall(a: np.ndarray, b: np.ndarray) -> float:
    n, s = len(a), 0
    for i in range(n):
        s += np.sum(np.sign(a[i] - a[i + 1:]) * np.sign(b[i] - b[i + 1:]))
    return s / (n * (n - 1) / 2)


def test_ranking_model_orders_unseen_configs(space: Space) -> None:
    rng = random.Random(0)
    configs = [c for c in (space.random(rng) for _ in range(600)) if math.isfinite(_cost(c))]
    train, test = configs[:200], configs[200:400]
    model = XGBCostModel(FeatureExtractor(space))
    model.fit([Sample(wl=space.wl, config=c, cost=_cost(c)) for c in train])
    scores = model.predict(test)
    tau = _kendall(scores, -np.array([_cost(c) for c in test]))
    assert tau > 0.6  # higher score = faster for most pairs; a random model gives about 0


def _run(strategy: SearchStrategy, trials: int) -> float:
    best = math.inf
    n = 0
    while n < trials:
        batch = strategy.next_batch(min(8, trials - n))
        costs = [_cost(c) for c in batch]
        strategy.observe(list(zip(batch, costs)))
        best = min([best, *costs])
        n += len(batch)
    return best


def test_annealing_over_predictions_beats_random(space: Space) -> None:
    """Force the simulated-annealing path (no exhaustive scoring): after 48 trials it must be
    within 5 % of the optimum on average over 3 seeds, random search at least 15 % worse."""
    opt = min(_cost(c) for c in space if space.why_invalid(c) is None)
    sa = statistics.mean(_run(ModelSearch(space, s, ModelSearchConfig(exhaustive_limit=0)), 48) / opt
                         for s in range(3))
    rnd = statistics.mean(_run(RandomSearch(space, s), 48) / opt for s in range(3))
    assert sa <= 1.05 and rnd >= sa * 1.15
