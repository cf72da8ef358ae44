"""Instruction selection for vector nests (`lower/vector.py`): one stored expression -> VPU instructions.

`Select` walks the expression a vector nest stores and emits `program.VI`s with ("mem", i)
placeholders for the nest's accesses (the store first): loads (`vld` from AM, `sld` from SM,
broadcast), constants as immediates, `a * b + c` as one vfma (b and c both immediates or both
per-channel loads), `+ - * max min` as vadd / vsub / vmul / vmax / vmin, `exp`, `log`, `1 / x` and
`1 / sqrt(x)` as the math-library sequences (`program.emit_exp`, `emit_log`, `emit_rcp`,
`emit_rsqrt`). Inner nodes live in pool temporaries v0, v1, ... (freed when their last reader has
issued; a one-instruction node overwrites an operand that dies there); a binary node's second
operand, when a load, gets a register named by its role (full-shape vectors alternate f0 / f1, a
per-channel operand p), an FMA's two per-channel operands two temporaries. `RowSelect` is the row
nests' variant (a division by a buffer holding its reciprocal is a multiplication). `reduce_ops` and
`combine_ops` are the reduction sequences the window and row nests append (taps through rotating
registers; a tree over accumulators).

It knows the lowering only through what it is given (`NestContext`: the buffers' spaces, shapes,
names and index functions, the per-nest cache, the reciprocal buffers), so it imports nothing above
it: `lower/vector.py` (whose VecLowerer is such a context), `lower/vscan.py` and `lower/vwindow.py`
import it, and the imports run one way.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .. import program as vx  # the VPU's vector instructions
from .eval import buf_key


class NestContext(Protocol):
    """What instruction selection and the nest analysis (`lower.vscan`) read of the lowering that
    calls them: buffer shapes and names, the index compiler, the per-nest cache, a buffer's
    place (`_sp`: (level, ...)), the buffers holding a reciprocal (`_recip`)."""

    shapes: dict
    names: dict
    comp: Any
    _cache: dict
    _recip: Any

    def _sp(self, bk: int) -> tuple: ...

POOL = "pool"  # an operand register taken from the temporaries (an FMA's per-channel operands)
_ARITH: dict[type, str] = {}  # TIR node class -> its VPU instruction (filled on first use: TVM loads lazily)
_COMMUTES: set[type] = set()  # ... whose operands may be swapped
_FOLD: dict[type, Any] = {}  # ... -> its numpy function (constant folding)


def _tables() -> None:
    if not _ARITH:
        _ARITH.update({TIR.Add: "vadd", TIR.Sub: "vsub", TIR.Mul: "vmul", TIR.Max: "vmax", TIR.Min: "vmin"})
        _COMMUTES.update({TIR.Add, TIR.Mul, TIR.Max, TIR.Min})
        _FOLD.update({TIR.Add: np.add, TIR.Sub: np.subtract, TIR.Mul: np.multiply, TIR.Div: np.divide,
                      TIR.Max: np.maximum, TIR.Min: np.minimum})


class Select:
    """Instruction selection for one stored expression (see the module docstring)."""

    def __init__(self, low: NestContext, name: str, store):
        self.low, self.name, self.store = low, name, store
        self.out_shape = low.shapes.get(buf_key(store))
        self.accesses: list[tuple] = []
        self.code: list[vx.VI] = []
        self.live: list[str] = []  # pool temporaries in use
        self.made = 0
        self.fulls = 0

    def fail(self, what: str) -> OpcFailure:
        return OpcFailure(f"tir lowering: {self.name}: {what}")

    def run(self) -> None:
        self.access(self.store, store=True)
        r = self.reg(self.store.value)
        self.code.append(vx.VI("vst", ("mem", 0), (r,)))

    # registers
    def temp(self) -> str:
        names = [f"v{i}" for i in range(self.made + 1)]
        r = next(n for n in names if n not in self.live)
        self.made = max(self.made, int(r[1:]) + 1)
        self.live.append(r)
        return r

    def free(self, r) -> None:
        if r in self.live:
            self.live.remove(r)

    def access(self, e, store: bool = False) -> tuple:
        bk = buf_key(e)
        sp = self.low._sp(bk)
        if sp[0] not in ("AM", "SM"):
            raise self.fail(f"{'writes' if store else 'reads'} {self.low.names.get(bk)} in {sp[0]}: vector "
                            "instructions address AM and SM (cache_read / cache_write it there)")
        if store and sp[0] != "AM":
            raise self.fail("stores go to AM")
        self.accesses.append((bk, self.low.comp.flat_fn(bk, e.indices), sp[0]))
        return ("mem", len(self.accesses) - 1)

    def load(self, e, dst: str) -> str:
        m = self.access(e)
        self.code.append(vx.VI("sld" if self.accesses[m[1]][2] == "SM" else "vld", dst, (m,)))
        return dst

    @staticmethod
    def const(e) -> float | None:
        _tables()
        kind = type(e)
        if isinstance(e, (TIR.FloatImm, TIR.IntImm)):
            return float(e.value)
        if isinstance(e, TIR.Cast) and isinstance(e.value, (TIR.FloatImm, TIR.IntImm)):
            return float(e.value.value)
        if kind in _FOLD:  # arithmetic of constants TVM left unfolded (x*0 + 3 -> 0 + 3): its fp32 value
            a, b = Select.const(e.a), Select.const(e.b)
            if a is not None and b is not None and not (isinstance(e, TIR.Div) and b == 0.0):
                return float(_FOLD[kind](np.float32(a), np.float32(b)))
        return None

    def is_load(self, e) -> bool:
        return isinstance(e, TIR.TensorLoad)

    def full(self, e) -> bool:
        return self.low.shapes.get(buf_key(e)) == self.out_shape

    def operand(self, e, role: str | None = None) -> Any:
        """The second operand of a node: an immediate, a load into its role register, or a
        subexpression in a temporary."""
        c = self.const(e)
        if c is not None:
            return c
        if self.is_load(e):
            if self.full(e):
                self.fulls += 1
                return self.load(e, f"f{(self.fulls - 1) % 2}")
            return self.load(e, self.temp() if role == POOL else role or "p")
        return self.reg(e)

    def into(self, src: str) -> str:
        """The destination of a one-instruction node reading `src`: src itself when it is a
        temporary (it dies here), else a new temporary."""
        return src if src in self.live else self.temp()

    def reg(self, e) -> str:
        """Instructions leaving e's value in a register (a temporary) it returns."""
        _tables()
        kind = type(e)
        if self.is_load(e):
            return self.load(e, self.temp())
        if isinstance(e, TIR.Cast):
            if str(e.dtype) != "float32" or str(e.value.dtype) != "float32":
                raise self.fail(f"no conversion {e.value.dtype} -> {e.dtype} on the VPU (fp32 only)")
            return self.reg(e.value)
        if self.const(e) is not None:
            r = self.temp()
            self.code.append(vx.VI("vmov", r, (self.const(e),)))
            return r
        if isinstance(e, TIR.Call):
            op = e.op.name
            if op in ("tirx.exp", "tirx.log"):
                src = self.reg(e.args[0])
                dst = self.temp()
                self.code += vx.emit_exp(src, dst, "r", "n") if op == "tirx.exp" else vx.emit_log(src, dst, "n")
                self.free(src)
                return dst
            raise self.fail(f"no vector instruction for {op}")
        if isinstance(e, TIR.Div):
            if self.const(e.a) == 1.0:
                return self.rcp(e.b)
            c = self.const(e.b)
            if c is not None and c != 0.0:
                src = self.reg(e.a)
                dst = self.into(src)
                self.code.append(vx.VI("vmul", dst, (src, 1.0 / c)))
                return dst
            src = self.reg(e.a)
            r = self.rcp(e.b)
            dst = self.into(src)
            self.code.append(vx.VI("vmul", dst, (src, r)))
            self.free(r)
            return dst
        if kind not in _ARITH:
            raise self.fail(f"no vector instruction for {kind.__name__} ({e})")
        a, b = e.a, e.b
        if kind in _COMMUTES and self.const(a) is not None:
            a, b = b, a
        if self.const(a) is not None:  # c - x
            if not isinstance(e, TIR.Sub):
                raise self.fail(f"constant expression not folded: {e}")
            src = self.reg(b)
            dst = self.into(src)
            self.code += [vx.VI("vmul", dst, (src, -1.0)), vx.VI("vadd", dst, (dst, self.const(a)))]
            return dst
        if isinstance(e, TIR.Add) and isinstance(b, TIR.Mul) and not isinstance(a, TIR.Mul):
            a, b = b, a
        if isinstance(e, TIR.Add) and isinstance(a, TIR.Mul) and self.fma(a.b, b):
            src = self.reg(a.a)
            m = self.operand(a.b, POOL)
            c = self.operand(b, POOL)
            dst = self.into(src)
            self.code.append(vx.VI("vfma", dst, (src, m, c)))
            for r in (m, c):
                if isinstance(r, str):
                    self.free(r)
            return dst
        src = self.reg(a)
        y = self.operand(b)
        dst = self.into(src)
        self.code.append(vx.VI(_ARITH[kind], dst, (src, y)))
        if isinstance(y, str):
            self.free(y)
        return dst

    def fma(self, m, c) -> bool:
        """a * m + c is one FMA when m and c are both immediates or both per-channel loads."""
        if self.const(m) is not None and self.const(c) is not None:
            return True
        return self.is_load(m) and self.is_load(c) and not self.full(m) and not self.full(c)

    def rcp(self, d) -> str:
        """1 / d: the reciprocal sequence, or 1 / sqrt(x) the reciprocal square root's."""
        root = isinstance(d, TIR.Call) and d.op.name == "tirx.sqrt"
        src = self.reg(d.args[0] if root else d)
        dst, scratch = self.temp(), self.temp()
        if root:
            half = self.temp()
            self.code += vx.emit_rsqrt(src, dst, scratch, half)
            self.free(half)
        else:
            self.code += vx.emit_rcp(src, dst, scratch)
        self.free(scratch)
        self.free(src)
        return dst


