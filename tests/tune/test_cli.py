"""End-to-end smoke: `opcompiler tune` on the real cpu backend, then `best`, `logs`, `run --config best`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opcompiler.cli import main


def _json(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, dict]:
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip().startswith(("{", "[")) else {})


def test_tune_best_logs_run_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    shape = "m=16,k=64,n=32"
    rc, s = _json(capsys, ["tune", "matmul", "--target", "cpu", "--shape", shape, "--trials", "6",
                           "--batch-size", "3", "--workers", "0", "--json"])
    assert rc == 0
    assert s["trials"] == 6 and s["invalid"] == 0 and s["verified"] is True
    # the user's log (OPC_LOG_DIR, set per test in conftest), never the current directory
    assert s["log"] == str(Path(os.environ["OPC_LOG_DIR"]) / "cpu" / "matmul.jsonl") and Path(s["log"]).exists()
    assert not (tmp_path / "tuning_logs").exists()
    assert s["best_seconds"] <= s["default_seconds"] and s["speedup_over_default"] >= 1.0
    assert s["tflops"] == pytest.approx(2 * 16 * 64 * 32 / s["best_seconds"] / 1e12)
    assert "opcompiler export matmul --target cpu" in s["export_command"]

    rc, b = _json(capsys, ["best", "matmul", "--target", "cpu", "--shape", shape, "--json"])
    assert rc == 0 and b["config"] == s["best_config"] and b["source"] == "user" and b["log"] == s["log"]

    rc, rows = _json(capsys, ["logs", "--target", "cpu", "--json"])
    assert rc == 0 and len(rows) == 1 and rows[0]["trials"] == 6 and rows[0]["verified"] == 1
    assert rows[0]["source"] == "user"

    from opcompiler.api import run_op
    rep = run_op("matmul", "cpu", shape=shape, config="best")
    assert rep["correct"] and rep["config"] == s["best_config"]


@pytest.mark.parametrize("argv, needle", [
    (["tune", "matmul", "--target", "cpu", "--trials", "0"], "--trials=0"),
    (["tune", "matmul", "--target", "cpu", "--tuner", "genetic"], "--tuner='genetic'"),
    (["tune", "conv2d", "--target", "nosuch"], "--target='nosuch'"),
    (["best", "matmul", "--target", "cpu", "--shape", "m=3,k=5,n=7"], "no verified record"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture,
                                         tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_cuda_without_gpu_or_rpc_exits_2(capsys: pytest.CaptureFixture) -> None:
    cuda = pytest.importorskip("opcompiler.backend.cuda", reason="cuda backend not in this build")
    if cuda.has_gpu():
        pytest.skip("this machine has a GPU: tune would really run")
    assert main(["tune", "conv2d", "--target", "cuda-sm80", "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert "--rpc HOST:PORT:KEY" in err and err.count("\n") == 1
