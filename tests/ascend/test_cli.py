"""End-to-end smoke: `opcompiler run ... --target ascend-sim --json` through api.run_op."""
from __future__ import annotations

import json
import subprocess
import sys

from opcompiler.cli import main

MAIN = "import sys; from opcompiler.cli import main; sys.exit(main())"


def test_run_conv_preset_json():
    p = subprocess.run([sys.executable, "-c", MAIN, "run", "conv2d", "--target", "ascend-sim", "--preset",
                        "resnet50.res2_3x3", "--dtype", "float16", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["correct"] and rep["target"] == "ascend910-sim"
    for key in ("cycles", "percent_of_peak", "bound", "bytes_by_level", "pipe_ratios", "tflops", "layout_handling"):
        assert key in rep
    assert rep["seconds"] * 1e9 == rep["cycles"]
    assert 0 < rep["percent_of_peak"] < 100


def test_run_with_config_json(capsys):
    cfg = '{"m_tile": 16, "k_tile": 64, "n_tile": 256, "double_buffer": 0, "block_dim": 1}'
    assert main(["run", "matmul", "--target", "ascend-sim", "--dtype", "float16", "--config", cfg, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["config"] == {**json.loads(cfg), "a_layout": "zZ"} and rep["active_cores"] == 1
