"""Tuning records: schema, locked appends, concurrent writers, kill -9, corrupt lines, best."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path


from opcompiler.tune.records import Record, RecordLog, best_of, best_record, fold, record_key

from . import fakes


def _rec(i: int, cycles: int | None = 100, status: str = "ok", verified: bool = False, **kw) -> Record:
    key = kw.pop("key", record_key(fakes.small_matmul(), fakes.fake_target(), "fake.matmul", 1))
    return Record(key=key, config={"tile_m": i, "unroll": 1}, status=status, cycles=cycles, verified=verified, **kw)


def test_roundtrip_keeps_every_field(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "a" / "b.jsonl")
    r = _rec(4, cycles=1234, metrics={"percent_of_peak": 12.5, "bound": "mte2"}, tuner="xgb", timestamp=1.5)
    log.append(r)
    line = json.loads((tmp_path / "a" / "b.jsonl").read_text())
    assert line["v"] == 1 and line["key"]["template"] == "fake.matmul" and line["key"]["target_digest"]
    assert set(line["key"]) >= {"op", "params", "dtype", "layout", "target", "template_version", "opc_version"}
    assert log.read() == [r]


def test_corrupt_and_foreign_lines_skipped_with_one_warning(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    log = RecordLog(p)
    log.append(_rec(1, 500))
    with open(p, "a") as f:
        f.write('{"v": 1, "key": {"op": "conv2d"}, "con\n')  # truncated
        f.write("not json at all\n")
        f.write(json.dumps({"v": 99, "key": {}, "config": {}}) + "\n")  # another schema version
        f.write('{"some": "other tool"}')  # foreign, and no trailing newline
    log.append(_rec(2, 300))  # must not be glued to the unterminated line
    before = p.read_bytes()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        recs = log.read()
    assert [r.cycles for r in recs] == [500, 300]
    assert len(w) == 1 and "skipped 4 corrupt or foreign line(s)" in str(w[0].message)
    assert p.read_bytes() == before  # never deleted or rewritten


def test_best_needs_verification_and_wrong_excludes(tmp_path: Path) -> None:
    recs = [_rec(1, 100), _rec(2, 200), _rec(3, 300), _rec(2, 200, verified=True), _rec(3, 300, verified=True)]
    assert best_of(recs).cycles == 200  # 100 is faster but was never verified
    recs.append(_rec(2, None, status="wrong"))
    assert best_of(recs).cycles == 300
    assert best_of(recs, verified_only=False).cycles == 100
    states = fold(recs)
    assert len(states) == 3 and sum(s.wrong for s in states.values()) == 1


def test_best_record_matches_full_key(tmp_path: Path) -> None:
    wl, t = fakes.small_matmul(), fakes.fake_target()
    log = tmp_path / "l.jsonl"
    other_target = record_key(wl, fakes.fake_target(capacity=999), "fake.matmul", 1)
    old_template = record_key(wl, t, "fake.matmul", 0)
    RecordLog(log).append([_rec(1, 10, verified=True, key=other_target), _rec(1, 20, verified=True, key=old_template),
                           _rec(8, 70, verified=True),
                           _rec(5, 50, verified=True)])  # tile_m=5 is no longer in the template's space
    assert best_record(wl, t, log).cycles == 70


_WRITER = textwrap.dedent("""
    import sys
    from opcompiler.tune.records import Record, RecordLog
    key = {key!r}
    log = RecordLog(sys.argv[1])
    tag = int(sys.argv[2])
    for i in range(int(sys.argv[3])):
        log.append(Record(key=key, config={{"tile_m": tag * 100000 + i}}, status="ok", cycles=i + 1, error="x" * 3000))
""")


def _writer(tmp_path: Path, log: Path, tag: int, n: int) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    key = record_key(fakes.small_matmul(), fakes.fake_target(), "fake.matmul", 1)
    script.write_text(_WRITER.format(key=key))
    return subprocess.Popen([sys.executable, str(script), str(log), str(tag), str(n)])


def test_two_concurrent_writers_lose_and_interleave_nothing(tmp_path: Path) -> None:
    log = tmp_path / "c.jsonl"
    procs = [_writer(tmp_path, log, tag, 300) for tag in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn line would warn
        recs = RecordLog(log).read()
    assert len(recs) == 600
    for tag in (1, 2):
        assert sorted(r.config["tile_m"] - tag * 100000 for r in recs if r.config["tile_m"] // 100000 == tag) \
            == list(range(300))


def test_kill_9_leaves_only_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "k.jsonl"
    p = _writer(tmp_path, log, 3, 10**6)
    deadline = time.time() + 60
    while (not log.exists() or log.stat().st_size < 200_000) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    data = log.read_bytes()
    assert data.endswith(b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recs = RecordLog(log).read()
    assert len(recs) == data.count(b"\n") > 10
