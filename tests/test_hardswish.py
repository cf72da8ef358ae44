"""HardSwish, x * relu6(x + 3) / 6, added as one step of the element-wise vocabulary
(`opcompiler/ops/steps.py`) and one catalogue entry (`opcompiler/ops/catalogue/elementwise.py`):
it runs on cpu, ascend-sim and dsp-sim through their existing element-wise templates, as its own
op and inside an ew_chain, and an ONNX HardSwish node translates to it (docs/adding_an_operator.md).

Checked against numpy in float64 on inputs in [-6, 6] (every branch: x < -3, -3..3, x > 3):
max abs error <= 1e-5 in float32, <= 1e-2 in float16 (|y| <= 6, float16's spacing at 4..8 is
2**-8 * 4 = 0.0039, four roundings)."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.api import build
from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.verify import compare

TOL = {"float32": 1e-5, "float16": 1e-2}


def hardswish64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x * np.clip(x + 3, 0, 6) / 6


def _inputs(wl, seed=0) -> list[np.ndarray]:
    """The op's inputs with x spread over [-6, 6] (the other operands as the catalogue makes them)."""
    ins = get_op(wl.op).make_inputs(wl, seed)
    rng = np.random.default_rng(seed + 1)
    ins[0] = rng.uniform(-6, 6, size=ins[0].shape).astype(wl.dtype)
    return ins


def _run(wl, target: str) -> tuple[list[np.ndarray], np.ndarray]:
    tgt = load_target(target)
    ins = _inputs(wl)
    res = get_backend(tgt).run(build(wl, tgt), ins)
    return ins, res.outputs[0]


def test_the_catalogue_entry():
    wl = workload("hardswish", "n=1,c=3,h=4,w=5")
    op = get_op("hardswish")
    assert op.family == "elemwise" and op.steps(wl) == [("hardswish", ())]
    assert [s[0] for s in op.inputs(wl)] == ["x"] and op.flops(wl) == 5 * 60
    x = np.linspace(-6, 6, 60, dtype=np.float32).reshape(1, 3, 4, 5)
    assert np.abs(op.reference(wl, [x]) - hardswish64(x)).max() <= TOL["float32"]
    from opcompiler.ops.index import OPS, current
    assert current() and "hardswish" in OPS  # the TVM-free index lists it (make_index was run)


@pytest.mark.parametrize("target,dtype,shape", [
    ("cpu", "float32", "n=2,c=3,h=5,w=7"),
    ("ascend-sim", "float16", "n=1,c=16,h=8,w=8"),
    ("ascend-sim", "float32", "n=2,c=3,h=5,w=7"),
    ("dsp-sim", "float32", "n=2,c=3,h=5,w=7"),
    ("dsp-sim", "float32", "n=1,c=8,h=4,w=4,layout=NHWC"),
])
def test_hardswish_runs_on_every_target(target, dtype, shape):
    wl = workload("hardswish", shape, dtype=dtype)
    ins, out = _run(wl, target)
    assert out.shape == ins[0].shape and out.dtype == np.dtype(dtype)
    assert np.abs(out.astype(np.float64) - hardswish64(ins[0])).max() <= TOL[dtype]
    assert compare(out, get_op("hardswish").reference(wl, ins))[0]


@pytest.mark.parametrize("target,dtype,layout", [
    ("ascend-sim", "float16", "NCHW"),  # a per-channel chain: the NC1HWC0 compute (elemwise.channel_schedule)
    ("dsp-sim", "float32", "NCHW"),  # planes, the parameters SM scalars
    ("dsp-sim", "float32", "NHWC"),  # pixels, the parameters AM vectors
])
def test_hardswish_inside_a_chain(target, dtype, layout):
    wl = workload("ew_chain", {"n": 1, "c": 20, "h": 3, "w": 5, "layout": layout, "chain": "bn;hardswish"},
                  dtype=dtype)
    ins, out = _run(wl, target)
    s = [1, -1, 1, 1] if layout == "NCHW" else [1, 1, 1, -1]
    want = hardswish64(ins[0].astype(np.float64) * ins[1].reshape(s) + ins[2].reshape(s))
    assert np.abs(out.astype(np.float64) - want).max() <= (1e-4 if dtype == "float32" else 3e-2)
    assert compare(out, get_op("ew_chain").reference(wl, ins))[0]


def test_an_onnx_hardswish_node_is_one_kernel(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from opcompiler.graph import load
    from opcompiler.graph.translate import translate

    g = helper.make_graph([helper.make_node("HardSwish", ["x"], ["y"])], "hs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])])
    path = tmp_path / "hs.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    prims, _, _ = translate(load(path, batch=None))
    # the catalogue's hardswish op (a one-step chain: it still joins element-wise chains, and after a
    # conv with bias it completes the conv2d_bias_hardswish pattern)
    assert [(p.kind, p.step) for p in prims] == [("hardswish", "hardswish")]
