"""Shared exports for the export tests: built once per session, small shapes (seconds, not minutes)."""
from __future__ import annotations

import pytest

from opcompiler.export import export
from opcompiler.ops import workload
from opcompiler.target import load_target

# ResNet-like conv+bn+relu, shrunk so a build takes about a second.
CONV_SHAPE = "n=2,c=8,h=10,w=10,k=16,r=3,s=3,pad=1"


@pytest.fixture(scope="session")
def cpu_conv_folder(tmp_path_factory):
    """conv2d_bn_relu for the cpu target, with every binding (torch, onnx, lib)."""
    out = tmp_path_factory.mktemp("export") / "conv_bn_relu_cpu"
    wl = workload("conv2d_bn_relu", CONV_SHAPE)
    export(wl, load_target("cpu"), "default", to="torch,onnx,lib", out=out, progress=False)
    return out
