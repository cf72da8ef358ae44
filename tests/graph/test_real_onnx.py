"""ONNX as other exporters write it: old opsets (upgraded with onnx.version_converter), weights
as graph inputs, Dropout / Identity, Squeeze / Unsqueeze, Softmax and Concat on any axis, Gemm
with transA / alpha / beta, HardSigmoid / HardSwish. Every model runs fused and unfused with no
fallback and matches onnxruntime (the executor's stated tolerance)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.errors import OpcError
from opcompiler.graph import load
from opcompiler.graph.compare import compare
from opcompiler.graph.translate import translate

rng = np.random.default_rng(7)


def _save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=13, ir=None, weights_as_inputs=False):
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    if weights_as_inputs:  # opset < 9 exporters listed every initializer as a graph input
        ins += [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    g = helper.make_graph(nodes, name, ins, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                             for n, s in outputs], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir is not None:
        m.ir_version = ir
    onnx.checker.check_model(m)
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def _t(name, *shape, positive=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def caffe2_style_cnn(tmp_path, opset=6):
    """Conv -> BN -> Relu -> MaxPool -> Dropout (mask unused) -> Flatten -> Gemm with IR version 3:
    weights are graph inputs with initializers; at opset 6 BN and Dropout carry `is_test`."""
    old = {"is_test": 1} if opset == 6 else {}
    inits = [_t("W", 8, 3, 3, 3), _t("g", 8, positive=True), _t("b", 8), _t("m", 8), _t("v", 8, positive=True),
             _t("FW", 10, 8 * 4 * 4), _t("FB", 10)]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], epsilon=1e-5, **old),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Dropout", ["p"], ["d", "mask"], ratio=0.5, **old),
             helper.make_node("Flatten", ["d"], ["f"]),
             helper.make_node("Gemm", ["f", "FW", "FB"], ["y"], transB=1, **({"broadcast": 1} if opset == 6 else {}))]
    return _save(tmp_path, f"caffe2_opset{opset}", nodes, [("x", [1, 3, 8, 8])], [("y", [1, 10])], inits,
                 opset=opset, ir=3, weights_as_inputs=True)


def _check(path, targets=("cpu", "ascend-sim")):
    g = load(path, batch=None)
    for t in targets:
        c = compare(g, t)
        assert c.fused.correct and c.unfused.correct, (t, c.fused.max_abs_err, c.unfused.max_abs_err)
        assert not c.fused.on_host() and not c.unfused.on_host()
    return g


@pytest.mark.parametrize("opset", [6, 7, 8])
def test_old_opsets_upgrade_and_run(tmp_path, opset):
    g = _check(caffe2_style_cnn(tmp_path, opset))
    assert g.source_opset == opset and g.opset == 11
    assert "Dropout" not in {n.op_type for n in g.nodes}  # the identity is gone before shape inference
    assert {"W", "FW"} <= set(g.constants) and [n for n, _ in g.inputs] == ["x"]


def test_opset_below_6_is_refused(tmp_path):
    p = caffe2_style_cnn(tmp_path, 6)
    m = onnx.load(str(p))
    m.opset_import[0].version = 5
    onnx.save(m, str(p))
    with pytest.raises(OpcError, match=r"opset 5 \(expected opset 6 to \d+\)"):
        load(p)


def test_dropout_as_graph_output_and_identity(tmp_path):
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["r"]),
             helper.make_node("Dropout", ["r"], ["y"])]
    g = _check(_save(tmp_path, "drop_out", nodes, [("x", [2, 4, 3, 3])], [("y", [2, 4, 3, 3])]))
    assert [n.op_type for n in g.nodes] == ["Relu", "Dropout"]


def test_dropout_mask_read_is_a_clear_error(tmp_path):
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]),
             helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["d", "mf"], ["y"])]
    p = _save(tmp_path, "mask", nodes, [("x", [1, 4, 2, 2])], [("y", [1, 4, 2, 2])])
    with pytest.raises(OpcError, match="Dropout mask output is read"):
        translate(load(p))


def test_squeeze_unsqueeze_softmax_nd(tmp_path):
    """GAP -> Squeeze -> Softmax (last axis) -> Unsqueeze, and a 4-D softmax at opset 11 (axis=1
    flattens C*H*W), and a 3-D last-axis softmax at opset 13."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Squeeze", ["p", "ax"], ["s"]),
             helper.make_node("Softmax", ["s"], ["sm"], axis=-1),
             helper.make_node("Unsqueeze", ["sm", "ax"], ["y"])]
    _check(_save(tmp_path, "sq13", nodes, [("x", [2, 6, 4, 4])], [("y", [2, 6, 1, 1])],
                 [numpy_helper.from_array(np.array([2, 3], np.int64), "ax")]))
    _check(_save(tmp_path, "sm11", [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                 [("x", [2, 3, 4, 5])], [("y", [2, 3, 4, 5])], opset=11))
    _check(_save(tmp_path, "sm13_3d", [helper.make_node("Softmax", ["x"], ["y"], axis=2)],
                 [("x", [2, 3, 7])], [("y", [2, 3, 7])]))


def test_softmax_over_a_middle_axis(tmp_path):
    """Opset 13 semantics: over axis 1 alone (transposed to the rows and back), values checked."""
    _check(_save(tmp_path, "sm_mid", [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                 [("x", [2, 3, 4, 5])], [("y", [2, 3, 4, 5])]))


@pytest.mark.parametrize("axis, shapes", [
    (0, [(1, 3, 4, 4), (2, 3, 4, 4)]), (2, [(1, 3, 4, 4), (1, 3, 2, 4)]), (3, [(2, 3, 4, 1), (2, 3, 4, 5)]),
    (1, [(2, 3, 5), (2, 4, 5)]), (-1, [(2, 3, 5), (2, 3, 2), (2, 3, 1)])])
def test_concat_on_any_axis(tmp_path, axis, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    relu = [helper.make_node("Relu", [n], [f"r{i}"]) for i, n in enumerate(names)]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    cat = helper.make_node("Concat", [f"r{i}" for i in range(len(shapes))], ["y"], axis=axis)
    _check(_save(tmp_path, f"cat{axis}_{len(shapes[0])}", relu + [cat], list(zip(names, shapes)), [("y", out)]))


def test_gemm_trans_a_alpha_beta(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "B", "C"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)]
    _check(_save(tmp_path, "gemm_t", nodes, [("x", [12, 3])], [("y", [3, 5])], [_t("B", 5, 12), _t("C", 5)]))


def test_hard_sigmoid_and_hard_swish(tmp_path):
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=0.25, beta=0.4),
             helper.make_node("HardSwish", ["h"], ["y"])]
    _check(_save(tmp_path, "hard", nodes, [("x", [1, 5, 6, 6])], [("y", [1, 5, 6, 6])], opset=14))


