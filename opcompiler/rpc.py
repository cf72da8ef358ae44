"""Measuring on remote devices through a TVM RPC tracker (`--rpc HOST:PORT:KEY`).

The standard TVM set-up: a tracker (`python -m tvm.exec.rpc_tracker`) knows which servers
(`python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY`) own which devices; a client
asks the tracker for a server by key. `RpcBackend` builds locally with the target family's
own backend (cpu or cuda), exports the kernel with `export_library`, uploads it to the server
the tracker hands out, and runs / times it there with `time_evaluator`. It is an ordinary
`Backend`, so the tuner measures through it unchanged (`rpc_backend(target, spec)`), and its
records have the same form as local ones.

The simulators go another way (`tune/remote.py`): `python -m opcompiler.rpc --key ascend-sim`
(or `dsp-sim`, or `--target my.toml`) serves a measurement function, candidates travel as data,
nothing is uploaded, and `Measurer` keeps one candidate in flight per free server under the key.
"""
from __future__ import annotations

import hashlib
import signal
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tvm

from .backend import Backend, Kernel, RunResult, capabilities, device_args, families_with, get_backend
from .config import ConfigSpec
from .errors import OpcError
from .ops import get_op
from .target import Target
from .workload import Workload

SPEC_HELP = "HOST:PORT:KEY of a TVM RPC tracker, e.g. 127.0.0.1:9190:a100"
# families whose kernels a TVM RPC server can load and run (their backends declare the device)
REMOTE_FAMILIES = tuple(f for f in families_with() if capabilities(f).rpc_device)


@dataclass(frozen=True, kw_only=True)
class RpcSpec:
    """Where the tracker is and which device key to ask it for."""

    host: str
    port: int
    key: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}:{self.key}"


def parse_rpc(spec: str) -> RpcSpec:
    """`HOST:PORT:KEY` -> RpcSpec; anything else is an OpcError naming `--rpc`."""
    parts = spec.rsplit(":", 2) if isinstance(spec, str) else []
    if len(parts) != 3 or not all(parts):
        raise OpcError("not HOST:PORT:KEY", arg="--rpc", value=spec, expected=SPEC_HELP)
    host, port_s, key = parts
    try:
        port = int(port_s)
    except ValueError:
        raise OpcError(f"port {port_s!r} is not a number", arg="--rpc", value=spec, expected=SPEC_HELP) from None
    if not 0 < port < 65536:
        raise OpcError(f"port {port} is out of range", arg="--rpc", value=spec, expected="a port in 1..65535")
    return RpcSpec(host=host, port=port, key=key)


