"""The server side of simulated measurement over TVM's RPC tracker (the client is `remote.py`):
`python -m opcompiler.rpc --key ascend-sim` calls `server_init`, which registers
`opcompiler.sim.measure`; each request is a candidate as data, measured in a worker process
forked from the warm server (`measure.Measurer`), and refused when its target digest or template
version is not this server's. Kept apart from the client so that `measure` (which delegates to the
client) and this module (which measures with `measure`) import one way."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping

from ..target import Target, load_target
from ..workload import Workload
from .process import _one_line
from .remote import MEASURE_FUNC, PROTOCOL, SERVER_STARTUP


# ------------------------------------------------------------------ the server side

_SERVED: dict[str, Any] = {}  # this process's target; in a session process also its Measurer


def server_init(target_path: str) -> None:
    """TVM's `server_init_callback`: runs in the server process before it listens. Loads the
    target, imports what every candidate needs (each session is a fork of this process, so it
    starts warm) and registers `opcompiler.sim.measure` (inherited by every session)."""
    import tvm_ffi

    from .. import schedules  # noqa: F401  (every shipped template imported once, before any session forks: warm)
    from ..backend import get_backend
    from ..ops import catalogue  # noqa: F401  (the op registry)
    target = load_target(target_path)
    get_backend(target)
    _SERVED.clear()
    _SERVED["target"] = target
    _SERVED["content"] = Path(target.path).read_text(encoding="utf-8") if target.path else ""
    tvm_ffi.register_global_func(MEASURE_FUNC, measure_request, override=True)
    _keep_server_alive()


def _keep_server_alive() -> None:
    """TVM's server raises out of its accept loop (and so stops serving) when a session process
    exits with an error, which is what a client that goes away mid-candidate (Ctrl-C, a deadline)
    causes. A session that ends, however it ends, must leave the server serving."""
    import tvm.rpc.server as srv
    if getattr(srv._serve_loop, "_opc_safe", False):
        return
    original = srv._serve_loop

    def serve_loop(sock: Any, load_library: Any, work_path: Any) -> None:
        try:
            original(sock, load_library, work_path)
        except BaseException:  # the client is gone; nothing to answer
            pass
        finally:
            _close_measurer()
        os._exit(0)

    serve_loop._opc_safe = True  # type: ignore[attr-defined]
    srv._serve_loop = serve_loop


def _close_measurer() -> None:
    m = _SERVED.pop("measurer", None)
    if m is not None:
        try:
            m.close()
        except Exception:
            pass


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(doc, list) and doc and all(isinstance(v, dict) and "name" in v for v in doc):
        return _flat({str(v["name"]): v for v in doc}, prefix)  # [[memory]] by name
    return {prefix: doc}


def _figure_diff(mine: str, theirs: str, limit: int = 4) -> str:
    """The figures (dotted keys) whose values differ between two target files' contents."""
    import tomllib

    from ..target import _values_only
    try:
        a, b = (_flat(_values_only(tomllib.loads(t))) for t in (mine, theirs))
    except Exception:
        return ""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    shown = [f"{k} {b.get(k, '(absent)')!r} sent, {a.get(k, '(absent)')!r} here" for k in keys[:limit]]
    return "; ".join(shown) + (f"; {len(keys) - limit} more" if len(keys) > limit else "")


def refusal(req: Mapping[str, Any], target: Target, content: str = "") -> str:
    """Why this server will not measure `req` ('' when it will): another protocol, another target
    (its digest), an op it does not know, or another template (name or version)."""
    from ..settings import __version__
    where = f"the server on {socket.gethostname()} (opcompiler {__version__}, target {target.name} {target.digest})"
    if req.get("protocol") != PROTOCOL:
        return f"{where} speaks measurement protocol {PROTOCOL}, the client {req.get('protocol')!r}"
    sent = req.get("target") or {}
    if sent.get("digest") != target.digest:
        diff = _figure_diff(content, sent.get("content") or "") if content and sent.get("content") else ""
        return (f"{where} refuses a candidate for target {sent.get('name')!r} digest {sent.get('digest')!r}: "
                f"the target descriptions differ" + (f" ({diff})" if diff else "")
                + "; start servers for that target (python -m opcompiler.rpc --target FILE) or tune for theirs")
    wl = req.get("workload") or {}
    tmpl = req.get("template") or {}
    try:
        from ..ops import get_op
        from ..template import get_template
        mine = get_template(get_op(wl.get("op")).family, target.family)
    except Exception as e:
        return f"{where} cannot measure op {wl.get('op')!r}: {_one_line(e)}"
    if (mine.name, int(mine.version)) != (tmpl.get("name"), tmpl.get("version")):
        return (f"{where} refuses a candidate for template {tmpl.get('name')} version {tmpl.get('version')} "
                f"(client opcompiler {req.get('opc_version')}): it has {mine.name} version {mine.version}; "
                "run the same opcompiler on both sides")
    return ""


def _session_measurer(timeout: float) -> Any:
    """This session's Measurer: one worker process forked from the (warm) session process."""
    import multiprocessing as mp

    from .measure import BackendSpec, Measurer
    m = _SERVED.get("measurer")
    if m is None:
        m = Measurer(BackendSpec(target=_SERVED["target"]), workers=1, timeout=timeout,
                     startup_timeout=SERVER_STARTUP, context=mp.get_context("fork"))
        _SERVED["measurer"] = m
    m.timeout = timeout
    return m


def measure_request(text: str) -> str:
    """`opcompiler.sim.measure`: one candidate as JSON in, `{"result": MeasureResult}`,
    `{"refused": why}` or `{"error": what}` as JSON out."""
    from ..records import jsonable
    try:
        req = json.loads(text)
        target = _SERVED["target"]
        why = refusal(req, target, _SERVED.get("content", ""))
        if why:
            return json.dumps({"refused": why})
        w = req["workload"]
        wl = Workload.make(w["op"], w["params"], w["dtype"])
        m = _session_measurer(float(req.get("timeout", 60.0)))
        res = m.measure(wl, [req["config"]], verify=bool(req.get("verify")), seed=int(req.get("seed", 0)))[0]
        return json.dumps({"result": dataclasses.asdict(res)}, default=jsonable)
    except Exception as e:
        return json.dumps({"error": f"{type(e).__name__}: {_one_line(e)}"})


__all__ = ["measure_request", "refusal", "server_init"]