@pytest.mark.parametrize("pool", [
    dict(op="MaxPool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),  # Caffe2's asymmetric pads
    dict(op="MaxPool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),  # torch ceil_mode=True (SqueezeNet)
    dict(op="MaxPool", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(op="AveragePool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
    dict(op="AveragePool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1)])
def test_pool_asymmetric_pads_and_ceil_mode(tmp_path, pool):
    pool = dict(pool)
    op = pool.pop("op")
    node = helper.make_node(op, ["x"], ["y"], **pool)
    out = 10 if pool["strides"] == [1, 1] else 5  # 10x10 input; ceil_mode makes 5 where floor gives 4
    g = _check(_save(tmp_path, "pool", [node], [("x", [1, 5, 10, 10])], [("y", [1, 5, out, out])]))
    prims = translate(g)[0]
    assert prims[-1].kind == "pool2d" and prims[-1].params["pad"] in (0, 1)


def test_conv_same_upper_stride2_pads_explicitly(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              auto_pad="SAME_UPPER")]
    p = _save(tmp_path, "conv_same", nodes, [("x", [1, 4, 8, 8])], [("y", [1, 6, 4, 4])], [_t("W", 6, 4, 3, 3),
                                                                                         _t("B", 6)])
    g = _check(p)
    kinds = [q.kind for q in translate(g)[0]]
    assert kinds == ["pad", "conv2d", "bias_add"]


def test_avg_pool_asymmetric_excluding_pad_matches_onnxruntime(tmp_path):
    """Refused until issue 23 (light_inception_v1 has such pools); now zero pad, window sum, and a
    per-output scale by the count onnxruntime divides by (tests/graph/test_models_people_write.py
    covers ceil_mode and count_include_pad=1)."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1])
    p = _save(tmp_path, "avg_asym", [node], [("x", [1, 2, 5, 5])], [("y", [1, 2, 3, 3])])
    _check(p)


def test_channel_shuffle_and_transpose(tmp_path):
    """ShuffleNet's channel shuffle (Reshape -> Transpose -> Reshape) and an NCHW -> NHWC transpose."""
    shape = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s5"], ["g"]),
             helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "s4"], ["sh"]),
             helper.make_node("Transpose", ["sh"], ["y"], perm=[0, 2, 3, 1])]
    p = _save(tmp_path, "shuffle", nodes, [("x", [1, 6, 5, 5])], [("y", [1, 5, 5, 6])],
              [shape("s5", [1, 2, 3, 5, 5]), shape("s4", [1, 6, 5, 5])])
    g = _check(p, targets=("cpu", "ascend-sim", "dsp-sim"))
    assert [q.kind for q in translate(g)[0]].count("transpose") == 2


@pytest.mark.parametrize("size", [5, 3])  # onnxruntime (the reference) takes odd sizes only
def test_lrn(tmp_path, size):
    """AlexNet/GoogLeNet-style LRN after a conv."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("LRN", ["r"], ["y"], size=size, alpha=1e-2, beta=0.75, bias=2.0)]
    g = _check(_save(tmp_path, f"lrn{size}", nodes, [("x", [1, 3, 6, 6])], [("y", [1, 7, 6, 6])], [_t("W", 7, 3, 3, 3)]))
    assert "conv2d" in [q.kind for q in translate(g)[0]][1:]


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_excite_runtime_channel_gate(tmp_path, batch):
    """EfficientNet's SE block: x * sigmoid(fc(GAP(x))) with the gate (N, C, 1, 1) computed at run time."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "W"], ["q"]),
             helper.make_node("Sigmoid", ["q"], ["gate"]),
             helper.make_node("Mul", ["x", "gate"], ["m"]),
             helper.make_node("Add", ["gate", "m"], ["y"])]
    _check(_save(tmp_path, f"se{batch}", nodes, [("x", [batch, 6, 5, 5])], [("y", [batch, 6, 5, 5])], [_t("W", 6, 6, 1, 1)]),
           targets=("cpu", "ascend-sim", "dsp-sim"))


def test_channel_split_slice_and_reduce_mean(tmp_path):
    """ShuffleNetV2's channel split (Slice) and head (ReduceMean over H, W), opset 13 and opset 9 Slice."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
             helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
             helper.make_node("Relu", ["b"], ["rb"]),
             helper.make_node("Concat", ["a", "rb"], ["cat"], axis=1),
             helper.make_node("ReduceMean", ["cat"], ["y"], axes=[2, 3], keepdims=0)]
    _check(_save(tmp_path, "split", nodes, [("x", [2, 6, 4, 5])], [("y", [2, 6])],
                 [c("s0", [0]), c("e0", [3]), c("s1", [3]), c("e1", [2**62]), c("ax", [1])]))
    old = [helper.make_node("Slice", ["x"], ["a"], starts=[1, 1], ends=[3, -1], axes=[1, 3]),
           helper.make_node("ReduceMax", ["a"], ["y"], axes=[3], keepdims=1)]
    _check(_save(tmp_path, "slice9", old, [("x", [1, 4, 3, 6])], [("y", [1, 2, 3, 1])], opset=9))


def test_single_input_concat_is_the_identity(tmp_path):
    """torchvision's DenseNet concatenates a one-element list in its first dense layer."""
    nodes = [helper.make_node("Concat", ["x"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])]
    _check(_save(tmp_path, "cat1", nodes, [("x", [1, 3, 4, 4])], [("y", [1, 3, 4, 4])]))
