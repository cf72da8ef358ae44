"""Shared fixtures for the ascend-sim tests: one backend per target, the published figures."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.target import load_target, with_figures
from opcompiler.calibration import fit_rows


@pytest.fixture(scope="session")
def backend():
    return get_backend(load_target("ascend-sim"))


# The four figures targets/ascend910-sim.toml had before it took the CANN platform file's rates
# (Ascend910A.ini [AICoreMemoryRates]: GM reads 110 B/cycle per core, L1 -> L0B 256 B/cycle, L2
# 110 x 32 cores). The retired emitters' cycles the parity tests pin (test_tir_move, _reduce,
# _conv, _conv2, _lowering) were measured under these; the emitters are gone, so those tests
# compare the TVM route against them under the same figures, like with like.
PINNED_FIGURES = {
    "extra.paths.GM_L1.bytes_per_cycle": 128,
    "extra.paths.GM_UB.bytes_per_cycle": 128,
    "extra.paths.L1_L0B.bytes_per_cycle": 512,
    "memory.L2.bandwidth_gbps": 4096.0,
}


def pinned_target():
    """ascend-sim with the figures the retired emitters' pinned cycles were measured under."""
    return with_figures(load_target("ascend-sim"), PINNED_FIGURES, "pinned")


@pytest.fixture(scope="session")
def pinned_backend():
    return get_backend(pinned_target())


@pytest.fixture(scope="session")
def published() -> dict:
    return {row["what"]: row for row in fit_rows("ascend910")}  # calibration checks read fit figures only


def measure(backend, op: str, shape=None, *, preset=None, batch=None, dtype="float16", config=None):
    wl = workload(op, shape, preset=preset, batch=batch, dtype=dtype)
    return backend.measure(backend.build(wl, config))
