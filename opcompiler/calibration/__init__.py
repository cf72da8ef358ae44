"""Published measurements the simulators are checked against, shipped with the package.

`published.json` holds figures measured on real chips: each row names its document (`seed`
for a seed document, `source` for any other) and the section, table or figure it comes from
(`where`), and whether simulator parameters were fitted to it (`use`: `fit`) or not
(`held-out`). Anything that sets or checks a parameter (the calibration tests, benchmarks/sensitivity.py)
reads `fit_rows` or `figure(..., use="fit")`; held-out rows are for benchmarks/fidelity.py
and its test (tests/calibration/test_fidelity.py checks both). Tests and benchmarks read it
from here, so they behave the same from a checkout, a wheel, or any directory.

    >>> rows = published("ft_m7032")
    >>> row = figure("ft_m7032", "CONV3_RES forward, 8 DSP cores, batch 96")
    >>> row["percent_of_peak"], row["seed"], row["where"]
    (23.03, '004', 'Table 2, Table 3')
"""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

CHIPS = ("ascend910", "ft_m7032")
USES = ("fit", "held-out")


@cache
def _data() -> dict[str, Any]:
    text = resources.files(__name__).joinpath("published.json").read_text()  # a missing file raises: never skip
    data = json.loads(text)
    for chip in CHIPS:
        for row in data[chip]:
            if not (row.get("seed") or row.get("source")) or not row.get("where") or row.get("use") not in USES:
                raise ValueError(f"published.json: row {row.get('what')!r} of {chip} lacks seed or source/where/use")
    return data


def published(chip: str, use: str | None = None) -> list[dict[str, Any]]:
    """Every figure of `chip` ('ascend910' or 'ft_m7032'), optionally only `fit` or `held-out` ones."""
    if chip not in CHIPS:
        raise KeyError(f"unknown chip {chip!r}; expected one of {', '.join(CHIPS)}")
    return [dict(r) for r in _data()[chip] if use is None or r["use"] == use]


def fit_rows(chip: str) -> list[dict[str, Any]]:
    """The figures simulator parameters may be fitted to (`use`: `fit`). Anything that sets or
    checks a parameter against published figures reads these, never `held_out_rows`."""
    return published(chip, "fit")


def held_out_rows(chip: str) -> list[dict[str, Any]]:
    """The figures no parameter was set from (`use`: `held-out`): only `benchmarks/fidelity.py`
    and its test read them, to measure the simulators' error on data they were not fitted to."""
    return published(chip, "held-out")


def figure(chip: str, what_prefix: str, use: str | None = None) -> dict[str, Any]:
    """The one row of `chip` (optionally only `fit` or `held-out` ones) whose `what` starts with
    `what_prefix` (KeyError when none)."""
    for row in published(chip, use):
        if row["what"].startswith(what_prefix):
            return row
    raise KeyError(f"no published figure of {chip} starts with {what_prefix!r}")
