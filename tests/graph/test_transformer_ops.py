"""The element-wise and normalization nodes transformer exporters write (issue 33 item 1), imported
and run on cpu, ascend-sim and dsp-sim with values against onnxruntime (`GRAPH_TOLERANCE`):

* GELU written out (Div, Erf, Add, Mul, Mul: torch's erf form) and as opset 20's Gelu (both
  approximations), Tanh, Sqrt, Reciprocal, Pow with 2, 3 (any sign of the base) or 0.5;
* Sub and Div of runtime values, and of a per-row [..., 1] operand (x - mean, x / std);
* a scalar constant in Add / Mul / Sub / Div: one `affine` step, not a tensor of x's size;
* LayerNormalization (opset 17) and its written-out form (opset 14 exporters), both the same
  primitives: row means, per-row bias / scale, (var + eps) ** -0.5, then gamma and beta.

Models are built with onnx.helper: [2, 8, 32] activations, as a Linear on [B, S, D] gives them."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.graph import load, make_plan, run_plan

SHAPE = [2, 8, 32]
TARGETS = ["cpu", "ascend-sim", "dsp-sim"]


def _model(path, nodes, inits=(), opset=17, inputs=("x",), shape=SHAPE):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(v, TensorProto.FLOAT, shape) for v in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _run(path, target, mode="fused"):
    run = run_plan(make_plan(load(path), target, mode=mode))
    assert run.correct, (target, run.max_abs_err)
    return run


def _c(name, v):
    return (name, np.asarray(v, np.float32))


GELU_ERF = ([helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])],
            [_c("sqrt2", 2 ** 0.5), _c("one", 1.0), _c("half", 0.5)])


@pytest.mark.parametrize("target", TARGETS)
def test_gelu_as_torch_writes_it_is_one_chain_kernel(tmp_path, target):
    run = _run(_model(tmp_path / "gelu.onnx", *GELU_ERF), target)
    ks = [k for k in run.kernels if k.op != "view"]
    assert len(ks) == 1 and ks[0].op == "ew_chain"
    assert ks[0].prim_ops == ("affine:0.7071067690849304:0.0", "erf", "affine:1.0:1.0", "mul", "affine:0.5:0.0")


@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("target", TARGETS)
def test_opset20_gelu(tmp_path, target, approx):
    p = _model(tmp_path / "g20.onnx", [helper.make_node("Gelu", ["x"], ["y"], approximate=approx)], opset=20)
    run = _run(p, target)
    assert [k.prim_ops for k in run.kernels if k.op != "view"] == [("gelu" if approx == "none" else "gelu_tanh",)]


LN_W = np.linspace(0.5, 1.5, 32), np.linspace(-0.2, 0.2, 32)


@pytest.mark.parametrize("target", TARGETS)
def test_layer_normalization(tmp_path, target):
    p = _model(tmp_path / "ln.onnx", [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)],
               [_c("g", LN_W[0]), _c("b", LN_W[1])])
    run = _run(p, target)
    assert [k.op for k in run.kernels if k.op != "view"] == ["layer_norm"]  # one kernel, fp32 statistics


@pytest.mark.parametrize("target", TARGETS)
def test_residual_add_and_layer_norm_fuse(tmp_path, target):
    """Add then LayerNormalization (a transformer layer's residual): one add_layer_norm kernel fused,
    add and layer_norm apart unfused; both against onnxruntime."""
    p = _model(tmp_path / "skip.onnx", [helper.make_node("Add", ["x", "x2"], ["s"]),
                                         helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"])],
               [_c("g", LN_W[0]), _c("b", LN_W[1])], inputs=("x", "x2"))
    assert [k.op for k in _run(p, target).kernels if k.op != "view"] == ["add_layer_norm"]
    assert [k.op for k in _run(p, target, mode="unfused").kernels if k.op != "view"] == ["add", "layer_norm"]


@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_written_out(tmp_path, target):
    """The opset-14 export of nn.LayerNorm: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), helper.make_node("Sub", ["x", "mu"], ["xc"]),
             helper.make_node("Pow", ["xc", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["xc", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    p = _model(tmp_path / "lnw.onnx", nodes, [_c("two", 2.0), _c("eps", 1e-5), _c("g", LN_W[0]), _c("b", LN_W[1])],
               opset=14)
    run = _run(p, target)  # recognised as one op: one layer_norm kernel, fp32 statistics
    assert [k.op for k in run.kernels if k.op != "view"] == ["layer_norm"]
    (g,) = [g for g in run.plan.groups if g.op == "layer_norm"]
    assert float(g.params["eps"]) == pytest.approx(1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_binary_and_unary_nodes(tmp_path, target):
    nodes = [helper.make_node("Sub", ["x", "x2"], ["s"]), helper.make_node("Pow", ["s", "three"], ["c"]),
             helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("Add", ["sq", "one"], ["p"]), helper.make_node("Sqrt", ["p"], ["r"]),
             helper.make_node("Reciprocal", ["r"], ["q"]), helper.make_node("Div", ["t", "r"], ["u"]),
             helper.make_node("Sub", ["two", "q"], ["v"]), helper.make_node("Add", ["u", "v"], ["y"])]
    p = _model(tmp_path / "ops.onnx", nodes, [_c("three", 3.0), _c("one", 1.0), _c("two", 2.0)],
               inputs=("x", "x2"))
    _run(p, target)
    _run(p, target, mode="unfused")


def test_a_scalar_constant_is_an_affine_step_not_a_tensor(tmp_path):
    p = _model(tmp_path / "affine.onnx", [helper.make_node("Add", ["x", "c"], ["a"]),
                                          helper.make_node("Mul", ["a", "k"], ["y"])], [_c("c", 3.0), _c("k", 0.25)])
    plan = make_plan(load(p), "cpu", mode="unfused")
    assert [g.prim_ops for g in plan.groups] == [("affine:1.0:3.0",), ("affine:0.25:0.0",)]
    assert all(v.size == 1 or not k.endswith(":full") for k, v in plan.constants.items())
    _run(p, "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_gather_of_a_constant_index_is_a_slice(tmp_path, target):
    """nn.MultiheadAttention's packed QKV split: Gather(qkv, 1, axis=0) of the stacked projections."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["q"], axis=0), helper.make_node("Relu", ["q"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 8, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 32])],
                          initializer=[numpy_helper.from_array(np.asarray(1, np.int64), "i")])
    p = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    run = _run(p, target)
    sl = next(k for k in run.kernels if k.op == "slice")
    assert run.plan.workload(next(g for g in run.plan.groups if g.op == "slice"))["start"] == 1 and sl.where != "host"


def test_gather_with_runtime_indices_is_refused_in_one_line(tmp_path):
    from opcompiler.errors import OpcError
    nodes = [helper.make_node("Gather", ["w", "ids"], ["y"], axis=0)]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("w", TensorProto.FLOAT, [10, 4]),
                                       helper.make_tensor_value_info("ids", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    p = tmp_path / "emb.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(OpcError, match="Gather with runtime indices"):
        make_plan(load(p), "cpu")


def test_torch_transformer_encoder_runs_on_the_target_with_one_attention_kernel_per_layer(tmp_path):
    """nn.TransformerEncoder (2 layers, GELU, exported by torch.onnx at opset 17, as a user writes
    it) runs whole on ascend-sim with no fallback: attention (torch scales Q and K^T, then Q K^T,
    softmax, P V) is one kernel per layer in the fused plan and batch_matmul / softmax kernels in
    the unfused one, and all three plans match onnxruntime."""
    torch = pytest.importorskip("torch")
    from opcompiler.graph import compare
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True, activation="gelu")
    m = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    p = tmp_path / "enc.onnx"
    torch.onnx.export(m, (torch.randn(1, 8, 32),), str(p), opset_version=17, input_names=["x"],
                      output_names=["y"], dynamo=False)
    c = compare(load(p), "ascend-sim", cost_plan=False)
    assert c.fused.correct and c.unfused.correct, (c.fused.max_abs_err, c.unfused.max_abs_err)
    assert not c.fused.on_host() and not c.unfused.on_host()
    assert [k.op for k in c.fused.kernels].count("attention") == 2
    assert [k.op for k in c.unfused.kernels].count("batch_matmul") == 4
    # the head split (Q, K, V) and merge transposes join the kernel, which reads and writes the
    # sequence-first tensors: 4 transposes a layer fewer than the unfused plan runs
    attn = [g for g in c.fused.plan.groups if g.op == "attention"]
    assert all(g.params["layout"] == "sbhd" for g in attn)
    transposes = [[k.op for k in r.kernels].count("transpose") for r in (c.fused, c.unfused)]
    assert transposes[1] - transposes[0] == 8
    assert c.summary()["cycles"][0] < c.summary()["cycles"][1]


def _embedding_model(path, dtype=TensorProto.INT64):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["m"], name="proj"), helper.make_node("Relu", ["m"], ["y"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", dtype, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])],
                          initializer=[numpy_helper.from_array(rng.standard_normal((50, 32)).astype(np.float32), "table"),
                                       numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("dtype", [TensorProto.INT64, TensorProto.INT32])
def test_integer_token_ids_are_imported_and_their_lookup_runs_on_the_target(tmp_path, dtype):
    """Token ids (int64 / int32 graph inputs) import; the embedding lookup that reads them is one
    `gather` kernel on the target (no --fallback), the ids reaching it in their integer dtype, and
    the projection reads its (2*8, 32) rows directly. The random ids are valid rows of the table
    (make_inputs). Any other node reading an integer tensor is still refused."""
    from opcompiler.graph.executor import make_inputs
    g = load(_embedding_model(tmp_path / "emb.onnx", dtype))
    assert g.dtype("ids") == ("int64" if dtype == TensorProto.INT64 else "int32")
    plan = make_plan(g, "ascend-sim")
    ids = make_inputs(plan, seed=1)["ids"]
    assert ids.dtype == np.dtype(g.dtype("ids")) and 0 <= ids.min() and ids.max() < 50
    run = run_plan(plan)
    assert run.correct, run.max_abs_err
    assert not run.on_host()
    assert [k.op for k in run.on_target()] == ["gather", "matmul", "relu"]  # a 2-D GEMM of M = 2*8 rows
