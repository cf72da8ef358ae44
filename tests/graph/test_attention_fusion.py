"""Attention as exporters write it (Q K^T through a Transpose, a scale, an additive causal mask,
Softmax, P V) becomes one `attention` kernel in the fused plan: the transpose folds into the
product (trans_b) and the scores never become a value of the plan; the unfused plan runs the
products, the mask and the softmax as kernels of their own. Both match onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.graph import load, make_plan, run_plan


def _attention_model(path, b=1, h=2, s=24, d=16, mask=True):
    causal = np.triu(np.full((s, s), -1e9, np.float32), 1)
    inits = [numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale")]
    last = "ss"
    if mask:
        inits.append(numpy_helper.from_array(causal, "causal"))
        nodes.append(helper.make_node("Add", ["ss", "causal"], ["sm_in"], name="mask"))
        last = "sm_in"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, s, d]) for n in ("q", "k", "v")]
    g = helper.make_graph(nodes, "attn", io, [helper.make_tensor_value_info("o", TensorProto.FLOAT, [b, h, s, d])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
@pytest.mark.parametrize("mask", [True, False])
def test_fused_plan_is_one_attention_kernel(tmp_path, target, mask):
    g = load(_attention_model(tmp_path / "attn.onnx", mask=mask))
    run = run_plan(make_plan(g, target))
    assert run.correct, run.max_abs_err
    assert [k.op for k in run.kernels if k.op != "view"] == ["attention"]
    (grp,) = [x for x in run.plan.groups if x.op == "attention"]
    wl = run.plan.workload(grp)
    assert (wl["b"], wl["sq"], wl["skv"], wl["d"], wl["mask"]) == (2, 24, 24, 16, 2 if mask else 0)
    assert float(wl["scale"]) == pytest.approx(0.25)
    unfused = run_plan(make_plan(g, target, mode="unfused"))
    assert unfused.correct, unfused.max_abs_err
    ops = [k.op for k in unfused.kernels if k.op != "view"]
    assert ops[0] == "batch_matmul" and ops[-2:] == ["softmax", "batch_matmul"] and "transpose" not in ops
