"""CUDA exports: the library and the CUDA source are written on a host with no GPU (nvcc is enough);
verification is marked skipped there, and loading names the missing device. With a GPU the
export verifies against the reference like any other."""
from __future__ import annotations

import json
import shutil

import pytest

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.export import export, load
from opcompiler.ops import workload
from opcompiler.target import load_target


@pytest.fixture(scope="module")
def cuda_target():
    t = load_target("cuda")
    try:
        get_backend(t)
    except OpcError:
        pytest.skip("the cuda backend is not in this build")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is needed to compile CUDA kernels")
    return t


def test_cuda_export_writes_library_and_source(tmp_path, cuda_target):
    import tvm
    wl = workload("conv2d_bn_relu", "n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1")
    m = export(wl, cuda_target, to="lib", out=tmp_path, progress=False)
    assert m["artifact"]["kind"] == "tvm-library" and (tmp_path / m["artifact"]["file"]).stat().st_size > 0
    assert "__global__" in (tmp_path / m["artifact"]["source"]).read_text()
    assert json.loads((tmp_path / "manifest.json").read_text())["target"]["family"] == "cuda"
    if tvm.cuda(0).exist:
        assert m["verification"]["correct"] is True
        return
    assert m["verification"] == {"correct": None, "skipped": "no cuda device on the exporting host"}
    with pytest.raises(OpcError, match="the kernel is for a cuda device and none is present here"):
        load(tmp_path)