class RpcBackend(Backend):
    """Build with the local backend of the target's family, run and time on a remote device.

    One tracker session is opened lazily and kept; each built kernel is exported and uploaded
    once (named by a hash of its workload and config)."""

    repeats = 10
    min_repeat_ms = 5

    def __init__(self, target: Target, spec: RpcSpec | str, *, local: Backend | None = None,
                 session_timeout: float = 600.0, priority: int = 1):
        if not capabilities(target).rpc_device:
            raise OpcError(f"{target.name} (family {target.family}) runs here; remote measurement serves "
                           f"{' and '.join(REMOTE_FAMILIES)} targets", arg="--rpc", value=str(spec))
        self.family = target.family  # the family of the backend it wraps
        super().__init__(target)
        self.spec = parse_rpc(spec) if isinstance(spec, str) else spec
        self.local = local or get_backend(target)
        self.session_timeout = session_timeout
        self.priority = priority
        self._session: Any = None
        self._uploaded: dict[str, str] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="opc_rpc_")
        self._probe()

    def _probe(self, timeout: float = 5.0) -> None:
        """Fail in one line, before any build, when nothing listens at the tracker's address
        (TVM's own client would retry for a minute)."""
        try:
            socket.create_connection((self.spec.host, self.spec.port), timeout=timeout).close()
        except OSError as e:
            raise OpcError(f"cannot reach the RPC tracker ({e.strerror or e})", arg="--rpc", value=str(self.spec),
                           expected="a running tracker: python -m tvm.exec.rpc_tracker "
                           f"--host {self.spec.host} --port {self.spec.port}") from None

    # -- the remote session -------------------------------------------------------------------

    def session(self) -> Any:
        """The remote session, asked of the tracker on first use."""
        if self._session is None:
            try:
                tracker = tvm.rpc.connect_tracker(self.spec.host, self.spec.port)
            except Exception as e:
                raise OpcError(f"cannot reach the RPC tracker ({type(e).__name__}: {e})", arg="--rpc",
                               value=str(self.spec), expected="a running tracker: python -m tvm.exec.rpc_tracker "
                               f"--host {self.spec.host} --port {self.spec.port}") from None
            try:
                self._session = tracker.request(self.spec.key, priority=self.priority,
                                                session_timeout=self.session_timeout)
            except Exception as e:
                raise OpcError(f"the tracker has no free device for key {self.spec.key!r} "
                               f"({type(e).__name__}: {' '.join(str(e).split())[:200]})", arg="--rpc",
                               value=str(self.spec),
                               expected=f"a server registered with --key {self.spec.key}") from None
        return self._session

    def device(self) -> Any:
        sess = self.session()
        return getattr(sess, capabilities(self.family).rpc_device)(0)  # sess.cpu(0), sess.cuda(0)

    # -- Backend ------------------------------------------------------------------------------

    def build(self, wl: Workload, config: ConfigSpec = None) -> Kernel:
        kernel = self.local.build(wl, config)  # the local backend resolves and checks the config
        kernel.info = {**kernel.info, "rpc": str(self.spec)}
        return kernel

    def _remote_module(self, kernel: Kernel) -> tuple[Any, str]:
        """Upload the kernel's library once; return the loaded remote module and its entry name."""
        tag = hashlib.sha1(f"{kernel.workload.key_str()}|{kernel.template}|{sorted(kernel.config.items())}"
                           .encode()).hexdigest()[:16]
        name = f"opc_{tag}.so"
        sess = self.session()
        if name not in self._uploaded:
            path = Path(self._tmp.name) / name
            kernel.artifact.export_library(str(path))
            sess.upload(str(path))
            self._uploaded[name] = name
        return sess.load_module(name), kernel.artifact.mod.entry_name

    def _args(self, kernel: Kernel, inputs: Sequence[np.ndarray], dev: Any) -> list:
        return device_args(kernel.workload, inputs, dev)

    def _time(self, rmod: Any, entry: str, dev: Any, args: list) -> float:
        f = rmod.time_evaluator(entry, dev, number=1, repeat=self.repeats, min_repeat_ms=self.min_repeat_ms)
        return float(statistics.median(f(*args).results))

    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        rmod, entry = self._remote_module(kernel)
        dev = self.device()
        args = self._args(kernel, inputs, dev)
        t0 = time.perf_counter()
        rmod[entry](*args)
        dev.sync()
        out = args[-1].numpy()
        secs = self._time(rmod, entry, dev, args)
        return RunResult(outputs=[out], seconds=secs,
                         metrics={"rpc": str(self.spec), "rpc_roundtrip_s": time.perf_counter() - t0})

    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        if inputs is None:
            inputs = get_op(kernel.workload.op).make_inputs(kernel.workload)
        rmod, entry = self._remote_module(kernel)
        dev = self.device()
        return RunResult(outputs=None, seconds=self._time(rmod, entry, dev, self._args(kernel, inputs, dev)),
                         metrics={"rpc": str(self.spec)})


def rpc_backend(target: Target, spec: str | RpcSpec) -> Backend:
    """The backend the tuner and `opcompiler run --rpc` measure through: builds for `target`
    locally, runs on the device the tracker at `spec` (HOST:PORT:KEY) hands out."""
    return RpcBackend(target, spec)


def backend_for_run(target: Target, spec: str | None) -> Backend | None:
    """The backend `opcompiler run` uses: remote with `--rpc`; for a cuda target with neither a
    local GPU nor `--rpc`, the one-line error (before any build time is spent); else None (the
    target's own backend)."""
    if spec:
        return rpc_backend(target, spec)
    if capabilities(target).needs_device:
        from .backend.cuda import require_device_or_rpc
        require_device_or_rpc(spec, target)
    return None


# ------------------------------------------------------------------ the device side

