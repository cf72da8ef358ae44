"""The tuning loop on a fake deterministic backend: resume, failures, early stop, xgb vs random."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from opcompiler.errors import OpcError
from opcompiler.tune.records import RecordLog, config_id
from opcompiler.tune.search import ModelSearch
from opcompiler.tune.space import Space
from opcompiler.tune.tuner import TuneOptions, Tuner
from opcompiler.cli.tune import no_valid_message

from . import fakes


def _tune(tmp_path: Path, name: str = "log", target=None, wl=None, **kw):
    opts = dict(trials=24, tuner="xgb", workers=0, progress=False, early_stop=0, backend_factory=fakes.FACTORY,
                log=tmp_path / f"{name}.jsonl")
    opts.update(kw)
    return Tuner(wl or fakes.small_matmul(), target or fakes.fake_target(), TuneOptions(**opts)).run()


def _optimum() -> int:
    wl, t = fakes.small_matmul(), fakes.fake_target()
    sp = Space.of(wl, t, fakes.FakeMatmulTemplate())
    return min(fakes.fake_cycles(wl, c) for c in sp
               if sp.why_invalid(c) is None and not (c["tile_m"] * c["tile_n"] > 512 and c["unroll"] == 8))


@pytest.mark.parametrize("tuner", ["xgb", "random", "grid"])
def test_every_tuner_measures_distinct_valid_configs_and_verifies_best(tmp_path: Path, tuner: str) -> None:
    res = _tune(tmp_path, tuner=tuner, trials=24)
    recs = [r for r in RecordLog(res.log).read() if r.tuner != "verify"]
    assert len(recs) == res.trials == res.new_trials == 24
    assert len({config_id(r.config) for r in recs}) == 24
    assert recs[0].config == fakes.FakeMatmulTemplate().default(res.workload, res.target)  # default measured first
    assert res.best is not None and res.best.verified
    assert res.best.cycles == fakes.fake_cycles(res.workload, res.best.config) == min(r.cycles for r in recs if r.valid)
    assert res.speedup == pytest.approx(res.default.cycles / res.best.cycles)


def test_resume_measures_nothing_twice(tmp_path: Path) -> None:
    first = _tune(tmp_path, trials=16)
    again = _tune(tmp_path, trials=16)
    assert again.new_trials == 0 and again.best == first.best
    more = _tune(tmp_path, trials=28)
    assert more.new_trials == 12 and more.trials == 28
    ids = [config_id(r.config) for r in RecordLog(more.log).read() if r.tuner != "verify"]
    assert len(ids) == len(set(ids)) == 28
    assert more.best.cycles <= first.best.cycles


def test_xgb_beats_random_on_seeded_problem(tmp_path: Path) -> None:
    """At 48 trials over 2592 configs, the model-guided search lands near the exhaustive optimum;
    random search stays at least 15 % above it on average (seeds 0-2, deterministic backend)."""
    opt = _optimum()
    ratio = {}
    for tuner in ("xgb", "random"):
        ratio[tuner] = statistics.mean(_tune(tmp_path, f"{tuner}{s}", tuner=tuner, trials=48, seed=s).best.cycles / opt
                                       for s in range(3))
    assert ratio["xgb"] <= 1.03
    assert ratio["random"] >= ratio["xgb"] * 1.15


def test_early_stop_after_patience(tmp_path: Path) -> None:
    res = _tune(tmp_path, tuner="grid", trials=400, early_stop=10)
    assert res.new_trials < 400 and "early stop" in res.stop_reason
    assert res.history[-10:] and min(res.history[-10:]) >= res.best_measured.cycles


def test_invalid_storm_ends_with_clear_message(tmp_path: Path) -> None:
    res = _tune(tmp_path, target=fakes.fake_target(fail="all-invalid"), trials=12, early_stop=0)
    assert res.best is None and res.best_measured is None
    assert res.invalid == res.trials == 12
    msg = no_valid_message(res)
    assert "all 12 candidates" in msg and "12x invalid" in msg and str(res.log) in msg


def test_build_only_failures_recorded_invalid(tmp_path: Path) -> None:
    res = _tune(tmp_path, tuner="grid", trials=2592, early_stop=0, target=fakes.fake_target(capacity=10**6))
    recs = RecordLog(res.log).read()
    bad = [r for r in recs if r.status == "invalid"]
    assert bad and all(r.config["tile_m"] * r.config["tile_n"] > 512 and r.config["unroll"] == 8 for r in bad)
    assert all("registers" in r.error for r in bad)


def test_template_check_rejects_before_measuring(tmp_path: Path) -> None:
    t = fakes.fake_target(capacity=600)  # many tile combinations overflow the 600 B level
    res = _tune(tmp_path, tuner="random", target=t, trials=30)
    sp = Space.of(res.workload, t, fakes.FakeMatmulTemplate())
    assert res.rejected > 0
    assert all(sp.why_invalid(r.config) is None for r in RecordLog(res.log).read())


def test_transfer_records_warm_start_the_model(tmp_path: Path) -> None:
    from opcompiler.ops import workload
    other = workload("matmul", "m=32,k=32,n=16", dtype="float32")
    _tune(tmp_path, wl=other, trials=24)
    wl, t = fakes.small_matmul(), fakes.fake_target()
    tuner = Tuner(wl, t, TuneOptions(trials=8, workers=0, progress=False, backend_factory=fakes.FACTORY,
                                     log=tmp_path / "log.jsonl"))
    samples = tuner._transfer(RecordLog(tmp_path / "log.jsonl").read())
    assert len(samples) == 25  # the other shape's 24 measurements and its verification line
    search = ModelSearch(Space.of(wl, t, fakes.FakeMatmulTemplate()), transfer=samples)
    assert search.model.trained  # ranked before this shape's first measurement


def test_options_reject_bad_values() -> None:
    with pytest.raises(OpcError, match="--trials"):
        TuneOptions(trials=0)
    with pytest.raises(OpcError, match="--tuner=.*xgb"):
        TuneOptions(tuner="genetic")


# -- failures inside worker processes (each spawns a worker: a few seconds) ------------------


def test_crashing_candidates_recorded_and_tuning_continues(tmp_path: Path) -> None:
    res = _tune(tmp_path, tuner="grid", trials=9, workers=2, target=fakes.fake_target(fail="crash", fail_unroll=2),
                verify=False)
    recs = RecordLog(res.log).read()
    crashed = [r for r in recs if r.status == "crash"]
    assert len(crashed) == 2 and all(r.config["unroll"] == 2 for r in crashed)
    assert "worker died" in crashed[0].error
    assert sum(r.valid for r in recs) == 7 and res.best_measured is not None


def test_hanging_candidate_times_out_and_wrong_one_never_becomes_best(tmp_path: Path) -> None:
    res = _tune(tmp_path, tuner="grid", trials=5, workers=1, timeout=1.5,
                target=fakes.fake_target(fail="hang", fail_unroll=8))
    recs = RecordLog(res.log).read()
    assert [r.status for r in recs if r.config["unroll"] == 8] == ["timeout"]
    assert res.best is not None

    # unroll=4 configs compute wrong values: the fastest ones are, so verification must skip them
    res = _tune(tmp_path, "wrong", tuner="xgb", trials=40, workers=1, target=fakes.fake_target(fail="wrong", fail_unroll=4))
    wrong = [r for r in RecordLog(res.log).read() if r.status == "wrong"]
    assert wrong and all(r.config["unroll"] == 4 and "wrong result" in r.error for r in wrong)
    assert res.best is not None and res.best.config["unroll"] != 4 and res.best.verified
