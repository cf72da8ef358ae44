"""The CLI through a subprocess: JSON contract, exit codes, one-line errors without tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcompiler", *args], capture_output=True, text=True, timeout=300)


def test_run_json_contract():
    r = cli("run", "conv2d", "--target", "cpu", "--shape", "n=1,c=8,h=12,w=12,k=16,r=3,s=3,pad=1", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    for key in ("op", "target", "shape", "dtype", "config", "correct", "max_abs_err", "seconds", "flops", "gflops"):
        assert key in rep
    assert rep["correct"] is True and rep["flops"] == 2 * 16 * 12 * 12 * 8 * 9
    assert rep["gflops"] == pytest.approx(rep["flops"] / rep["seconds"] / 1e9)


def test_run_human_readable_and_config_json():
    r = cli("run", "matmul", "--target", "cpu", "--preset", "seed.matmul_16x256x1024", "--config",
            '{"tile_n": 32, "tile_m": 4}')
    assert r.returncode == 0, r.stderr
    assert "correct: yes" in r.stdout and "'tile_n': 32" in r.stdout


def test_ops_and_targets_list():
    r = cli("ops")
    assert r.returncode == 0 and "conv2d_bn_relu" in r.stdout and "minigo.conv3_res" in r.stdout
    r = cli("targets", "--json")
    assert r.returncode == 0 and any(t["name"] == "cpu" for t in json.loads(r.stdout))


@pytest.mark.parametrize("args,words", [
    (("run", "conv2d", "--target", "nosuch"), "unknown target"),
    (("run", "conv2d", "--dtype", "float64"), "does not support this dtype"),
    (("run", "conv2d", "--shape", "n=1,c=6,k=8,groups=4"), "groups"),
    (("run", "conv2d", "--config", "{not json"), "not valid JSON"),
    (("run", "conv2d", "--config", '{"tile_q": 1}'), "unknown knob"),
    (("run", "nosuchop"), "unknown op"),
    (("frobnicate",), "invalid choice"),
])
def test_bad_input_exit_2_one_line(args, words, capsys):
    from opcompiler.cli import main
    try:
        rc = main(list(args))
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    assert words in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_input_through_a_real_process_has_no_traceback():
    r = cli("run", "conv2d", "--shape", "n=1,c=6,k=8,groups=4")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
