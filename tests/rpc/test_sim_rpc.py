"""Simulated measurement through TVM's RPC tracker, on loopback (issue 26).

A tracker (`python -m tvm.exec.rpc_tracker`) and two simulator servers (`python -m opcompiler.rpc
--key KEY --target ascend-sim`) run as subprocesses for the module, each server in its own
process group so that killing it kills its session and measuring processes too, as a machine
that dies would. The tests run in file order: the last one kills a server.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from opcompiler.errors import OpcError
from opcompiler.tune import tune
from opcompiler.tune.records import config_id

KEY = "opc-sim-test"
CONV = dict(preset="resnet50.res2_3x3", dtype="float16")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_servers(port: int) -> int:
    import tvm
    try:
        return tvm.rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(KEY, {}).get("free", 0)
    except Exception:
        return 0


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """(spec, tracker port, server processes, their log files)."""
    tmp = tmp_path_factory.mktemp("farm")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port",
                               str(port), "--port-end", str(port + 1)],
                              stdout=open(tmp / "tracker.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)]
    logs = []
    for i in range(2):
        logs.append(tmp / f"server{i}.log")
        procs.append(subprocess.Popen([sys.executable, "-m", "opcompiler.rpc", "--tracker", f"127.0.0.1:{port}",
                                       "--key", KEY, "--target", "ascend-sim", "--port", str(29500 + 100 * i),
                                       "--port-end", str(29599 + 100 * i)],  # default host: loopback
                                      stdout=open(logs[-1], "w"), stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.time() + 90
        while _free_servers(port) < 2:
            assert time.time() < deadline, [p.read_text() for p in logs]
            assert all(p.poll() is None for p in procs), [p.read_text() for p in logs]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}:{KEY}", port, procs[1:], logs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_config(records: list[dict]) -> dict:
    """Measured records by config (the verification line kept apart), without their timestamps."""
    return {(config_id(r["config"]), r["tuner"] == "verify"): {k: v for k, v in r.items() if k != "timestamp"}
            for r in records}


def test_servers_listen_on_loopback_and_say_what_they_measure(farm):
    _, _, _, logs = farm
    for log in logs:
        text = log.read_text()
        assert "opcompiler rpc server on 127.0.0.1:" in text and "warning" not in text
        assert "simulated measurement for ascend910-sim (digest " in text


def test_remote_records_equal_local_ones_config_for_config(farm, tmp_path):
    spec = farm[0]
    common = dict(trials=32, tuner="random", seed=4, early_stop=0, transfer=False, progress=False, **CONV)
    remote = tune("conv2d", "ascend-sim", log=str(tmp_path / "remote.jsonl"), rpc=spec, **common)
    assert remote.measure_stats["rpc_servers"] == 2  # one candidate in flight per free server
    local = tune("conv2d", "ascend-sim", log=str(tmp_path / "local.jsonl"), workers=1, **common)
    r, l = _lines(tmp_path / "remote.jsonl"), _lines(tmp_path / "local.jsonl")
    assert remote.new_trials == local.new_trials == 32
    assert sum(1 for x in r if x["tuner"] != "verify") == 32 and {x["status"] for x in r} == {"ok"}
    assert _by_config(r) == _by_config(l)  # cycles, metrics, verification: identical
    assert remote.best is not None and remote.best.config == local.best.config


def test_a_target_digest_mismatch_is_refused(farm, tmp_path):
    """A what-if target (one figure changed) is not measured by servers of the shipped one."""
    from opcompiler.target import load_target
    text = open(load_target("ascend-sim").path).read()
    assert "clock_ghz = { value = 1.0," in text
    mine = tmp_path / "my910.toml"
    mine.write_text(text.replace("clock_ghz = { value = 1.0,", "clock_ghz = { value = 1.1,"))
    with pytest.raises(OpcError) as e:
        tune("conv2d", str(mine), log=str(tmp_path / "l.jsonl"), rpc=farm[0], trials=8, progress=False, **CONV)
    msg = str(e.value)
    assert "--rpc" in msg and "refuses a candidate for target" in msg and "target descriptions differ" in msg
    assert "target.clock_ghz 1.1 sent, 1.0 here" in msg and "\n" not in msg
    assert not (tmp_path / "l.jsonl").exists() or not (tmp_path / "l.jsonl").read_text()  # nothing recorded


def test_a_template_version_mismatch_is_refused():
    from opcompiler.target import load_target
    from opcompiler.tune.remote import PROTOCOL
    from opcompiler.tune.remote_server import refusal
    t = load_target("ascend-sim")
    req = {"protocol": PROTOCOL, "opc_version": "9.9", "target": {"name": t.name, "digest": t.digest},
           "workload": {"op": "conv2d"}, "template": {"name": "ascend.conv2d", "version": 999}}
    why = refusal(req, t)
    assert "template ascend.conv2d version 999" in why and "run the same opcompiler on both sides" in why
    assert refusal({**req, "protocol": PROTOCOL + 1}, t).endswith(f"the client {PROTOCOL + 1}")


def test_an_interrupted_remote_run_resumes_losing_nothing(farm, tmp_path):
    """Ctrl-C in the middle of a batch: every result that arrived is in the log, and the re-run
    measures only the rest."""
    import _thread
    N = 48  # enough trials that the rest are still in flight when Ctrl-C lands, on a loaded machine too
    log = tmp_path / "i.jsonl"
    common = dict(trials=N, tuner="random", seed=6, early_stop=0, transfer=False, progress=False, verify=False,
                  log=str(log), rpc=farm[0], **CONV)

    def interrupt_when_running() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 3):
            time.sleep(0.01)
        _thread.interrupt_main()

    # Ctrl-C as a user's shell delivers it: Python's own SIGINT handler (interrupt_main does nothing
    # when a library loaded earlier in this worker process left SIGINT ignored or at its default)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t = threading.Thread(target=interrupt_when_running, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            tune("conv2d", "ascend-sim", **common)
    finally:
        signal.signal(signal.SIGINT, previous)
    t.join(timeout=5)
    before = _lines(log)
    assert 3 <= len(before) < N
    again = tune("conv2d", "ascend-sim", **common)
    recs = _lines(log)
    assert again.new_trials == N - len(before)  # nothing measured twice, nothing that arrived lost
    assert len(recs) == N and len({config_id(r["config"]) for r in recs}) == N
    assert {r["status"] for r in recs} == {"ok"}


def test_killing_a_server_mid_run_loses_no_candidate(farm, tmp_path):
    spec, port, servers, _ = farm
    log = tmp_path / "k.jsonl"
    killed = threading.Event()

    def kill_when_running() -> None:  # a machine dies while candidates are in flight
        deadline = time.time() + 60
        while time.time() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= 6:
                os.killpg(servers[1].pid, signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.02)

    t = threading.Thread(target=kill_when_running, daemon=True)
    t.start()
    res = tune("conv2d", "ascend-sim", log=str(log), rpc=spec, trials=32, tuner="random", seed=5, early_stop=0,
               transfer=False, progress=False, verify=False, **CONV)
    t.join(timeout=5)
    assert killed.is_set()
    recs = _lines(log)
    assert res.new_trials == 32 and len(recs) == 32 and len({config_id(r["config"]) for r in recs}) == 32
    assert {r["status"] for r in recs} == {"ok"}  # nothing recorded as a crash: re-sent instead
    assert res.measure_stats["rpc_resent"] >= 1
    assert _free_servers(port) <= 1
