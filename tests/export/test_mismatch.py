"""Calling with a shape, dtype or layout the kernel was not built for raises, naming expected and got;
nothing silently reshapes, casts or transposes."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.errors import OpcError
from opcompiler.export import KernelInputError, load
from opcompiler.ops import get_op, workload

CONV_SHAPE = "n=2,c=8,h=10,w=10,k=16,r=3,s=3,pad=1"  # as conftest.py


@pytest.fixture(scope="module")
def kernel_and_inputs(cpu_conv_folder):
    return load(cpu_conv_folder), get_op("conv2d_bn_relu").make_inputs(workload("conv2d_bn_relu", CONV_SHAPE))


@pytest.mark.parametrize("change, needle", [
    (lambda a: [a[0].reshape(2, 8, 100)] + a[1:],
     r"input 'data' \(NCHW\): expected float32\[2, 8, 10, 10\], got float32\[2, 8, 100\]"),
    (lambda a: [a[0].astype("float16")] + a[1:], r"expected float32\[2, 8, 10, 10\], got float16\[2, 8, 10, 10\]"),
    (lambda a: a[:2] + [a[2][:8]] + a[3:], r"input 'scale' \(C\): expected float32\[16\], got float32\[8\]"),
    (lambda a: a + [a[3]], r"expected 4 inputs \(data, weight, scale, shift\), got 5"),
    # NHWC data viewed as NCHW: right shape, wrong layout in memory
    (lambda a: [np.ascontiguousarray(a[0].transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)] + a[1:],
     r"input 'data': expected a dense row-major NCHW float32\[2, 8, 10, 10\] tensor, got a strided view"),
])
def test_mismatch_names_expected_and_got(kernel_and_inputs, change, needle):
    k, ins = kernel_and_inputs
    with pytest.raises(KernelInputError, match=needle):
        k(*change(list(ins)))


def test_declared_layout_must_match(kernel_and_inputs):
    k, ins = kernel_and_inputs
    with pytest.raises(KernelInputError, match="layout: expected NCHW, got NHWC"):
        k(*ins, layout="NHWC")
    assert k(*ins, layout="NCHW").shape == (2, 16, 10, 10)


def test_input_error_is_a_bad_input_error(kernel_and_inputs):
    """The CLI and callers treat it as bad input (exit 2), not as our failure."""
    assert issubclass(KernelInputError, OpcError)


def test_unaligned_input_is_copied_not_rejected(kernel_and_inputs):
    k, ins = kernel_and_inputs
    raw = np.empty(ins[0].size + 1, dtype="float32")
    start = 1 if raw.ctypes.data % 64 == 0 else 0
    x = raw[start:start + ins[0].size].reshape(ins[0].shape)
    x[...] = ins[0]
    np.testing.assert_array_equal(k(x, *ins[1:]), k(*ins))


def test_not_an_export_folder(tmp_path):
    with pytest.raises(OpcError, match="no manifest.json here"):
        load(tmp_path)
