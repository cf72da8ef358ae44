"""Remote measurement through TVM's own RPC tracker and server, on loopback.

A tracker and a CPU server (key `opc-cpu`) are started once for the module with
`tvm.rpc.tracker.Tracker` / `tvm.rpc.server.Server` (the classes behind
`python -m tvm.exec.rpc_tracker` / `rpc_server`); kernels built here run on the server.
"""
from __future__ import annotations

import json
import time

import pytest

from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.rpc import RpcBackend, RpcSpec, parse_rpc, rpc_backend
from opcompiler.target import load_target
from opcompiler.verify import compare

KEY = "opc-cpu"


@pytest.mark.parametrize("spec,want", [
    ("127.0.0.1:9190:a100", RpcSpec(host="127.0.0.1", port=9190, key="a100")),
    ("tracker.lan:9000:rk3399", RpcSpec(host="tracker.lan", port=9000, key="rk3399")),
])
def test_parse_rpc(spec, want):
    assert parse_rpc(spec) == want
    assert str(parse_rpc(spec)) == spec


@pytest.mark.parametrize("spec,match", [
    ("127.0.0.1:9190", "HOST:PORT:KEY"),
    ("host:port:key", "not a number"),
    ("h:70000:k", "out of range"),
    ("::k", "HOST:PORT:KEY"),
])
def test_parse_rpc_rejects(spec, match):
    with pytest.raises(OpcError, match=match) as e:
        parse_rpc(spec)
    assert "--rpc" in str(e.value) and "\n" not in str(e.value)


def test_unreachable_tracker_fails_fast_in_one_line():
    t0 = time.perf_counter()
    with pytest.raises(OpcError, match="cannot reach the RPC tracker"):
        rpc_backend(load_target("cpu"), "127.0.0.1:1:nobody")
    assert time.perf_counter() - t0 < 10


def test_simulators_are_not_remote_targets():
    with pytest.raises(OpcError, match="--rpc"):
        RpcBackend(load_target("ascend-sim"), "127.0.0.1:9190:x")


@pytest.fixture(scope="module")
def tracker():
    """A tracker and one CPU server registered under KEY, both on loopback."""
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker
    tr = Tracker(host="127.0.0.1", port=19190, port_end=19390, silent=True)
    sv = Server(host="127.0.0.1", port=19400, port_end=19600, key=KEY, tracker_addr=("127.0.0.1", tr.port),
                silent=True)
    spec = f"127.0.0.1:{tr.port}:{KEY}"
    deadline = time.time() + 60  # the server registers with the tracker asynchronously
    while time.time() < deadline:
        import tvm
        summary = tvm.rpc.connect_tracker("127.0.0.1", tr.port).summary()
        if any(q.get("free", 0) for k, q in summary.get("queue_info", {}).items() if k == KEY):
            break
        time.sleep(0.5)
    yield spec
    sv.terminate()
    tr.terminate()


def test_run_and_measure_on_remote_cpu(tracker):
    wl = workload("matmul_bias_relu", "m=32,k=64,n=48", dtype="float32")
    op = get_op(wl.op)
    backend = rpc_backend(load_target("cpu"), tracker)
    kernel = backend.build(wl)
    inputs = op.make_inputs(wl, seed=3)
    res = backend.run(kernel, inputs)
    ok, err = compare(res.outputs[0], op.reference(wl, inputs))
    assert ok, f"max abs error {err}"
    assert res.seconds > 0 and res.metrics["rpc"] == tracker
    assert backend.measure(kernel).seconds > 0


def test_cli_run_through_rpc(tracker, capsys):
    from opcompiler.cli import main
    assert main(["run", "relu", "--target", "cpu", "--shape", "n=1,c=8,h=8,w=8", "--rpc", tracker, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["correct"] is True and rep["rpc"] == tracker


def test_tuning_through_rpc_writes_records_like_local_ones(tracker, tmp_path):
    tune_mod = pytest.importorskip("opcompiler.tune")
    shape = {"m": 32, "k": 64, "n": 64}
    common = dict(shape=shape, dtype="float32", trials=3, tuner="random", workers=0, seed=1, early_stop=0,
                  transfer=False, progress=False)
    tune_mod.tune("matmul", "cpu", log=str(tmp_path / "remote.jsonl"), rpc=tracker, **common)
    tune_mod.tune("matmul", "cpu", log=str(tmp_path / "local.jsonl"), **common)
    remote = [json.loads(line) for line in (tmp_path / "remote.jsonl").read_text().splitlines()]
    local = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert remote and local
    assert {r["status"] for r in remote} <= {"ok", "invalid"} and any(r["status"] == "ok" for r in remote)
    # the same fields, the same key (a remote CPU measurement is a CPU measurement)
    assert {frozenset(r) for r in remote} == {frozenset(r) for r in local}
    assert remote[0]["key"] == local[0]["key"]
    assert all(r["seconds"] > 0 for r in remote if r["status"] == "ok")


def test_opcompiler_device_server_serves_runs(tracker):
    """`python -m opcompiler.rpc` (a TVM server with the nvcc hook) registers and runs kernels."""
    import subprocess
    import sys

    import tvm
    host, port, _ = tracker.split(":")
    proc = subprocess.Popen([sys.executable, "-m", "opcompiler.rpc", "--tracker", f"{host}:{port}", "--key",
                             "opc-dev", "--port", "19700", "--port-end", "19800"],  # default host: loopback
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            queue = tvm.rpc.connect_tracker(host, int(port)).summary().get("queue_info", {})
            if queue.get("opc-dev", {}).get("free", 0):
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        wl = workload("add", "n=1,c=4,h=4,w=4", dtype="float32")
        op = get_op(wl.op)
        backend = rpc_backend(load_target("cpu"), f"{host}:{port}:opc-dev")
        inputs = op.make_inputs(wl, seed=5)
        res = backend.run(backend.build(wl), inputs)
        assert compare(res.outputs[0], op.reference(wl, inputs))[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = proc.stdout.read()
    assert "opcompiler rpc server on 127.0.0.1:" in out and "warning" not in out


class _FakeServer:
    """Stands in for tvm.rpc.server.Server: records where it was asked to listen, serves nothing."""
    hosts: list = []

    def __init__(self, host, **kw):
        _FakeServer.hosts.append(host)
        self.port = kw["port"]
        self.proc = type("P", (), {"join": staticmethod(lambda: None)})()

    def terminate(self):
        pass


@pytest.mark.parametrize("argv, host, warned", [
    ([], "127.0.0.1", False),
    (["--host", "0.0.0.0"], "0.0.0.0", True),
    (["--host", "10.1.2.3"], "10.1.2.3", True),
])
def test_rpc_server_listens_on_loopback_unless_told(monkeypatch, capsys, argv, host, warned):
    """The server runs any module a client uploads: loopback by default, a warning when exposed."""
    import tvm.rpc.server
    from opcompiler import rpc
    monkeypatch.setattr(tvm.rpc.server, "Server", _FakeServer)
    monkeypatch.setattr(rpc.signal, "signal", lambda *a: None)  # serve() would install a SIGTERM handler here
    _FakeServer.hosts.clear()
    assert rpc.main(["--tracker", "127.0.0.1:9190", "--key", "k", *argv]) == 0
    err = capsys.readouterr().err
    assert _FakeServer.hosts == [host]
    assert ("warning: listening on " + host in err) is warned
    if warned:
        assert "run it as this user" in err and len(err.strip().splitlines()) == 1
