"""MatMul of any rank against one matrix (a `Linear` on [B, S, D], as every transformer exporter
writes it) is one 2-D GEMM with M = B*S, and the element-wise nodes that follow it (the Linear's
bias as a per-channel `bias_add`, an activation, a residual add) run on the same 2-D value, so
the bias and the activation fuse into the GEMM (issue 33 item 1). Two batched operands (attention's
Q K^T) are refused in one line, and run on the host with --fallback cpu.

Values against onnxruntime at the plan's tolerance (`GRAPH_TOLERANCE`)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan, run_plan


def _linear_model(path, b=2, s=16, d=64, h=48, b_shape=None):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((d, h)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((h, d)).astype(np.float32) * 0.1
    inits = [numpy_helper.from_array(w1.reshape(b_shape or w1.shape), "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
             helper.make_node("Relu", ["a1"], ["r1"], name="act"),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["b2", "m2"], ["a2"], name="fc2_bias"),
             helper.make_node("Add", ["a2", "x"], ["y"], name="residual")]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d])], initializer=inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_a_linear_on_3d_is_one_gemm_with_its_bias_and_activation_fused(tmp_path, target):
    run = run_plan(make_plan(load(_linear_model(tmp_path / "ffn.onnx")), target))
    assert run.correct, run.max_abs_err
    ks = [k for k in run.kernels if k.op != "view"]
    assert [k.op for k in ks] == ["matmul_bias_relu", "matmul_bias", "add"]
    first = run.plan.workload(next(g for g in run.plan.groups if g.op == "matmul_bias_relu"))
    assert (first["m"], first["k"], first["n"]) == (2 * 16, 64, 48)  # M = B*S
    assert ks[0].nodes == ("fc1", "fc1_bias", "act")


def test_unfused_plan_runs_the_same_gemm_op_by_op(tmp_path):
    run = run_plan(make_plan(load(_linear_model(tmp_path / "ffn.onnx")), "cpu", mode="unfused"))
    assert run.correct
    assert [k.op for k in run.kernels if k.op != "view"] == ["matmul", "bias_add", "relu", "matmul", "bias_add", "add"]


def test_a_weight_with_leading_unit_axes_is_one_matrix(tmp_path):
    run = run_plan(make_plan(load(_linear_model(tmp_path / "ffn.onnx", b_shape=(1, 64, 48))), "ascend-sim"))
    assert run.correct and [k.op for k in run.kernels if k.op != "view"][0] == "matmul_bias_relu"


def _attention_scores(path):
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk")]
    g = helper.make_graph(nodes, "qk", [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 4, 8, 16]),
                                        helper.make_tensor_value_info("kt", TensorProto.FLOAT, [1, 4, 16, 8])],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4, 8, 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_batched_matmul_runs_as_one_batch_matmul_kernel(tmp_path, target):
    run = run_plan(make_plan(load(_attention_scores(tmp_path / "qk.onnx")), target))
    assert run.correct, run.max_abs_err
    assert [k.op for k in run.kernels if k.op != "view"] == ["batch_matmul"]
    (g,) = [g for g in run.plan.groups if g.op == "batch_matmul"]
    wl = run.plan.workload(g)
    assert (wl["b"], wl["m"], wl["k"], wl["n"], wl["trans_b"]) == (4, 8, 16, 8, 0)