def _server_init() -> None:
    """Runs in the RPC server process: an uploaded CUDA module that still holds source (built where
    TVM has no CUDA runtime) is compiled when it loads, for the server's GPU, with NVRTC or nvcc."""
    from .backend.cuda import install_compile_hook
    install_compile_hook()


LOOPBACK = "127.0.0.1"
EXPOSED_WARNING = ("opcompiler.rpc: warning: listening on {host}: anyone who can reach this port can upload "
                   "a module and run it as this user; expose it only on a trusted network")


def serve(tracker: str, key: str, host: str = LOOPBACK, port: int = 9090, port_end: int = 9199,
          target: Target | None = None) -> None:
    """Start a TVM RPC server registered with `tracker` (HOST:PORT) under `key`, with the nvcc
    hook installed, and serve until interrupted. Equivalent to `python -m tvm.exec.rpc_server`
    plus the hook. With a simulator `target` it serves simulated measurement instead: the global
    function `opcompiler.sim.measure`, which takes a candidate as data (tune/remote.py). Listens
    on loopback unless `host` says otherwise: a TVM server executes whatever module a client
    uploads, so exposing it is the caller's explicit choice (with a warning)."""
    import functools
    import sys
    from tvm.rpc.server import Server
    if host not in (LOOPBACK, "localhost", "::1"):
        print(EXPOSED_WARNING.format(host=host), file=sys.stderr, flush=True)
    t_host, _, t_port = tracker.rpartition(":")
    if not t_host or not t_port.isdigit():
        raise OpcError("not HOST:PORT", arg="--tracker", value=tracker, expected="e.g. 10.0.0.5:9190")
    init: Any = _server_init
    what = ""
    if target is not None:
        from .tune.remote import server_init
        init = functools.partial(server_init, str(Path(target.path).resolve()))
        what = f", simulated measurement for {target.name} (digest {target.digest})"
    server = Server(host=host, port=port, port_end=port_end, key=key, tracker_addr=(t_host, int(t_port)),
                    server_init_callback=init)
    print(f"opcompiler rpc server on {host}:{server.port}, key {key!r}, tracker {tracker}{what}", flush=True)

    def stop(*_: Any) -> None:  # SIGTERM must not orphan the server's worker process
        server.terminate()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.proc.join()
    except KeyboardInterrupt:
        server.terminate()


def sim_target(key: str, target: str | None) -> Target | None:
    """The simulator target a server measures for: `--target` (a name or a .toml file), else the
    key when it names a simulator target (`--key ascend-sim`); None: a device server (cpu, cuda)."""
    from .target import load_target
    if target:
        t = load_target(target)
        if not capabilities(t).simulator:
            raise OpcError(f"{t.name} is measured on its device: a cpu or cuda server takes no --target",
                           arg="--target", value=target, expected="ascend-sim, dsp-sim or a simulator .toml file")
        return t
    try:
        t = load_target(key)
    except OpcError:
        return None
    return t if capabilities(t).simulator else None


def main(argv: list[str] | None = None) -> int:
    """`python -m opcompiler.rpc --tracker HOST:PORT --key KEY`: a device server for `--rpc`, or with a
    simulator key / `--target`, a simulated-measurement server."""
    import argparse
    import sys
    ap = argparse.ArgumentParser(prog="python -m opcompiler.rpc", description=serve.__doc__.split("\n\n")[0])
    ap.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    ap.add_argument("--key", required=True, help="device key clients ask for (e.g. a100)")
    ap.add_argument("--host", default=LOOPBACK, help="address to listen on (default %(default)s, loopback only; "
                    "any other address lets every host that reaches it run uploaded code, and prints a warning)")
    ap.add_argument("--port", type=int, default=9090, help="first port to try (default %(default)s)")
    ap.add_argument("--port-end", type=int, default=9199, help="last port to try (default %(default)s)")
    ap.add_argument("--target", help="simulator target to measure for: ascend-sim, dsp-sim or a .toml file "
                    "(default: the key, when it names a simulator target)")
    args = ap.parse_args(argv)
    try:
        serve(args.tracker, args.key, args.host, args.port, args.port_end, sim_target(args.key, args.target))
    except OpcError as e:
        print(f"opcompiler.rpc: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
