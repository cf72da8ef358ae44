"""ONNX import: opsets, constant folding, shapes, and the one-line errors for bad files."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opcompiler.errors import OpcError
from opcompiler.graph import load
from opcompiler.graph.models import op_zoo


@pytest.mark.parametrize("opset", [9, 11, 13, 21])
def test_op_zoo_imports_at_every_opset(models, opset):
    g = load(models[f"op_zoo{opset}"], batch=3)
    assert g.opset == opset
    assert g.folded == 2  # Constant and ConstantOfShape
    assert not {"Constant", "ConstantOfShape"} & {n.op_type for n in g.nodes}
    assert g.inputs == (("x", (3, 3, 8, 8)),)
    assert g.shapes[g.outputs[0]] == (3, 10)
    folded = next(v for k, v in g.constants.items() if v.shape == (1, 8, 1, 1))
    np.testing.assert_array_equal(folded, np.full((1, 8, 1, 1), 0.5, np.float32))


def test_dynamic_batch_needs_batch(models):
    with pytest.raises(OpcError, match=r"--batch.*dynamic batch dimension 'N'"):
        load(models["resnet_block"])


def test_truncated_and_garbage_files(models, tmp_path):
    data = models["resnet_block"].read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf \xff\xfe" * 10)
    for path in (cut, junk):
        with pytest.raises(OpcError) as e:
            load(path, batch=1)
        msg = str(e.value)
        assert str(path) in msg and "\n" not in msg
    with pytest.raises(OpcError, match="no such file"):
        load(tmp_path / "missing.onnx", batch=1)


def test_old_opset_and_dynamic_spatial_dims(tmp_path):
    m = op_zoo(opset=9)
    m.opset_import[0].version = 5  # older than anything onnx.version_converter upgrades here
    p = tmp_path / "old.onnx"
    onnx.save(m, str(p))
    with pytest.raises(OpcError, match="opset 5"):
        load(p, batch=1)
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", 4])])
    p2 = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p2))
    with pytest.raises(OpcError, match="dynamic dimension 'H' at axis 2"):
        load(p2, batch=1)


def test_batch_on_a_static_model(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    p = tmp_path / "static.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    assert load(p).batch == 2 and load(p, batch=2).batch == 2
    with pytest.raises(OpcError, match=r"--batch=3: the model's batch is static \(2\)"):
        load(p, batch=3)


def test_shape_arithmetic_folds_once_batch_is_fixed(tmp_path):
    """torch's x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    i64 = lambda v: helper.make_tensor("c", TensorProto.INT64, [len(v)] if isinstance(v, list) else [], v  # noqa: E731
                                       if isinstance(v, list) else [v])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Constant", [], ["zero"], name="c0", value=i64(0)),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Constant", [], ["ax"], name="c1", value=i64([0])),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
             helper.make_node("Constant", [], ["m1"], name="c2", value=i64([-1])),
             helper.make_node("Concat", ["n1", "m1"], ["shp"], name="cat", axis=0),
             helper.make_node("Reshape", ["r", "shp"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 18])])
    p = tmp_path / "view.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    graph = load(p, batch=5)
    assert [n.op_type for n in graph.nodes] == ["Relu", "Reshape"]
    assert graph.folded == 7 and graph.shapes["y"] == (5, 18)
    np.testing.assert_array_equal(graph.constants["shp"], [5, -1])
