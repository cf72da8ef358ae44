"""Whole-model tuning: distinct kernels of both plans, trials by share of the model's time,
ordinary records, resumable, and picked up by compare --config best."""
from __future__ import annotations

import json

import pytest

from opcompiler.cli import main
from opcompiler.graph import load
from opcompiler.graph.models import write
from opcompiler.tune.model import extract_tasks, tune_model
from opcompiler.target import load_target


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    return write("resnet_block", tmp_path_factory.mktemp("m") / "block.onnx", c=8, hw=8)


def test_tasks_are_the_distinct_kernels_of_both_plans(block):
    tasks, skipped = extract_tasks(load(block, batch=1), load_target("ascend-sim"))
    ops = sorted(t.wl.op for t in tasks)
    assert "conv2d_bn_relu" in ops and "conv2d" in ops and "batch_norm" in ops and not skipped
    assert len({t.wl.key_str() for t in tasks}) == len(tasks)  # deduplicated by workload
    conv = next(t for t in tasks if t.wl.op == "conv2d")
    assert conv.uses == {"unfused": 2}  # both 3x3 convs of the block share one workload


def test_tune_model_writes_records_resumes_and_never_gets_slower(block):
    g = load(block, batch=1)
    rounds = []
    res = tune_model(g, "ascend-sim", trials=24, workers=0, batch_size=8, progress=False,
                     on_round=lambda t, n: rounds.append((t.wl.op, n)))
    assert res.trials == 24 and res.new_trials == 24 and sum(n for _, n in rounds) == 24
    assert rounds[0][0] in {t.wl.op for t in res.tasks}
    # the first round goes to the kernel with the largest share of the model's time
    first = max(res.tasks, key=lambda t: t.before * sum(t.uses.values()))
    assert rounds[0][0] == first.wl.op
    for plan in ("fused", "unfused", "cost"):
        assert res.after[plan] <= res.before[plan] * (1 + 1e-9)
    assert res.after["cost"] <= min(res.after["fused"], res.after["unfused"]) * (1 + 1e-9)
    again = tune_model(g, "ascend-sim", trials=24, workers=0, progress=False)
    assert again.new_trials == 0 and again.trials == 24


def test_cli_tune_model_json_and_bad_input(block, capsys, tmp_path):
    assert main(["tune", str(block), "--target", "ascend-sim", "--batch", "1", "--trials", "8", "--workers", "0",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["trials"] == 8 and set(d["estimated_seconds_after"]) == {"fused", "unfused", "cost"}
    assert main(["tune", str(tmp_path / "missing.onnx"), "--target", "ascend-sim"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["tune", str(block), "--target", "ascend-sim", "--batch", "1", "--log", "x.jsonl"]) == 2
    assert "OPC_LOG_DIR" in capsys.readouterr().err
