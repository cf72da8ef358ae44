"""Small ONNX models built once per session, and a CPU backend that times each kernel once
(the figures come from benchmarks/graph_compare.py, not from tests)."""
from __future__ import annotations

import pytest

from opcompiler.backend.cpu import CpuBackend
from opcompiler.graph.models import write

SMALL = {
    "resnet_block": {"c": 8, "hw": 8},
    "resnet50_stage": {"cin": 16, "width": 8, "hw": 8, "blocks": 2},
    "minigo": {"res_blocks": 1},
}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    out = {name: write(name, d / f"{name}.onnx", **kw) for name, kw in SMALL.items()}
    for opset in (9, 11, 13, 21):
        out[f"op_zoo{opset}"] = write("op_zoo", d / f"op_zoo{opset}.onnx", opset=opset)
    return out


@pytest.fixture(autouse=True)
def fast_cpu_timing(monkeypatch):
    monkeypatch.setattr(CpuBackend, "repeats", 1)
    monkeypatch.setattr(CpuBackend, "min_repeat_ms", 0)
