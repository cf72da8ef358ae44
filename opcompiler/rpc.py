"""Measuring on remote devices through a TVM RPC tracker (`--rpc HOST:PORT:KEY`).

The standard TVM set-up: a tracker (`python -m tvm.exec.rpc_tracker`) knows which servers
(`python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY`) own which devices; a client
asks the tracker for a server by key. `RpcBackend` builds locally with the target family's
own backend (cpu or cuda), exports the kernel with `export_library`, uploads it to the server
the tracker hands out, and runs / times it there with `time_evaluator`. It is an ordinary
`Backend`, so the tuner measures through it unchanged (`rpc_backend(target, spec)`), and its
records have the same form as local ones. That client side lives in `opcompiler.backend.rpc`
(re-exported here); this module is the servers (`python -m opcompiler.rpc`).

The simulators go another way (`tune/remote.py`): `python -m opcompiler.rpc --key ascend-sim`
(or `dsp-sim`, or `--target my.toml`) serves a measurement function, candidates travel as data,
nothing is uploaded, and `Measurer` keeps one candidate in flight per free server under the key.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from .backend import capabilities
from .backend.rpc import REMOTE_FAMILIES, RpcBackend, backend_for_run, rpc_backend  # noqa: F401  (re-exported)
from .errors import OpcError
from .rpc_spec import SPEC_HELP, RpcSpec, parse_rpc  # noqa: F401  (re-exported: opcompiler.rpc.parse_rpc)
from .target import Target

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
        from .tune.remote_server import server_init
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
