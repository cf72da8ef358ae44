"""The event stream of a scheduled Ascend kernel: what `cube`'s instruction blocks would
record if the kernel ran.

Every instruction block of a template's schedule is a `T.call_packed(EVENT, tag, ...)` carrying
the offsets / block coordinates TVM computed. `trace` lowers the module as `tvm.compile` does
for LLVM and evaluates the lowered function in vectorised form (each loop nest a table of its
iterations, event arguments numpy arrays, the events put in program order by one sort); a
function the evaluation does not model (a buffer load in an argument, parallel loops, loop
steps, a `return` inside a loop) is compiled by LLVM and run on zero inputs, with the callback
recording the events. Streams are cached per process under a key naming everything the
schedule depends on.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ....sim.tir_expr import Compiler, NoRule
from ..intrin import EVENT

_EVENTS: list[tuple] = []  # filled while a compiled kernel runs
TRACES: dict[Hashable, list[tuple]] = {}  # trace key -> recorded events (traced once per process)
TRACE_CACHE = 512  # streams kept (oldest dropped first)
_REGISTERED: set[str] = set()


def _callbacks() -> None:
    import tvm

    if "callbacks" in _REGISTERED:
        return

    def event(*args: Any) -> int:
        _EVENTS.append(tuple(a if isinstance(a, str) else int(a) for a in args))
        return 0

    tvm.register_global_func(EVENT, event, override=True)
    _REGISTERED.add("callbacks")


class _Opaque(Exception):
    """The lowered function holds something the vectorised evaluation does not model."""


def _call_name(e) -> str:
    from tvm import ir

    return e.op.name if isinstance(e, ir.Call) and hasattr(e.op, "name") else ""


def _is_event(stmt) -> bool:
    from tvm import ir, tirx

    if not isinstance(stmt, tirx.Evaluate) or _call_name(stmt.value) != "tirx.tvm_call_packed":
        return False
    head = stmt.value.args[0]
    return isinstance(head, ir.StringImm) and head.value == EVENT


_INT = Compiler(integer=True)  # the simulator core's one TIR expression evaluator, integers only


def _value(e, env: dict[int, Any]):
    """An integer / boolean PrimExpr over the rows of `env` (loop and let variables by handle:
    a numpy array per row, or a Python int where every row agrees), by `opcompiler.sim.tir_expr`
    (TIR's semantics: `Div` / `Mod` truncate, `FloorDiv` / `FloorMod` floor)."""
    try:
        return _INT.fn(e)(env, None)
    except NoRule as x:
        raise _Opaque(str(x)) from None
    except KeyError as x:  # an unbound variable: a handle, or a let whose value could not be evaluated
        raise _Opaque(f"variable {x}") from None


def _bind(env: dict[int, Any], var, v) -> None:
    """Bind `var` to `v` in `env` (None: its value could not be evaluated: left unbound)."""
    if v is None:
        env.pop(var.__chandle__(), None)
    else:
        env[var.__chandle__()] = v


class _Rows:
    """The dynamic instances of one statement: `n` rows, the variables bound over them and each
    row's path through the statement tree (its sort key)."""

    __slots__ = ("n", "env", "path")

    def __init__(self, n: int, env: dict[int, Any], path: list[Any]):
        self.n, self.env, self.path = n, env, path

    def take(self, rows: np.ndarray) -> _Rows:
        pick = lambda v: v[rows] if isinstance(v, np.ndarray) else v  # noqa: E731
        return _Rows(len(rows), {k: pick(v) for k, v in self.env.items()}, [pick(p) for p in self.path])


def _has_event(stmt) -> bool:
    """Whether an event is issued anywhere under `stmt` (TVM's structural walk, stopped at the
    first event)."""
    import tvm_ffi
    from tvm import tirx

    stop = lambda ev: tvm_ffi.VisitInterrupt(True) if _is_event(ev) else None  # noqa: E731
    return tvm_ffi.structural_walk(stmt, (tirx.Evaluate, stop), order="pre") is not None


_IN_ORDER = (0, 3)  # ForKind.SERIAL, ForKind.UNROLLED: iterations run one after another


def _plain() -> tuple[type, ...]:
    """Statements that record nothing themselves (a load of what a store wrote is opaque in `_value`)."""
    from tvm import tirx

    return tirx.AttrStmt, tirx.DeclBuffer, tirx.AllocBuffer, tirx.AssertStmt, tirx.BufferStore


def _walk(stmt, rows: _Rows, out: list[tuple[list[Any], int, list[Any]]]) -> bool:
    """Every event under `stmt` over `rows`: (row paths, row count, argument values) into `out`.
    A `Bind` defines its variable for the statements after it: it updates `rows.env`. Returns
    whether `stmt` ends in the function's `return` (taken only outside loops and branches)."""
    from tvm import tirx

    if rows.n == 0:
        return False
    if isinstance(stmt, tirx.SeqStmt):
        scope = _Rows(rows.n, dict(rows.env), rows.path)
        for i, s in enumerate(stmt.seq):
            if _walk(s, _Rows(rows.n, scope.env, [*rows.path, i]), out):
                return True
    elif isinstance(stmt, tirx.For):
        if int(stmt.kind) not in _IN_ORDER:  # parallel / vector / thread loops: no single order
            raise _Opaque(f"{stmt.kind!r} loop")
        if stmt.step is not None and not (isinstance(stmt.step, tirx.IntImm) and stmt.step.value == 1):
            raise _Opaque(f"loop step {stmt.step}")
        lo = _value(stmt.min, rows.env)
        ext = np.broadcast_to(np.maximum(_value(stmt.extent, rows.env), 0), (rows.n,))
        row = np.repeat(np.arange(rows.n), ext)
        it = np.arange(len(row)) - np.repeat(np.cumsum(ext) - ext, ext)
        inner = rows.take(row)
        inner.env[stmt.loop_var.__chandle__()] = (lo[row] if isinstance(lo, np.ndarray) else lo) + it
        inner.path.append(it)
        if _walk(stmt.body, inner, out):
            raise _Opaque("return inside a loop")
    elif isinstance(stmt, tirx.IfThenElse):
        if not _has_event(stmt):
            return False
        cond = np.broadcast_to(np.asarray(_value(stmt.condition, rows.env), bool), (rows.n,))
        if _walk(stmt.then_case, rows.take(np.flatnonzero(cond)), out) or (
                stmt.else_case is not None and _walk(stmt.else_case, rows.take(np.flatnonzero(~cond)), out)):
            raise _Opaque("return inside a branch")
    elif isinstance(stmt, tirx.Bind):  # (TVM 0.27's `LetStmt` is this class: no body)
        try:
            v = _value(stmt.value, rows.env)
        except _Opaque:
            v = None  # a handle (the packed API's argument unpacking): an error only where used
        _bind(rows.env, stmt.var, v)
    elif isinstance(stmt, tirx.Evaluate):
        if _is_event(stmt):
            out.append((rows.path, rows.n, [_value(a, rows.env) for a in stmt.value.args[1:]]))
        elif _call_name(stmt.value):
            raise _Opaque(f"call {_call_name(stmt.value)}")
    elif isinstance(stmt, tirx.Return):
        return True
    elif isinstance(stmt, _plain()):
        if hasattr(stmt, "body"):
            return _walk(stmt.body, _Rows(rows.n, dict(rows.env), rows.path), out)
    else:
        raise _Opaque(type(stmt).__name__)
    return False


def _evaluate(func) -> list[tuple]:
    """The event stream of the lowered PrimFunc `func`, in program order. Rather than compile it
    with LLVM and run it (the JIT alone cost about 45 ms a candidate), the function is executed
    in vectorised form: every loop nest becomes a table of its iterations (one numpy array per
    loop variable), each event's arguments are evaluated over the rows of its nest at once, and
    the events are put in program order by sorting the rows on their path through the statement
    tree (statement index, loop value, ...). A function it has no rule for raises `_Opaque`."""
    sites: list[tuple[list[Any], int, list[Any]]] = []
    _walk(func.body, _Rows(1, {}, []), sites)
    if not sites:
        return []
    depth = max(len(p) for p, _, _ in sites)
    total = sum(n for _, n, _ in sites)
    keys = np.full((depth + 1, total), -1, np.int64)
    events: list[tuple] = []
    at = 0
    for i, (path, n, args) in enumerate(sites):
        for d, p in enumerate(path):
            keys[d, at:at + n] = p
        keys[depth, at:at + n] = i  # never decides: two sites' paths differ before they end
        if any(isinstance(a, str) for a in args[1:]):
            raise _Opaque("a string event argument after the tag")
        cols = [np.broadcast_to(np.asarray(a, np.int64), (n,)).tolist() for a in args[1:]]
        events += [(args[0], *vals) for vals in zip(*cols)] if cols else [(args[0],)] * n
        at += n
    order = np.lexsort(keys[::-1])
    return [events[i] for i in order.tolist()]


def _lower(mod):
    """`mod` through the lowering passes `tvm.compile` runs for an LLVM CPU target (no codegen)."""
    import tvm

    target = _llvm_o0()
    mod = tvm.tirx.transform.BindTarget(target.with_host(target))(mod)
    pipeline, _, _ = tvm.tirx.get_tir_pipeline("default")
    return pipeline(mod)


def _llvm_o0():
    """The CPU target the trace is defined on: LLVM without optimisation (the kernel runs once)."""
    import tvm

    return tvm.target.Target({"kind": "llvm", "opt-level": 0})


def _run_llvm(mod, arg_specs) -> list[tuple]:
    """The event stream of a native run: `mod` compiled by LLVM (-O0) and run once on zeros."""
    import tvm

    _callbacks()
    ex = tvm.compile(mod, target=_llvm_o0())
    args = [tvm.runtime.tensor(np.zeros(shape, dtype)) for shape, dtype in arg_specs]
    _EVENTS.clear()
    ex(*args)
    events = list(_EVENTS)
    _EVENTS.clear()
    return events


def trace(key: Hashable, schedule: Callable[[], tuple[Any, list[tuple[tuple[int, ...], str]]]]) -> list[tuple]:
    """The event stream of the kernel `schedule()` builds (a scheduled IRModule and the
    (shape, dtype) of each argument), as a native run on zeros records it: the lowered function
    evaluated in vectorised form, or compiled and run where it holds what that does not model.
    Cached by `key`, which must name everything the schedule depends on (at most `TRACE_CACHE`
    streams: a tuning run sees many tile shapes)."""
    if key in TRACES:
        return TRACES[key]
    mod, arg_specs = schedule()
    try:
        (func,) = _lower(mod).functions.values()
        events = _evaluate(func)
    except _Opaque:
        events = _run_llvm(mod, arg_specs)
    if len(TRACES) >= TRACE_CACHE:
        TRACES.pop(next(iter(TRACES)))
    TRACES[key] = events
    return events
