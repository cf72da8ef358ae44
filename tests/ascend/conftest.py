"""Shared fixtures for the ascend-sim tests: one backend per target, the published figures."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.calibration import fit_rows


@pytest.fixture(scope="session")
def backend():
    return get_backend(load_target("ascend-sim"))


@pytest.fixture(scope="session")
def published() -> dict:
    return {row["what"]: row for row in fit_rows("ascend910")}  # calibration checks read fit figures only


def measure(backend, op: str, shape=None, *, preset=None, batch=None, dtype="float16", config=None):
    wl = workload(op, shape, preset=preset, batch=batch, dtype=dtype)
    return backend.measure(backend.build(wl, config))
