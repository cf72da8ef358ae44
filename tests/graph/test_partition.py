"""Lowering ONNX nodes to primitives and partitioning them into fused / unfused kernels."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan
from opcompiler.graph.partition import fusion_patterns


def _model(tmp_path, nodes, inits, outputs, name="m", shape=(1, 4, 6, 6), opset=13):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.graph.ClearField("output")
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(inferred[o] for o in outputs)
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def _ops(plan):
    return [(g.op, g.params.get("chain")) if g.op == "ew_chain" else g.op for g in plan.groups]


def test_patterns_come_from_the_catalogue():
    pats = dict(fusion_patterns())
    assert pats["conv2d_bn_relu"] == ("conv2d", "batch_norm", "relu")
    assert pats["conv2d_bias_relu"] == ("conv2d", "bias_add", "relu")
    assert pats["matmul_bias_relu"] == ("matmul", "bias_add", "relu")
    assert pats["add_relu"] == ("add", "relu")
    lengths = [len(s) for _, s in fusion_patterns()]
    assert lengths == sorted(lengths, reverse=True)  # longest match first


def test_resnet_block_fused_and_unfused(models):
    g = load(models["resnet_block"], batch=1)
    fused, unfused = make_plan(g, "cpu"), make_plan(g, "cpu", fused=False)
    # the second conv's BN, the residual add and the ReLU run in its epilogue (conv + eltwise)
    assert _ops(fused) == ["conv2d_bn_relu", "conv2d_bn_add_relu"]
    assert _ops(unfused) == ["conv2d", "batch_norm", "relu", "conv2d", "batch_norm", "add", "relu"]
    assert [len(k.nodes) for k in fused.groups] == [3, 4]
    # the residual add takes the block input last: (data, weight, scale, shift, x)
    assert fused.groups[1].inputs[4] == "x"


def test_a_value_read_twice_or_returned_stays_in_memory(tmp_path):
    w = np.ones((4, 4, 1, 1), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sig")]
    p = _model(tmp_path, nodes, {"w": w}, ["c", "s"])  # c is a graph output
    plan = make_plan(load(p), "cpu")
    assert _ops(plan) == ["conv2d", ("ew_chain", "relu;sigmoid")]


def test_elementwise_chain_and_late_operand(tmp_path):
    # t = sigmoid(x); u = clip(t); v = u + relu(x) where relu(x) comes after u in node order
    nodes = [helper.make_node("Sigmoid", ["x"], ["t"], name="sig"),
             helper.make_node("Clip", ["t", "lo", "hi"], ["u"], name="clip"),
             helper.make_node("Relu", ["x"], ["rx"], name="relu_x"),
             helper.make_node("Add", ["rx", "u"], ["v"], name="add"),
             helper.make_node("Mul", ["v", "k"], ["y"], name="mul")]
    inits = {"lo": np.array(0.1, np.float32), "hi": np.array(0.8, np.float32),
             "k": np.arange(4, dtype=np.float32).reshape(4, 1, 1)}
    plan = make_plan(load(_model(tmp_path, nodes, inits, ["y"])), "cpu")
    assert _ops(plan) == ["relu", ("ew_chain", "sigmoid;clip:0.10000000149011612:0.800000011920929;add;scale")]
    chain = plan.groups[1]
    assert chain.inputs[0] == "x" and chain.inputs[1] == "rx"  # relu(x) runs first: topological order


def test_unsupported_op_names_node_and_fallback(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Atan", ["r"], ["y"], name="my_atan")]
    p = _model(tmp_path, nodes, {}, ["y"])
    with pytest.raises(OpcError) as e:
        make_plan(load(p), "cpu")
    msg = str(e.value)
    assert "'my_atan'" in msg and "Atan" in msg and "--fallback cpu" in msg and "\n" not in msg
    plan = make_plan(load(p), "cpu", fallback="cpu")
    assert [g.op for g in plan.groups] == ["relu", "host"]


def test_unsupported_variant_is_explained(tmp_path):
    w = np.ones((4, 4, 3, 3), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="odd_conv", strides=[1, 2])]
    with pytest.raises(OpcError, match=r"'odd_conv' \(Conv\).*strides \[1, 2\]"):
        make_plan(load(_model(tmp_path, nodes, {"w": w}, ["y"])), "cpu")
