"""The simulators against the held-out published figures (benchmarks/fidelity.py), loosely, so
CI notices when a change moves them further from the chips. docs/fidelity.md has
the table; the bounds here sit a few points above today's errors, not at the goal (15 %)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity.py"

# mean absolute error today (docs/fidelity.md): ascend-sim 15.6 %, dsp-sim 57.2 %
MAE_BOUND = {"ascend910": 20.0, "ft_m7032": 62.0}


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("fidelity_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def results(fidelity):
    return fidelity.run()


@pytest.fixture(scope="module")
def bounds(fidelity):
    return {b.id: b for b in fidelity.run_best_cases()}


def test_every_simulatable_held_out_row_is_run(fidelity, results, bounds):
    from opcompiler.calibration import held_out_rows
    ids = {r.id for r in results} | set(bounds)
    for chip in fidelity.CHIPS:
        for row in held_out_rows(chip):
            if "id" in row:
                assert row["id"] in ids, row["id"]
            else:  # rows that cannot be simulated say why
                assert any(row["what"].startswith(k) for k in fidelity.NOT_SIMULATED), row["what"]


@pytest.mark.parametrize("chip", sorted(MAE_BOUND))
def test_mean_absolute_error_does_not_grow(fidelity, results, chip):
    assert fidelity.mae(results, chip) <= MAE_BOUND[chip]


def test_cases_off_by_more_than_2x_have_a_written_cause(fidelity, results):
    for r in results:
        assert r.factor < 5, (r.id, r.simulated, r.published)
        if r.factor > 2:
            assert r.id in fidelity.CAUSES, r.id


def test_conv1_gap_is_the_per_call_host_copies(fidelity):
    """docs/fidelity.md: CONV1_POLICY's 0.8 ms gap is the 8 per-core W copy calls; the candidate
    replication model, fitted to CONV3_RES alone, lands on the published 1.05 ms and keeps the
    fit figures."""
    from opcompiler.backend import get_backend
    from opcompiler.ops import workload
    t, gbps = fidelity.candidate_target()
    assert 0.5 < gbps < 1.0
    shipped = {r.id: r for r in fidelity.run({"seed004-t3-conv1_policy-shared"})}["seed004-t3-conv1_policy-shared"]
    cand = fidelity.run({"seed004-t3-conv1_policy-shared"}, t)[0]
    assert shipped.simulated - cand.simulated == pytest.approx(0.8, abs=0.02)
    assert cand.simulated == pytest.approx(1.05, rel=0.05)
    be = get_backend(t)
    r = be.measure(be.build(workload("conv2d", preset="minigo.conv3_res", batch=96), "paper"))
    assert r.seconds * 1e3 == pytest.approx(4.02, rel=0.01)


def test_best_case_rows_have_causes_and_loose_bounds(fidelity, bounds):
    """The best-case rows (maxima or ranges from abstracts, set against the simulator's best over
    ResNet-50's convolutions): each has a written cause, none is off by 5x, the one-sided check
    holds, and today's figures stay near (docs/fidelity.md: +41 %; -55 % / -1 %; 68 >= 42.9 %)."""
    assert set(bounds) == {"xu2024-direct-1core-max", "xu2024-direct-8core-scaling", "wang2023-ftmeconv-max"}
    for b in bounds.values():
        assert b.id in fidelity.BEST_CASE_CAUSES, b.id
        assert b.factor < 5, (b.id, b.simulated, b.published)
        assert b.ok, (b.id, b.simulated, b.published)
    one = bounds["xu2024-direct-1core-max"]
    assert 0 < one.errors[0] <= 50  # optimistic by about 1.4x, not more
    lo, hi = bounds["xu2024-direct-8core-scaling"].errors
    assert abs(hi) <= 10 and -65 <= lo <= 0
    assert bounds["xu2024-direct-8core-scaling"].simulated[1] <= 100  # never superlinear


def test_aibench_readings_bracket_the_published_figures(fidelity):
    """docs/fidelity.md: only the per-busy-cycle reading fits both AIBench figures; per whole loop
    the vector figure is 5x off (the loop is GM-bound), so the shipped reading stays."""
    got = {name: err for name, _, err in fidelity.aibench_readings()}
    assert abs(got["cube TFLOPS, 32 cores, per busy cube cycle"]) < 20
    assert abs(got["vector GFLOPS, 32 cores, per busy vector cycle"]) < 20
    assert got["vector GFLOPS, 32 cores, per whole-loop cycle"] < -70
    # per whole loop the cube is L1 -> L0B bound (256 B/cycle, Ascend910A.ini): below the figure
    assert -20 < got["cube TFLOPS, 32 cores, per whole-loop cycle"] < 0
