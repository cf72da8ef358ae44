"""`opcompiler compare` and `opcompiler graph ...` as a user runs them (in process)."""
from __future__ import annotations

import json

import onnx
from onnx import TensorProto, helper

from opcompiler.cli import main


def test_compare_json_and_plot(models, tmp_path, capsys):
    png = tmp_path / "cmp.png"
    assert main(["compare", str(models["resnet_block"]), "--target", "cpu", "--batch", "1", "--json",
                 "--plot", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["correct"] == {"fused": True, "unfused": True, "cost": True}
    assert [k["op"] for k in d["fused"]["kernels"]] == ["conv2d_bn_relu", "conv2d_bn_add_relu"]
    assert d["offchip_ratio"] > 1.5 and d["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_graph_run_show_plan(models, capsys):
    assert main(["graph", "run", str(models["resnet50_stage"]), "--batch", "1", "--show-plan", "--plan", "fused",
                 "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "fused plan of resnet50_stage for cpu" in out
    assert "conv2d_bn_relu" in out and "<- " in out and "vs onnxruntime: OK" in out
    # the default plan is cost-chosen: every fused group says why it was (not) fused
    assert main(["graph", "run", str(models["resnet50_stage"]), "--batch", "1", "--show-plan",
                 "--target", "ascend-sim"]) == 0
    out = capsys.readouterr().out
    assert "cost plan of resnet50_stage for ascend910-sim" in out and "vs onnxruntime: OK" in out
    assert " us <= " in out or " us > " in out


def test_graph_plan_lists_both(models, capsys):
    assert main(["graph", "plan", str(models["minigo"]), "--batch", "4", "--target", "ascend-sim"]) == 0
    out = capsys.readouterr().out
    assert "fused plan of minigo for ascend910-sim (float16)" in out and "unfused plan" in out


def test_bad_inputs_exit_2_with_one_line(models, tmp_path, capsys):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(models["resnet_block"].read_bytes()[:300])
    g = helper.make_graph([helper.make_node("Atan", ["x"], ["y"], name="t0")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    tanh = tmp_path / "tanh.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tanh))
    cases = [
        (["compare", str(cut), "--batch", "1"], "not a valid ONNX file"),
        (["compare", str(models["resnet_block"])], "--batch N"),
        (["graph", "run", str(tanh)], "node 't0' (Atan)"),
        (["compare", str(models["resnet_block"]), "--batch", "0"], "--batch=0"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    assert main(["graph", "run", str(tanh), "--fallback", "cpu"]) == 0
    assert "(host)" in capsys.readouterr().out
