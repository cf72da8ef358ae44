"""Fit and held-out figures stay apart: whatever sets or checks a simulator parameter reads only
`fit` rows, and every held-out row names its document and what was timed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from opcompiler.calibration import CHIPS, fit_rows, held_out_rows, published

ROOT = Path(__file__).resolve().parents[2]

# the code that fits or checks parameters against published figures
FIT_CODE = ("tests/ascend/conftest.py", "tests/ascend/test_calibration.py", "tests/dsp/test_paper.py",
            "benchmarks/sensitivity.py")


@pytest.mark.parametrize("chip", CHIPS)
def test_fit_rows_exclude_held_out_rows(chip):
    fit, held = fit_rows(chip), held_out_rows(chip)
    assert fit and all(r["use"] == "fit" for r in fit)
    assert all(r["use"] == "held-out" for r in held)
    assert not {r["what"] for r in fit} & {r["what"] for r in held}
    assert len(fit) + len(held) == len(published(chip))


@pytest.mark.parametrize("path", FIT_CODE)
def test_fit_code_reads_only_fit_rows(path):
    """The calibration tests and the sensitivity benchmark import only the fit accessors (and
    `figure` only with use="fit"), never the held-out ones or the unfiltered `published`."""
    src = (ROOT / path).read_text()
    assert "held_out_rows" not in src and "held-out" not in src, path
    imported = set()
    for m in re.finditer(r"from opcompiler\.calibration import ([\w, ]+)", src):
        imported |= {n.strip().split(" as ")[0] for n in m.group(1).split(",")}
    assert imported <= {"fit_rows", "figure", "CHIPS"}, (path, imported)
    for call in re.findall(r"\bfigure\(([^)]*)\)", src):
        assert 'use="fit"' in call, (path, call)


@pytest.mark.parametrize("chip", CHIPS)
def test_held_out_rows_cite_document_and_workload(chip):
    for row in held_out_rows(chip):
        assert row.get("source") and row.get("where"), row["what"]
        if "id" in row:  # a simulated case: the workload and what exactly was timed
            assert row.get("timed") and row.get("op") and row.get("shape") and row.get("dtype"), row["id"]
            if "compare" in row:  # a best case over an unpublished layer set (benchmarks/fidelity.py)
                assert row["compare"] in ("max", "range", "upper-bound"), row["id"]
                assert "percent_of_peak" in row or len(row.get("percent_of_peak_range", ())) == 2, row["id"]
                assert row.get("source") and not row.get("seed"), row["id"]  # from outside the seeds
            else:
                assert any(k in row for k in ("ms", "value_tflops", "value_gflops")), row["id"]
