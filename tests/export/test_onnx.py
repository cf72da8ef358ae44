"""The ONNX binding: the fused `opcompiler` node run by our runner against onnxruntime on the unfused
original, both for the folder's own pair of models and for a framework-style graph rewritten by fuse()."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

from opcompiler.export.onnx_runner import Runner, fuse, run_model
from opcompiler.verify import TOLERANCE


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _close(a, b, dtype="float32"):
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(np.abs(b).max(), 1.0))


def test_folder_models_round_trip(cpu_conv_folder):
    fused = onnx.load(str(cpu_conv_folder / "model.onnx"))
    unfused = onnx.load(str(cpu_conv_folder / "model_unfused.onnx"))
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [("opcompiler", "conv2d_bn_relu")]
    assert {n.op_type for n in unfused.graph.node} >= {"Conv", "Mul", "Add", "Relu"}
    assert not any(n.domain == "opcompiler" for n in unfused.graph.node)
    rng = np.random.default_rng(4)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
             for i in fused.graph.input}
    ours = run_model(cpu_conv_folder / "model.onnx", feeds)[0]
    ref = _ort(unfused, feeds)[0]
    assert ours.shape == ref.shape == (2, 16, 10, 10)
    _close(ours, ref)


def _framework_graph(rng, with_bias: bool) -> onnx.ModelProto:
    """What a framework exports: Conv (+bias) -> BatchNormalization -> Relu with weights as
    initializers, followed by another op that stays standard (a 1x1 conv head)."""
    w = rng.standard_normal((16, 8, 3, 3)).astype("float32") * 0.3
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype("float32"), "gamma"),
             numpy_helper.from_array(rng.uniform(-1, 1, 16).astype("float32"), "beta"),
             numpy_helper.from_array(rng.uniform(-1, 1, 16).astype("float32"), "mean"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 16).astype("float32"), "var"),
             numpy_helper.from_array(rng.standard_normal((4, 16, 1, 1)).astype("float32"), "head_w")]
    conv_in = ["x", "w"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "b"))
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"], name="bn",
                              epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "head_w"], ["y"], name="head")]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 10, 10])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("with_bias", [False, True])
def test_fuse_framework_graph_matches_onnxruntime(cpu_conv_folder, with_bias):
    rng = np.random.default_rng(5)
    original = _framework_graph(rng, with_bias)
    fused = fuse(original, [cpu_conv_folder])
    kinds = [(n.domain, n.op_type) for n in fused.graph.node]
    assert kinds == [("opcompiler", "conv2d_bn_relu"), ("", "Conv")]
    x = rng.standard_normal((2, 8, 10, 10)).astype("float32")
    runner = Runner(fused, [cpu_conv_folder])
    assert runner.fused_nodes == 1
    _close(runner.run({"x": x})[0], _ort(original, {"x": x})[0])


def test_fuse_leaves_unmatched_chains_alone(cpu_conv_folder):
    """A Conv with another stride has no exported kernel: the graph is left as it was."""
    m = _framework_graph(np.random.default_rng(6), False)
    m.graph.node[0].attribute[1].ints[:] = [2, 2]  # strides
    assert [n.op_type for n in fuse(m, [cpu_conv_folder]).graph.node] == ["Conv", "BatchNormalization", "Relu", "Conv"]


def test_runner_wrong_shape_and_unknown_kernel(cpu_conv_folder):
    from opcompiler.export import KernelInputError
    fused = fuse(_framework_graph(np.random.default_rng(7), False), [cpu_conv_folder])
    with pytest.raises(KernelInputError, match=r"expected float32\[2, 8, 10, 10\], got float32\[1, 8, 10, 10\]"):
        Runner(fused, [cpu_conv_folder]).run({"x": np.zeros((1, 8, 10, 10), "float32")})
    with pytest.raises(KernelInputError, match="calls kernel 'conv2d_bn_relu'; expected one of the given exports"):
        Runner(fused, [])


@pytest.mark.parametrize("op, shape", [
    ("matmul_bias_relu", "m=8,k=32,n=16,trans_b=1"),  # MatMul with a transposed B, bias on the last axis
    ("conv2d_bias_relu", "n=1,c=4,h=7,w=7,k=8,r=3,s=3,pad=1,stride=2,layout=NHWC"),  # Transposes around Conv
])
def test_unfused_decomposition_of_other_ops(tmp_path, op, shape):
    from opcompiler.export import export
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    out = tmp_path / op
    export(workload(op, shape), load_target("cpu"), to="onnx", out=out, progress=False)
    m = onnx.load(str(out / "model.onnx"))
    rng = np.random.default_rng(8)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
             for i in m.graph.input}
    ours = run_model(out / "model.onnx", feeds)[0]
    ref = _ort(onnx.load(str(out / "model_unfused.onnx")), feeds)[0]
    assert ours.shape == ref.shape and (ref == 0).any() and (ref > 0).any()
    _close(ours, ref)
