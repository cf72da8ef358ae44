"""Where records go: the user's log directory, never the current directory or the package's
shipped records; `best` / `logs` / `--config best` read both and say which; bad log places are
one-line errors that lose nothing."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from opcompiler.cli import main
from opcompiler.ops import workload
from opcompiler.settings import user_log_dir
from opcompiler.target import load_target
from opcompiler.tune.records import find_best, shipped_dir

TUNE = ["tune", "matmul", "--target", "cpu", "--shape", "m=8,k=16,n=8", "--trials", "2", "--batch-size", "2",
        "--workers", "0", "--json"]


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_default_user_dir_is_outside_the_package_and_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("OPC_LOG_DIR")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_log_dir() == (tmp_path / "home" / ".local" / "share" / "opcompiler" / "tuning_logs", "default")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert user_log_dir()[0] == tmp_path / "xdg" / "opcompiler" / "tuning_logs"
    monkeypatch.setenv("OPC_LOG_DIR", "rel/logs")  # a relative OPC_LOG_DIR is taken from where the user stands
    monkeypatch.chdir(tmp_path)
    assert user_log_dir() == (tmp_path / "rel" / "logs", "OPC_LOG_DIR")


def test_tune_never_writes_shipped_records(capsys, tmp_path, monkeypatch):
    """Even pointed straight at them with --log or OPC_LOG_DIR: exit 2, one line, files unchanged."""
    before = _digest(shipped_dir())
    target_log = shipped_dir() / "ascend910-sim" / "conv2d.jsonl"
    assert main([*TUNE, "--log", str(target_log)]) == 2
    err = capsys.readouterr().err
    assert "inside the records shipped with opcompiler" in err and "--log" in err and err.count("\n") == 1
    monkeypatch.setenv("OPC_LOG_DIR", str(shipped_dir()))
    assert main(TUNE) == 2
    assert "shipped" in capsys.readouterr().err
    assert _digest(shipped_dir()) == before


@pytest.mark.parametrize("make_bad, needle", [
    (lambda d: (d / "afile").write_text("x") and d / "afile" / "cpu" / "matmul.jsonl", "is a file, not a directory"),
    (lambda d: (d / "adir.jsonl").mkdir() or d / "adir.jsonl", "is a directory, not a log file"),
])
def test_bad_log_places_are_one_line_errors(capsys, tmp_path, make_bad, needle):
    bad = make_bad(tmp_path)
    assert main([*TUNE, "--log", str(bad)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(bad) in err and err.count("\n") == 1


def test_log_dir_that_is_a_file_via_env(capsys, tmp_path, monkeypatch):
    (tmp_path / "logs").write_text("not a directory")
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path / "logs"))
    assert main(TUNE) == 2
    err = capsys.readouterr().err
    assert "is a file, not a directory" in err and "OPC_LOG_DIR" in err
    assert (tmp_path / "logs").read_text() == "not a directory"


def test_existing_records_survive_a_rejected_run(capsys, tmp_path):
    log = tmp_path / "mine.jsonl"
    assert main([*TUNE, "--log", str(log)]) == 0
    capsys.readouterr()
    kept = log.read_bytes()
    assert main([*TUNE, "--log", str(log), "--trials", "0"]) == 2  # bad input after records exist
    assert log.read_bytes() == kept


def test_best_reads_user_then_shipped_and_says_which(capsys, tmp_path):
    """The README's default workload has a shipped record; `best` finds it and names its source."""
    rc = main(["best", "conv2d", "--target", "ascend-sim", "--json"])
    b = json.loads(capsys.readouterr().out)
    assert rc == 0 and b["source"] == "shipped" and Path(b["log"]).is_relative_to(shipped_dir())
    assert main(["best", "conv2d", "--target", "ascend-sim"]) == 0
    assert "from    records shipped with opcompiler: " in capsys.readouterr().out

    # a record of the user's for the same workload comes first
    src = Path(b["log"])
    user = Path(os.environ["OPC_LOG_DIR"]) / "ascend910-sim" / "conv2d.jsonl"
    user.parent.mkdir(parents=True)
    user.write_bytes(src.read_bytes())
    wl = workload("conv2d", preset="resnet50.res2_3x3", dtype="float16")
    found = find_best(wl, load_target("ascend-sim"))
    assert found.source == "user" and found.path == user and found.record.cycles == b["cycles"]


def test_config_best_says_where_it_came_from(tmp_path):
    from opcompiler.api import run_op
    rep = run_op("conv2d", "ascend-sim", preset="resnet50.res2_1x1a", config="best")
    assert rep["correct"] and rep["config_source"].startswith("best verified record (records shipped with opcompiler: ")


def test_logs_lists_both_sources(capsys, tmp_path):
    assert main([*TUNE]) == 0
    capsys.readouterr()
    assert main(["logs", "--shipped"]) == 0
    out = capsys.readouterr().out
    assert f"your records:    {os.environ['OPC_LOG_DIR']} (set by OPC_LOG_DIR)" in out
    assert f"shipped records: {shipped_dir()} (read-only)" in out
    rows = [line.split()[0] for line in out.splitlines()[3:] if line and not line.startswith("(")]
    assert "user" in rows and "shipped" in rows
    # without --shipped: the user's rows alone, and one line saying how many shipped ones there are
    assert main(["logs"]) == 0
    out = capsys.readouterr().out
    shipped = len(main_json(["logs", "--shipped", "--json"], capsys)) - 1
    assert f"shipped records: {shipped_dir()} (read-only): {shipped} workloads, not listed (--shipped lists them)" in out
    rows = [line.split()[0] for line in out.splitlines()[3:] if line and not line.startswith("(")]
    assert rows == ["user"]
    assert [r["source"] for r in main_json(["logs", "--json"], capsys)] == ["user"]
    # --log is the option's name as in tune and best; --dir, its older name, still works
    assert main_json(["logs", "--log", os.environ["OPC_LOG_DIR"], "--json"], capsys)[0]["trials"] == 2
    assert main_json(["logs", "--dir", os.environ["OPC_LOG_DIR"], "--json"], capsys)[0]["trials"] == 2


def main_json(argv, capsys):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_best_is_the_faster_of_user_and_shipped(tmp_path):
    """A user's slower verified record does not hide the shipped one (and says where it came from)."""
    from opcompiler.tune.records import Record, RecordLog, fold
    wl = workload("conv2d", preset="resnet50.res2_3x3", dtype="float16")
    t = load_target("ascend-sim")
    shipped = find_best(wl, t)
    assert shipped.source == "shipped"
    worse = Record(key=shipped.record.key, config={}, status="ok", cycles=shipped.record.cycles * 2, verified=True)
    default_cfg = __import__("opcompiler.template", fromlist=["get_template"]).get_template(
        "conv2d", "ascend").config(wl, t, None)
    worse = Record(key=worse.key, config=default_cfg, status="ok", cycles=worse.cycles, verified=True)
    user = Path(os.environ["OPC_LOG_DIR"]) / "ascend910-sim" / "conv2d.jsonl"
    RecordLog(user).append(worse)
    assert fold(RecordLog(user).read())  # the user's record is there and verified
    found = find_best(wl, t)
    assert found.source == "shipped" and found.record.cycles == shipped.record.cycles
    better = Record(key=worse.key, config=dict(shipped.record.config), status="ok",
                    cycles=shipped.record.cycles - 1, verified=True)
    RecordLog(user).append(better)
    found = find_best(wl, t)
    assert found.source == "user" and found.record.cycles == shipped.record.cycles - 1