class RowSelect(Select):
    """`Select`, with x / d a multiplication when d's buffer holds its reciprocal (`_recip`)."""

    def reg(self, e) -> str:
        if isinstance(e, TIR.Div) and is_buffer_load(e.b) and buf_key(e.b) in self.low._recip:
            src = self.reg(e.a)
            y = self.operand(e.b)
            dst = self.into(src)
            self.code.append(vx.VI("vmul", dst, (src, y)))
            if isinstance(y, str):
                self.free(y)
            return dst
        return super().reg(e)


def reduce_ops(op: str, taps: list) -> list:
    """acc <- op over the taps, loads rotating over 4 registers."""
    out = [vx.VI("vld", "acc", (taps[0],))]
    for t, m in enumerate(taps[1:]):
        r = f"x{t % 4}"
        out += [vx.VI("vld", r, (m,)), vx.VI(op, "acc", ("acc", r))]
    return out


def combine_ops(op: str, A: int) -> list:
    """s0 <- s0 op s1 op ... (a tree over the accumulators)."""
    out, k = [], 1
    while k < A:
        out += [vx.VI(op, f"s{a}", (f"s{a}", f"s{a + k}")) for a in range(0, A, 2 * k)]
        k *= 2
    return out


def is_buffer_load(e) -> bool:
    return isinstance(e, TIR.TensorLoad)
