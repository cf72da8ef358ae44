"""The one evaluator of TIR expressions both simulated machines use.

A `PrimExpr` is compiled once into a Python function `f(E, L)` over numpy: `E` maps a variable's
handle (`var.__chandle__()`) to its value (a Python int, or a numpy array over a loop grid, so one
call evaluates every iteration at once), and `L(buffer_key, flat_index)` reads a buffer (given
only where the expression loads). The semantics are TIR's:

* `FloorDiv` / `FloorMod` round toward minus infinity (numpy's `floor_divide` / `mod`);
* `Div` / `Mod` on integers truncate toward zero (TVM's `truncdiv` / `truncmod`), on floats
  `Div` is true division and `Mod` C's `fmod`: the two nodes are distinct, and integer `Div`
  only equals `FloorDiv` where the operands have the same sign;
* `And` / `Or` / `Not` are logical, `Min` / `Max` elementwise, `Select` and `if_then_else`
  choose elementwise (both sides are evaluated), `Cast` keeps the value, `Let` binds.

`integer=True` compiles integer / boolean expressions only (a float immediate or a cast to a
non-integer type, where floats come from, has no rule), for evaluators that fall back to running
the code otherwise.
An expression with no rule raises `NoRule` (an `OpcFailure`).

ascend-sim evaluates a schedule's event arguments with it (`backend/ascend/lower/trace.py`),
dsp-sim its loop bounds, predicates, indices and micro-kernel bodies (`backend/dsp/lower/eval.py`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import OpcFailure

__all__ = ["NoRule", "Compiler", "compile_expr", "truncdiv", "truncmod", "TIR"]


class _TirNodes:
    """TVM's TIR node classes, for `isinstance` dispatch on the real classes: `TIR.For`,
    `TIR.SeqStmt`, `TIR.SBlockRealize`, `TIR.TensorLoad` (a buffer load in TVM 0.27), `TIR.Call`,
    ... Each is looked up once, in `tvm.tirx`, `tvm.s_tir` then `tvm.ir`, on first use: importing
    the simulators does not import TVM."""

    def __getattr__(self, name: str) -> type:
        from tvm import ir, s_tir, tirx

        for mod in (tirx, s_tir, ir):
            cls = getattr(mod, name, None)
            if isinstance(cls, type):
                setattr(self, name, cls)  # later uses read the instance attribute directly
                return cls
        raise AttributeError(f"no TIR node class {name}")


TIR = _TirNodes()


class NoRule(OpcFailure):
    """An expression the evaluator has no rule for."""


def truncdiv(a, b):
    """Integer division rounding toward zero (TIR `Div` on integers)."""
    q = np.floor_divide(a, b)
    return q + ((np.mod(a, b) != 0) & ((np.sign(a) * np.sign(b)) < 0))


def truncmod(a, b):
    """The remainder of `truncdiv`: the sign of the dividend (TIR `Mod` on integers)."""
    return a - truncdiv(a, b) * b


def _let(E: dict, k: int, v: Any) -> dict:
    out = type(E)(E)  # the same kind of mapping (a default for unbound variables survives)
    out[k] = v
    return out


_NAMESPACE = {"np": np, "_tdiv": truncdiv, "_tmod": truncmod, "_let": _let}


def _is_float(e) -> bool:
    ty = getattr(e, "ty", None)  # a PrimExpr's dtype (TVM 0.27 names it `ty`)
    return ty is not None and str(ty).startswith(("float", "bfloat"))


def _is_int_type(ty) -> bool:
    t = str(ty)
    return t.startswith("int") or t.startswith("uint") or t == "bool"


_RULES: dict[type, Callable[[Compiler, Any], str]] = {}  # TIR node class -> its rule (filled on first use:
# TVM is imported lazily)


def _rules() -> dict[type, Callable[[Compiler, Any], str]]:
    """`Compiler.src`'s rules, keyed by the TVM node class itself (looked up with the node's exact
    class, one rule per node kind)."""
    if not _RULES:
        from tvm import ir, tirx

        infix = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.LT: "<", tirx.LE: "<=", tirx.GT: ">",
                 tirx.GE: ">=", tirx.EQ: "==", tirx.NE: "!="}
        func = {tirx.FloorDiv: "np.floor_divide", tirx.FloorMod: "np.mod", tirx.Min: "np.minimum",
                tirx.Max: "np.maximum", tirx.And: "np.logical_and", tirx.Or: "np.logical_or"}
        _RULES.update({cls: (lambda c, e, op=op: f"({c.src(e.a)} {op} {c.src(e.b)})") for cls, op in infix.items()})
        _RULES.update({cls: (lambda c, e, f=f: f"{f}({c.src(e.a)}, {c.src(e.b)})") for cls, f in func.items()})
        _RULES.update({tirx.IntImm: Compiler._int, tirx.FloatImm: Compiler._float, ir.StringImm: Compiler._str,
                       tirx.Var: Compiler._var, tirx.Div: Compiler._div, tirx.Mod: Compiler._mod,
                       tirx.Not: Compiler._not, tirx.Select: Compiler._select, tirx.Cast: Compiler._cast,
                       ir.Call: Compiler._call, tirx.Let: Compiler._let, ir.TensorLoad: Compiler._load})
    return _RULES


class Compiler:
    """PrimExpr -> Python source over `E` (variables by handle) and `L` (buffer loads), and that
    source as a function. `strides(buffer_key)` gives a loaded buffer's strides in elements
    (None: loads have no rule). The source names variables and buffers by their place in `H`
    (their handles, in order of appearance), so expressions of the same shape share one compiled
    function (`_FACTORIES`) across schedules: only the handles differ."""

    def __init__(self, strides: Callable[[int], tuple[int, ...]] | None = None, *, integer: bool = False):
        self.strides, self.integer = strides, integer
        self._handles: dict[int, int] | None = None  # while compiling a function: handle -> place in H

    def _h(self, handle: int) -> str:
        """A handle in the source: its place in `H` inside a compiled function, the handle
        itself in `src` called directly (`E[<handle>]`: callers may search the text for it)."""
        if self._handles is None:
            return str(handle)
        i = self._handles.setdefault(handle, len(self._handles))
        return f"H[{i}]"

    def flat(self, bk: int, indices) -> str:
        if self.strides is None:
            raise NoRule("tir lowering: no rule for a buffer load here")
        st = self.strides(bk)
        return "(" + " + ".join(f"({self.src(i)})*{s}" for i, s in zip(indices, st)) + ")" if st else "0"

    def src(self, e) -> str:
        rule = (_RULES or _rules()).get(type(e))
        out = rule(self, e) if rule is not None else None
        if out is None:
            raise NoRule(f"tir lowering: no rule for {type(e).__name__} ({e})")
        return out

    # the rules (None: no rule for this node here)
    def _int(self, e) -> str:
        return str(int(e.value))

    def _float(self, e) -> str | None:
        return None if self.integer else repr(float(e.value))  # integers only: where floats come from

    def _str(self, e) -> str:
        return repr(e.value)

    def _var(self, e) -> str:
        return f"E[{self._h(e.__chandle__())}]"

    def _div(self, e) -> str:
        a, b = self.src(e.a), self.src(e.b)
        return f"({a} / {b})" if _is_float(e) else f"_tdiv({a}, {b})"

    def _mod(self, e) -> str:
        a, b = self.src(e.a), self.src(e.b)
        return f"np.fmod({a}, {b})" if _is_float(e) else f"_tmod({a}, {b})"

    def _not(self, e) -> str:
        return f"np.logical_not({self.src(e.a)})"

    def _select(self, e) -> str:
        return f"np.where({self.src(e.condition)}, {self.src(e.true_value)}, {self.src(e.false_value)})"

    def _cast(self, e) -> str | None:
        return self.src(e.value) if not self.integer or _is_int_type(e.ty) else None

    def _call(self, e) -> str | None:
        if not (hasattr(e.op, "name") and e.op.name.endswith("if_then_else")):
            return None
        a = e.args
        return f"np.where({self.src(a[0])}, {self.src(a[1])}, {self.src(a[2])})"

    def _let(self, e) -> str:
        value = self.src(e.value)
        return f"(lambda E: {self.src(e.body)})(_let(E, {self._h(e.var.__chandle__())}, {value}))"

    def _load(self, e) -> str:
        x = e.source if hasattr(e, "source") else e.buffer
        bk = x.__chandle__()
        return f"L({self._h(bk)}, {self.flat(bk, e.indices)})"

    def _function(self, make: Callable[[], str]) -> Callable:
        self._handles = {}
        try:
            code = make()
            handles = tuple(self._handles)
        finally:
            self._handles = None
        factory = _FACTORIES.get(code)
        if factory is None:
            if len(_FACTORIES) >= FACTORY_CACHE:
                _FACTORIES.clear()
            factory = _FACTORIES[code] = eval(f"lambda H: lambda E, L: {code}", _NAMESPACE)  # our own source
        return factory(handles)

    def flat_fn(self, bk: int, indices) -> Callable:
        """The flat element index of `indices` into buffer `bk`, as a function `f(E, L)`."""
        return self._function(lambda: self.flat(bk, indices))

    def fn(self, e) -> Callable:
        """`e` as a function `f(E, L)`."""
        return self._function(lambda: self.src(e))


FACTORY_CACHE = 8192  # compiled expression shapes kept (all dropped when full)
_FACTORIES: dict[str, Callable] = {}


def compile_expr(e, strides: Callable[[int], tuple[int, ...]] | None = None, *, integer: bool = False) -> Callable:
    """`e` as a function `f(E, L)` (see the module docstring)."""
    return Compiler(strides, integer=integer).fn(e)
