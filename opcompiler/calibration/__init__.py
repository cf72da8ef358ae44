"""Published measurements the simulators are checked against, shipped with the package.

`published.json` holds the seeds' figures on real chips: each row names its seed document
(`seed`) and the section, table or figure it comes from (`where`), and whether simulator
parameters were fitted to it (`use`: `fit`) or not (`held-out`). Tests and benchmarks read it
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
            if not row.get("seed") or not row.get("where") or row.get("use") not in USES:
                raise ValueError(f"published.json: row {row.get('what')!r} of {chip} lacks seed/where/use")
    return data


def published(chip: str, use: str | None = None) -> list[dict[str, Any]]:
    """Every figure of `chip` ('ascend910' or 'ft_m7032'), optionally only `fit` or `held-out` ones."""
    if chip not in CHIPS:
        raise KeyError(f"unknown chip {chip!r}; expected one of {', '.join(CHIPS)}")
    return [dict(r) for r in _data()[chip] if use is None or r["use"] == use]


def figure(chip: str, what_prefix: str) -> dict[str, Any]:
    """The one row of `chip` whose `what` starts with `what_prefix` (KeyError when none)."""
    for row in published(chip):
        if row["what"].startswith(what_prefix):
            return row
    raise KeyError(f"no published figure of {chip} starts with {what_prefix!r}")
