"""The client side of `--rpc HOST:PORT:KEY` on cpu and cuda: `RpcBackend` builds locally with the
target family's own backend, exports the kernel with `export_library`, uploads it to the server
the tracker hands out, and runs / times it there with `time_evaluator`. It is an ordinary
`Backend`, so the tuner measures through it unchanged (`rpc_backend(target, spec)`), and its
records have the same form as local ones. The servers (`python -m opcompiler.rpc`) are
`opcompiler.rpc`; the simulators' remote measurement is `opcompiler.tune.remote`."""
from __future__ import annotations

import hashlib
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tvm

from ..config import ConfigSpec
from ..errors import OpcError
from ..ops import get_op
from ..rpc_spec import RpcSpec, parse_rpc
from ..target import Target
from ..workload import Workload
from .base import Backend, Kernel, RunResult, device_args
from . import capabilities, families_with, get_backend

# families whose kernels a TVM RPC server can load and run (their backends declare the device)
REMOTE_FAMILIES = tuple(f for f in families_with() if capabilities(f).rpc_device)


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
        from .cuda import require_device_or_rpc
        require_device_or_rpc(spec, target)
    return None
