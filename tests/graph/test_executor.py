"""Whole graphs end to end on cpu and the simulators, checked against onnxruntime."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opcompiler.graph import GRAPH_TOLERANCE, compare, load, make_plan, run_plan


def test_resnet_block_cpu_bytes_by_hand(models):
    """Off-chip bytes on cpu are the kernels' compulsory bytes: c=8, 8x8, batch 1, fp32."""
    c = compare(load(models["resnet_block"], batch=1), "cpu")
    assert c.fused.correct and c.unfused.correct
    act, w, ch = 8 * 8 * 8 * 4, 8 * 8 * 3 * 3 * 4, 8 * 4  # one activation, one 3x3 weight, one (C,) vector
    fused = 2 * (act + w + 2 * ch + act) + act    # conv_bn_relu, conv_bn_add_relu (+ the residual it reads)
    unfused = 2 * (act + w + act) + 2 * (act + 2 * ch + act) + 2 * (2 * act) + 3 * act  # conv, bn, relu, add
    assert c.fused.totals()["offchip_bytes"] == fused == 14976
    assert c.unfused.totals()["offchip_bytes"] == unfused == 35456
    assert c.summary()["kernels"] == (2, 7)
    assert {k.config_source for k in c.fused.on_target()} == {"template default"}


@pytest.mark.parametrize("opset", [9, 21])
def test_every_supported_op_runs_on_cpu(models, opset):
    run = run_plan(make_plan(load(models[f"op_zoo{opset}"], batch=2), "cpu"))
    assert run.correct, run.max_abs_err
    out = next(iter(run.outputs.values()))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)  # it ends in a softmax


def test_minigo_two_heads_cpu(models):
    g = load(models["minigo"], batch=2)
    run = run_plan(make_plan(g, "cpu"))
    assert run.correct, run.max_abs_err
    policy, value = (run.outputs[o] for o in g.outputs)
    assert policy.shape == (2, 362) and value.shape == (2, 1)
    assert np.all(np.abs(value) <= 1.0)  # tanh written as 2*sigmoid(2x)-1
    ops = [k.op for k in run.kernels]
    assert ops.count("view") == 2 and "softmax" in ops and "matmul_bias_relu" in ops


def test_wrong_kernel_output_is_caught(models, monkeypatch):
    """The check against onnxruntime can fail: perturb one kernel's result."""
    from opcompiler.backend.cpu import CpuBackend

    real = CpuBackend.run

    def bad(self, kernel, inputs):
        res = real(self, kernel, inputs)
        if kernel.workload.op == "conv2d_bn_relu":
            res.outputs[0] = res.outputs[0] + 1e-2
        return res

    monkeypatch.setattr(CpuBackend, "run", bad)
    run = run_plan(make_plan(load(models["resnet_block"], batch=1), "cpu"))
    assert run.correct is False


def _atan_model(tmp_path):
    """Relu, Atan (no lowering: a host node with --fallback cpu), Relu."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Atan", ["r"], ["t"], name="atan"),
             helper.make_node("Relu", ["t"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 5, 5])])
    p = tmp_path / "atan.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    return p


def test_fallback_runs_unsupported_node_on_host(tmp_path):
    p = _atan_model(tmp_path)
    run = run_plan(make_plan(load(p), "cpu", fallback="cpu"))
    assert run.correct
    host = run.on_host()
    assert [k.onnx_ops for k in host] == [("Atan",)] and host[0].offchip_bytes == 2 * 2 * 4 * 5 * 5 * 4
    assert run.totals()["kernels"] == 2 and run.totals()["host_nodes"] == 1


def test_best_record_is_used(models, monkeypatch, tmp_path):
    from opcompiler.settings import settings
    from opcompiler.target import load_target
    from opcompiler.template import get_template
    from opcompiler.tune.records import Record, RecordLog, default_log_path, record_key

    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path))
    settings.cache_clear()
    try:
        plan = make_plan(load(models["resnet_block"], batch=1), "cpu", mode="unfused")
        target = load_target("cpu")
        g = plan.groups[2]  # relu
        wl = plan.workload(g)
        tmpl = get_template("elemwise", "cpu")
        values = tmpl.space(wl, target)[0].values
        cfg = {"vector": values[0] if tmpl.default(wl, target)["vector"] != values[0] else values[1]}
        RecordLog(default_log_path(target, wl.op)).append(Record(
            key=record_key(wl, target, tmpl.name, tmpl.version), config=cfg, status="ok", seconds=1e-6,
            verified=True))
        run = run_plan(plan)
    finally:
        settings.cache_clear()
    assert run.correct
    k = run.kernels[2]
    assert k.config_source == "tuning record" and k.config == cfg
    assert {x.config_source for x in run.kernels[:2]} == {"template default"}


def test_ascend_fp16_graph(models):
    c = compare(load(models["resnet_block"], batch=1), "ascend-sim")
    assert c.fused.plan.dtype == "float16" and GRAPH_TOLERANCE["float16"] == (2e-2, 2e-2)
    assert c.fused.correct and c.unfused.correct, (c.fused.max_abs_err, c.unfused.max_abs_err)
    f, u = c.fused.totals(), c.unfused.totals()
    assert f["cycles"] < u["cycles"] and f["offchip_bytes"] < u["offchip_bytes"]
    assert all(k.percent_of_peak is not None for k in c.fused.on_target())


def test_dsp_splits_fusions_it_lacks(models):
    run = run_plan(make_plan(load(models["resnet_block"], batch=1), "dsp-sim"))
    assert run.correct, run.max_abs_err
    split = [k for k in run.kernels if "split" in k.note]
    # conv2d_bn_add_relu: the DSP's direct conv reads the residual in its epilogue, nothing to split
    assert [k.op for k in split] == []
    assert "conv2d_bn_add_relu" in [k.op for k in run.kernels]
    assert all(k.cycles and k.cycles > 0 for k in run.on_target())


def test_json_roundtrip(models):
    c = compare(load(models["resnet_block"], batch=1), "cpu", check=False)
    d = json.loads(json.dumps(c.as_dict()))
    assert d["correct"] == {"fused": None, "unfused": None, "cost": None}
    assert len(d["fused"]["kernels"]) == 2 and d["speedup"] > 0


def test_compare_counts_host_nodes_in_the_whole_model(tmp_path):
    """A node run on the host (--fallback cpu) is in the per-kernel table, and in a whole-model
    line whose times are the target's kernels plus the host's nodes."""
    from opcompiler.graph import compare, format_compare
    p = _atan_model(tmp_path)
    c = compare(load(p), "ascend-sim", fallback="cpu")
    s = c.summary()
    f, u = c.fused.totals(), c.unfused.totals()
    assert s["with_host"]["host_nodes"] == (1, 1)
    assert s["with_host"]["seconds"] == (f["seconds"] + f["host_seconds"], u["seconds"] + u["host_seconds"])
    text = format_compare(c)
    assert "Atan (host)" in text and "whole model:" in text
    assert c.as_dict()["with_host"]["host_nodes"] == (1, 1)
