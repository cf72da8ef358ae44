"""Property-based tests: every operator in the catalogue, on cpu, ascend-sim and dsp-sim, on valid
shapes drawn to stress the templates (sizes of 1, odd sizes, sizes just past a tile or fractal
boundary, every layout and dtype the op and the target take) and configs drawn knob by knob from
the template's own space (`tests/props/cases.py`).

Each case runs with values checked against the op's numpy reference at the dtype's stated
tolerance (`opcompiler.verify.TOLERANCE`). It must end one of two ways:
  * correct values; or
  * a one-line refusal (the CLI's exit 2), and only where refusing is right: the drawn config
    does not fit, or the target's limit is declared in `opcompiler/ops/limits.py` (what
    `opcompiler ops` shows). A declared limit the target in fact runs is stale and fails too.
A traceback, an internal error or a wrong value fails, and hypothesis shrinks it to a minimal case
whose reproducing command is in the message.

The CI profile is seeded and bounded: OPC_PROPS_EXAMPLES cases per (op, target), 4 unless set
(`benchmarks/fuzz.py` runs the long profile)."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from opcompiler.ops.index import OPS

from .cases import TARGETS, Case, case, problem, run_case

CI = settings(max_examples=int(os.environ.get("OPC_PROPS_EXAMPLES", "4")), derandomize=True, deadline=None,
              database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_valid_case_runs_correctly_or_is_refused_for_a_declared_reason(op, target):
    @CI
    @given(case(op, target))
    def prop(c: Case) -> None:
        why = problem(c, run_case(c))
        assert why is None, why
    prop()
