"""Simulated measurement through TVM's RPC tracker: many hosts measure one tuning run.

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190                 # anywhere
    python -m opcompiler.rpc --tracker HOST:9190 --key ascend-sim              # on each measuring host
    opcompiler tune conv2d --target ascend-sim --rpc HOST:9190:ascend-sim      # the tuning host

**Server.** `python -m opcompiler.rpc --key ascend-sim` (or `dsp-sim`, or `--target my.toml`)
starts TVM's own RPC server with one global PackedFunc, `opcompiler.sim.measure`, registered by
`remote_server.server_init` before the server forks its session processes. The client sends a candidate as
JSON *data*: the workload, the config, the target's content and digest, the template's name and
version, verify / seed / timeout. No code is uploaded. The server refuses a candidate whose
target digest or template version differs from its own (`remote_server.refusal`: the figures that differ, or
both versions); otherwise it builds the candidate with its installed opcompiler and measures it
exactly as a local worker would (a `Measurer` with one worker process in the session, so a
candidate that crashes or hangs is recorded `crash` / `timeout` as locally): timing mode, and the
functional run against the numpy reference when asked to verify. It answers the result record.

**Client.** `RemoteMeasurer` stands behind `Measurer` when a simulator target has `--rpc`. It
keeps one thread per server session, as many as the tracker has free servers under the key
(re-counted as each batch starts and every few seconds while it runs), so that many candidates
are in flight. A session that breaks (the server died) or a candidate past its deadline (the
server hangs) has its candidate re-sent to another server, up to `MAX_SENDS` times; the
hung server's thread is abandoned. Results arrive in any order; the tuner appends each record
as it comes, so an interrupted run resumes losing nothing that was measured.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import OpcError
from ..target import Target
from ..workload import Workload
from .process import MeasureResult, _one_line

MEASURE_FUNC = "opcompiler.sim.measure"
PROTOCOL = 1
MAX_SENDS = 3  # a candidate lost with this many servers (died or hung) is recorded as a crash
SERVER_STARTUP = 10.0  # a session's measuring worker is forked from the warm server: seconds, not minutes


# ------------------------------------------------------------------ the client side

@dataclasses.dataclass(eq=False)
class _Task:
    i: int
    gen: int
    payload: str
    sends: int = 0
    lost: list = dataclasses.field(default_factory=list)


class _Slot:
    """One thread holding one session with one server, measuring one candidate at a time."""

    def __init__(self, owner: "RemoteMeasurer", n: int):
        self.owner, self.n = owner, n
        self.task: _Task | None = None
        self.deadline = 0.0
        self.abandoned = False
        self.connected = False
        self.tracker: Any = None
        self.thread = threading.Thread(target=self._loop, name=f"opc-rpc-{n}", daemon=True)
        self.thread.start()

    def _connect(self) -> tuple[Any, Any]:
        """(session, its measuring function) from the tracker; (None, None) after a failure."""
        import tvm
        o = self.owner
        try:
            self.tracker = tvm.rpc.connect_tracker(o.spec.host, o.spec.port)
            if o.closed:
                return None, None
            sess = self.tracker.request(o.spec.key, priority=o.priority, session_timeout=0, max_retry=2)
        except Exception as e:
            if not o.closed:
                o._note(f"{type(e).__name__}: {_one_line(e)}")
                time.sleep(1.0)
            return None, None
        finally:
            tracker, self.tracker = self.tracker, None
            if tracker is not None:
                tracker.close()
        try:
            return sess, sess.get_function(MEASURE_FUNC)
        except Exception:
            o._refuse(f"a server under key {o.spec.key!r} has no {MEASURE_FUNC} (a plain TVM server, or "
                      f"`python -m opcompiler.rpc` without a simulator target): start simulator servers with "
                      f"python -m opcompiler.rpc --tracker {o.spec.host}:{o.spec.port} --key {o.spec.key} "
                      f"--target TARGET")
            return None, None

    def interrupt(self) -> None:
        """Unblock a thread waiting on the tracker for a free server (at close)."""
        tracker = self.tracker
        if tracker is not None and getattr(tracker, "_sock", None) is not None:
            try:
                tracker._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _loop(self) -> None:
        o = self.owner
        sess = func = None
        while not o.closed and not self.abandoned:
            if func is None:
                self.connected = False
                sess = None
                sess, func = self._connect()
                if func is None:
                    continue
                self.connected = True
            try:
                task = o._todo.get(timeout=0.2)
            except queue.Empty:
                continue
            if task.gen != o._gen:
                continue  # left over from a batch that ended (an error, an interrupt)
            with o._lock:
                self.task, self.deadline = task, time.monotonic() + o.deadline_s
            try:
                kind, data = _parse(func(task.payload))
            except Exception as e:  # the session broke: the server died or dropped us
                kind, data = "lost", f"{type(e).__name__}: {_one_line(e)}"
                func = None
            with o._lock:
                if self.abandoned:
                    break
                self.task = None
                o._done.put((kind, task, data))
        self.connected = False
        sess = func = None  # noqa: F841  (dropping the session ends it: the server is free again)


def _parse(text: Any) -> tuple[str, Any]:
    try:
        ans = json.loads(str(text))
    except ValueError:
        return "lost", f"unreadable answer {str(text)[:80]!r}"
    if "result" in ans:
        return "result", MeasureResult(**ans["result"])
    if "refused" in ans:
        return "refused", ans["refused"]
    return "lost", f"server error: {ans.get('error', ans)}"


class RemoteMeasurer:
    """`Measurer.measure` for a simulator target on the servers a tracker has under a key."""

    topup_every = 2.0

    def __init__(self, target: Target, spec: Any, *, timeout: float = 60.0, startup_timeout: float = 120.0,
                 priority: int = 1, max_slots: int = 256):
        from ..rpc_spec import RpcSpec, parse_rpc
        self.spec: RpcSpec = parse_rpc(spec) if isinstance(spec, str) else spec
        self.target, self.timeout, self.startup_timeout = target, timeout, startup_timeout
        self.priority, self.max_slots = priority, max_slots
        self.deadline_s = timeout + SERVER_STARTUP + 10.0  # past it, the server is taken for hung
        self._content = Path(target.path).read_text(encoding="utf-8") if target.path else ""
        self._lock = threading.Lock()
        self._todo: queue.Queue[_Task] = queue.Queue()
        self._done: queue.Queue[tuple[str, _Task, Any]] = queue.Queue()
        self._slots: list[_Slot] = []
        self._gen = 0
        self._tracker: Any = None
        self._refused = ""
        self._last_note = ""
        self.closed = False
        self.resent = 0  # candidates re-sent after their server died or hung
        self._n, self._t, self._peak = 0, 0.0, 0
        self._probe()
        self._top_up()

    # -- the tracker --------------------------------------------------------------------------

    def _expected(self) -> str:
        return (f"a server registered under it: python -m opcompiler.rpc --tracker {self.spec.host}:{self.spec.port} "
                f"--key {self.spec.key}")

    def _summary(self) -> dict[str, Any]:
        import tvm
        for attempt in (0, 1):
            try:
                if self._tracker is None:
                    self._tracker = tvm.rpc.connect_tracker(self.spec.host, self.spec.port)
                return self._tracker.summary()
            except Exception:
                if self._tracker is not None:
                    self._tracker.close()
                self._tracker = None
                if attempt:
                    raise
        return {}

    def _probe(self) -> None:
        """One line, before anything is measured: no tracker there, or no server under the key."""
        try:
            socket.create_connection((self.spec.host, self.spec.port), timeout=5.0).close()
        except OSError as e:
            raise OpcError(f"cannot reach the RPC tracker ({e.strerror or e})", arg="--rpc", value=str(self.spec),
                           expected="a running tracker: python -m tvm.exec.rpc_tracker "
                           f"--host {self.spec.host} --port {self.spec.port}") from None
        deadline = time.monotonic() + 10.0  # a server that just started registers within a ping or two
        while True:
            info = self._summary()
            servers = [s for s in info.get("server_info", []) if s.get("key") == f"server:{self.spec.key}"]
            q = info.get("queue_info", {}).get(self.spec.key, {})
            if servers or q.get("free", 0):
                return
            if time.monotonic() > deadline:
                raise OpcError(f"the tracker has no server under key {self.spec.key!r}", arg="--rpc",
                               value=str(self.spec), expected=self._expected())
            time.sleep(0.5)

    def _free(self) -> int:
        try:
            return int(self._summary().get("queue_info", {}).get(self.spec.key, {}).get("free", 0))
        except Exception:
            return 0

    def _top_up(self) -> None:
        """One session per free server under the key (servers that joined since are used too)."""
        live = [s for s in self._slots if not s.abandoned and s.thread.is_alive()]
        waiting = sum(1 for s in live if not s.connected)
        add = max(0, self._free() - waiting)
        if not live:
            add = max(add, 1)
        add = min(add, self.max_slots - len(live))
        self._slots = live + [_Slot(self, len(self._slots) + k) for k in range(add)]
        self._peak = max(self._peak, len(self._slots))

    def _note(self, what: str) -> None:
        self._last_note = what

    def _refuse(self, why: str) -> None:
        self._refused = self._refused or why

    @property
    def parallelism(self) -> int:
        return max(1, sum(1 for s in self._slots if not s.abandoned))

    @property
    def stats(self) -> dict[str, Any]:
        rate = self._n / self._t if self._t > 0 else 0.0
        return {"candidates": self._n, "seconds": self._t, "candidates_per_second": rate,
                "rpc_servers": self._peak, "rpc_resent": self.resent}

    # -- measuring ----------------------------------------------------------------------------

    def _request(self, wl: Workload, verify: bool, seed: int) -> dict[str, Any]:
        from ..settings import __version__
        from ..ops import get_op
        from ..template import get_template
        tmpl = get_template(get_op(wl.op).family, self.target.family)
        return {"protocol": PROTOCOL, "opc_version": __version__,
                "workload": {"op": wl.op, "params": dict(wl.params), "dtype": wl.dtype},
                "target": {"name": self.target.name, "digest": self.target.digest, "content": self._content},
                "template": {"name": tmpl.name, "version": int(tmpl.version)},
                "verify": bool(verify), "seed": int(seed), "timeout": float(self.timeout)}

    def measure(self, wl: Workload, configs: Sequence[Mapping[str, Any]], verify: bool = False, seed: int = 0,
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure every config on the servers; results in input order, `on_result` as each arrives."""
        from ..records import jsonable
        if self.closed:
            raise OpcError("the remote measurer is closed")
        t0 = time.perf_counter()
        base = self._request(wl, verify, seed)
        results: list[MeasureResult | None] = [None] * len(configs)
        with self._lock:
            self._gen += 1
            gen = self._gen
        for i, c in enumerate(configs):
            self._todo.put(_Task(i, gen, json.dumps({**base, "config": dict(c)}, default=jsonable)))
        self._top_up()
        left, last_top_up, progress = len(configs), time.monotonic(), time.monotonic()
        try:
            while left:
                if self._refused:
                    raise OpcError(self._refused, arg="--rpc", value=str(self.spec))
                try:
                    kind, task, data = self._done.get(timeout=0.2)
                except queue.Empty:
                    now = time.monotonic()
                    self._abandon_hung(now)
                    if now - last_top_up > self.topup_every:
                        self._top_up()
                        last_top_up = now
                    if now - progress > self.startup_timeout and not any(s.connected for s in self._slots):
                        raise OpcError(f"no server under key {self.spec.key!r} took a candidate in "
                                       f"{self.startup_timeout:g} s" + (f" (last: {self._last_note})"
                                                                        if self._last_note else ""),
                                       arg="--rpc", value=str(self.spec), expected=self._expected())
                    continue
                if task.gen != gen:
                    continue
                progress = time.monotonic()
                if kind == "refused":
                    raise OpcError(str(data), arg="--rpc", value=str(self.spec))
                if kind == "lost":
                    task.sends += 1
                    task.lost.append(str(data))
                    if task.sends < MAX_SENDS:
                        self.resent += 1
                        self._todo.put(task)
                        continue
                    data = MeasureResult(status="crash", error=f"no answer from {MAX_SENDS} servers "
                                         f"(last: {task.lost[-1]})"[:300])
                results[task.i] = data
                left -= 1
                if on_result:
                    on_result(task.i, data)
        finally:
            with self._lock:
                self._gen += 1  # what is still queued or in flight belongs to no batch now
            while True:
                try:
                    self._todo.get_nowait()
                except queue.Empty:
                    break
            self._t += time.perf_counter() - t0
            self._n += sum(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _abandon_hung(self, now: float) -> None:
        """A candidate past its deadline: the server is taken for hung; the candidate goes to
        another one and a fresh session replaces this one."""
        for s in list(self._slots):
            with self._lock:
                task = s.task
                if task is None or s.abandoned or now < s.deadline:
                    continue
                s.abandoned = True
                s.task = None
            self._done.put(("lost", task, f"no answer within {self.deadline_s:g} s (server hung?)"))
            self._slots.remove(s)
            self._slots.append(_Slot(self, len(self._slots) + 100))

    def close(self) -> None:
        """End every session (the servers go back to the tracker's free list)."""
        self.closed = True
        for s in self._slots:
            s.interrupt()
        for s in self._slots:
            s.thread.join(timeout=2.0)
        self._slots = []
        if self._tracker is not None:
            try:
                self._tracker.close()
            except Exception:
                pass
            self._tracker = None


__all__ = ["RemoteMeasurer", "MEASURE_FUNC", "PROTOCOL"]
