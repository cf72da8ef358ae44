"""benchmarks/seed000_ops.py (seed 000's single-operator study) on a tiny grid: the regression,
the HBM-fit count, utilisation, the extrapolation of large convs, the cache and the plot."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "seed000_ops.py"

TINY = {
    "fc": [{"batch": 16, "input": 64, "output": 64}, {"batch": 32, "input": 128, "output": 64}],
    "conv": [{"batch": 2, "input": 14, "in_channels": 16, "out_channels": 16, "filter": 3},
             {"batch": 2, "input": 8, "in_channels": 16, "out_channels": 32, "filter": 1}],
    "rnn": [{"hidden": 16, "batch": 16, "seqlen": 4}, {"hidden": 16, "batch": 16, "seqlen": 2}],  # one kernel set
}


@pytest.fixture(scope="module")
def s0():
    spec = importlib.util.spec_from_file_location("seed000_ops_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_run(s0, tmp_path_factory):
    out = tmp_path_factory.mktemp("seed000")
    return s0.run(["fc", "conv", "rnn"], quick=False, out_dir=str(out), jobs=1, plot=True, points=TINY), out


def test_grids_are_the_papers_sizes(s0):
    assert [len(s0.grid(k)) for k in ("conv", "fc", "rnn")] == [243, 192, 144]
    assert s0.GRIDS["conv"]["batch"] == (128, 256, 512) and s0.GRIDS["conv"]["filter"] == (1, 3, 5)
    for kind, g in s0.GRIDS.items():
        for name, values in g.items():
            if name != "filter":
                assert all(v % 8 == 0 for v in values), (kind, name)


def test_quick_subset_is_stratified(s0):
    pts = s0.stratified(s0.grid("conv"), 36)
    assert len({s0.key_of("conv", p) for p in pts}) == 36
    for name, levels in s0.GRIDS["conv"].items():
        counts = [sum(p[name] == v for p in pts) for v in levels]
        assert max(counts) - min(counts) <= 1, (name, counts)


def test_regression_recovers_signs(s0):
    rng = np.random.default_rng(0)
    a, b, c = rng.uniform(1, 100, 60), rng.uniform(1, 1000, 60), rng.uniform(1, 10, 60)
    y = 3.0 * a - 0.5 * b + 0.0 * c + rng.normal(0, 1, 60)
    w = s0.regression({"a": a, "b": b, "c": c}, y)
    assert w["a"] > 0 and w["b"] < 0
    assert abs(w["c"]) < 0.1 * min(abs(w["a"]), abs(w["b"]))
    assert s0.negligible(w) == ["c"]  # its sign is noise, and the report says so
    # standardised: a weight is the change per standard deviation
    assert w["a"] == pytest.approx(3.0 * a.std(), rel=0.05)
    assert s0.regression({"a": a, "k": np.full(60, 7.0)}, y)["k"] == 0.0  # a constant column


def test_hbm_fit_excludes_exactly_the_huge_point(s0):
    cap = s0.hbm_capacity()
    assert cap == 32 * 2**30  # the target file's HBM (seed 000: 32 GB)
    huge = {"m": 2**17, "k": 2**17, "n": 2**17, "trans_a": 0, "trans_b": 0}  # 3 x 32 GiB of fp16
    pts = [s0.op_params("fc", p) for p in TINY["fc"]] + [huge]
    n, out = s0.hbm_fit_count("fc", pts, cap)
    assert n == 2 and out == [huge]
    # the op-by-op RNN also holds its gate projection in GM: a point can fit fused and not unfused
    rnn = {"t": 4096, "b": 512, "i": 1024, "h": 1024}
    assert s0.fits("rnn", rnn, cap) and not s0.fits("rnn", rnn, cap, unfused=True)
    r = s0.measure_point(("fc", {"batch": 2**17, "input": 2**17, "output": 2**17}, {}))
    assert r["fits"] is False and "fused" not in r  # not measured


def test_tiny_grid_utilisation_and_outputs(s0, tiny_run):
    res, out = tiny_run
    pts = res["points"]
    assert len(pts) == 6 and all("error" not in r for r in pts), [r.get("error") for r in pts]
    peak = s0.cube_peak_flops()
    for r in pts:
        assert r["fits"]
        for series in ("fused", "unfused"):
            if series in r and r[series]:
                u = s0.utilisation(r[series], peak)
                assert 0.0 < u <= 1.0, (r["key"], series, u)
                assert r[series]["cycles"] > 0 and r[series]["offchip_bytes"] > 0
    summ = res["summary"]
    assert set(summ["ops"]) == {"fc", "conv", "rnn"}
    assert all(0 < summ["ops"][k]["fused"]["util_max"] <= 1 for k in summ["ops"])
    assert summ["grid_hbm_fit"]["conv"] < 243  # Table 2's largest points exceed 32 GB
    if s0.opbyop_steps() is not None:
        un = [r["unfused"] for r in pts if r["kind"] == "rnn"]
        assert all(u and u["launches"] > u["kernels"] for u in un)  # per-step kernels run t times
        # op by op is slower than the fused cell: every step's gates go through GM
        for r in pts:
            if r["kind"] == "rnn":
                assert r["unfused"]["cycles"] > r["fused"]["cycles"]
    assert (out / "roofline.png").stat().st_size > 1000
    cached = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["key"] for r in pts} <= {c["key"] for c in cached}


def test_cache_is_reused(s0, tiny_run, monkeypatch):
    res, out = tiny_run
    monkeypatch.setattr(s0, "measure_point", lambda task: pytest.fail("measured again"))
    again = s0.run(["fc"], quick=False, out_dir=str(out), jobs=1, plot=False, points={"fc": TINY["fc"]})
    assert [r["fused"]["cycles"] for r in again["points"]] == [r["fused"]["cycles"] for r in res["points"][:2]]


def test_conv_extrapolation_matches_direct(s0):
    p = {"n": 128, "c": 128, "h": 28, "w": 28, "k": 256, "r": 1, "s": 1, "stride": 1, "pad": 0, "layout": "NCHW"}
    ex = s0.measure_conv(p, direct_units=0)
    d = s0.measure_conv(p, force_direct=True)
    assert ex["method"].startswith("extrapolated") and d["method"] == "direct"
    assert ex["cycles"] == pytest.approx(d["cycles"], rel=0.02)
    assert ex["offchip_bytes"] == pytest.approx(d["offchip_bytes"], rel=0.02)


def test_output_shape_agrees_with_the_catalogue(s0):
    from opcompiler.ops import get_op, workload
    for kind, pts in TINY.items():
        op = s0.OP_OF[kind]
        for p in pts:
            wl = workload(op, s0.op_params(kind, p), dtype="float16")
            shape, dt = get_op(op).output_spec(wl)
            assert s0.output_shape(op, wl.p) == tuple(shape) and dt == "float16"
