"""fp16 overflow that explains itself: the first node that overflowed, its fp32 range, float16's
limit, and a remedy (--fp32-nodes) that makes the run match onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.cli import main
from opcompiler.graph import load, make_plan, run_plan


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    """Conv whose fp32 output reaches ~7e4 (> 65504), then ReLU and a BN that scales it back down:
    an unnormalised network in miniature."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 3000).astype(np.float32), "W"),
             numpy_helper.from_array(np.full(8, 1e-3, np.float32), "g"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"), numpy_helper.from_array(np.zeros(8, np.float32), "m"),
             numpy_helper.from_array(np.ones(8, np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="big_conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu1"),
             helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["y"], name="bn")]
    g = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=inits)
    p = tmp_path_factory.mktemp("ovf") / "overflow.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    return p


def test_first_overflowing_node_is_named_with_its_range(overflowing):
    r = run_plan(make_plan(load(overflowing), "ascend-sim", mode="unfused"))
    assert r.correct is False
    o = r.overflow
    assert o["nodes"] == ["big_conv"] and o["op"] == "conv2d" and o["limit"] == 65504.0
    assert o["fp32_max"] > 65504 and np.isfinite(o["fp32_min"])
    d = r.diagnosis()
    assert d.startswith("float16 overflow in node 'big_conv' (Conv as conv2d, kernel k0): its fp32 values span [")
    assert "beyond float16's largest finite 65504" in d and "--fp32-nodes auto" in d and "\n" not in d


@pytest.mark.parametrize("remedy", ["auto", "big_conv"])
def test_fp32_remedy_matches_onnxruntime(overflowing, remedy):
    r = run_plan(make_plan(load(overflowing), "ascend-sim", mode="fused"), fp32_nodes=remedy)
    assert r.correct, r.max_abs_err
    assert r.fp32_kernels and r.fp32_kernels[0] == "k0"


def test_cli_exits_1_with_the_diagnosis_in_one_line(overflowing, capsys):
    assert main(["compare", str(overflowing), "--target", "ascend-sim"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "float16 overflow in node 'big_conv'" in err and "Traceback" not in err
    assert main(["compare", str(overflowing), "--target", "ascend-sim", "--fp32-nodes", "auto"]) == 0
    capsys.readouterr()
    assert main(["graph", "run", str(overflowing), "--target", "ascend-sim", "--fp32-nodes", "nosuch"]) == 2
    assert "no node named 'nosuch'" in capsys.readouterr().err


def _plus_minus_1000(tmp_path):
    """relu(x) + 1000 - 1000, two Add kernels: exact in fp32, rounded to fp16's 0.5 grid at 1000."""
    c = lambda name, v: numpy_helper.from_array(np.full((1, 4, 1, 1), v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "big"], ["a"], name="plus_1000"),
             helper.make_node("Add", ["a", "minus"], ["y"], name="minus_1000")]
    g = helper.make_graph(nodes, "drift", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                          initializer=[c("big", 1000.0), c("minus", -1000.0)])
    p = tmp_path / "drift.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    return p


def test_rounding_drift_names_where_the_error_grew(tmp_path):
    """(x + 1000) - 1000 in float16: exact in fp32, off by up to 0.25 in fp16 (the spacing at 1000 is
    0.5). No overflow, so the report names the kernel where the error first passed the tolerance."""
    p = _plus_minus_1000(tmp_path)
    r = run_plan(make_plan(load(p), "ascend-sim", mode="unfused"))
    assert r.overflow is None
    assert r.drift["node"] == "minus_1000" and r.drift["rel"] > 0.02
    d = r.diagnosis()
    assert d.startswith("float16 rounding drift (no overflow)") and "after node 'minus_1000'" in d
    # Every kernel is right for float16 (x + 1000 rounded to the 0.5 grid is within 2^-11 of the
    # range 1000), and onnxruntime storing 'a' in float16 makes the same error: drift, not a bug.
    assert r.drift["kernels_ok"] and r.drift["worst_kernel_rel"] <= 2.0 ** -11
    assert r.drift["twin_rel"] == pytest.approx(r.drift["final_rel"], rel=1e-6)
    assert r.correct is True and "not a wrong kernel" in d
    assert run_plan(make_plan(load(p), "cpu", mode="unfused")).correct  # fp32: exact


def test_a_wrong_kernel_is_not_passed_off_as_drift(tmp_path, monkeypatch):
    """The same graph with one simulated kernel made 1 % wrong: the per-kernel check finds it
    (its own inputs, fp32 on the host), so the run is a mismatch that names that kernel."""
    from opcompiler.backend.ascend.backend import AscendSimBackend as AscendBackend
    p = _plus_minus_1000(tmp_path)
    run = AscendBackend.run

    def off_by_one_percent(self, kernel, args):
        res = run(self, kernel, args)
        if any(np.abs(a).max() > 500 for a in args):  # plus_1000's output is minus_1000's input
            res.outputs[0][...] = res.outputs[0] * np.float16(1.01)
        return res
    monkeypatch.setattr(AscendBackend, "run", off_by_one_percent)
    r = run_plan(make_plan(load(p), "ascend-sim", mode="unfused"))
    assert r.correct is False and r.drift["kernels_ok"] is False
    assert r.drift["worst_kernel_rel"] > 0.005
    assert "a wrong kernel, not drift" in r.diagnosis()


def test_the_kernel_audit_judges_a_lowest_fill_pad_within_the_dtype(tmp_path, monkeypatch):
    """A ceil_mode max pool pads with the dtype's lowest value: -65504 in float16, -3.4e38 in the
    float32 recomputation. The per-kernel audit compares within float16's range, so the pad is not
    reported as 100 % off (googlenet on ascend-sim read "a wrong kernel" for its stem's pad). The
    tolerance is forced to 0 so the drift audit runs."""
    import onnx
    from onnx import TensorProto, helper

    from opcompiler.graph import executor, load, make_plan, run_plan
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             helper.make_node("Relu", ["p"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])])
    p = tmp_path / "ceil.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    monkeypatch.setitem(executor.GRAPH_TOLERANCE, "float16", (0.0, 0.0))
    run = run_plan(make_plan(load(p), "ascend-sim", mode="unfused"))
    assert "pad" in [k.op for k in run.kernels]
    assert run.drift is not None and run.drift["kernels_checked"] >= 2
    assert run.drift["worst_kernel_rel"] <= executor.KERNEL_TOLERANCE["float16"], run.drift
