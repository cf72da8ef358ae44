"""Evaluating lowered TIR for the DSP lowering: expressions compiled to Python/numpy over loop
grids, boolean grids split into boxes, and the functional execution of a micro-kernel call.
Used by `tir_lower.py`."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from opcompiler.errors import OpcFailure


def _key(v) -> int:
    return v.__chandle__()


def _bkey(x) -> int:
    """The identity of the buffer a load, store or allocation refers to."""
    if type(x).__name__ in ("BufferLoad", "TensorLoad"):
        return _key(x.source if hasattr(x, "source") else x.buffer)
    if type(x).__name__ == "BufferStore":
        return _key(x.buffer)
    return _key(x)  # in TVM 0.27 a buffer is itself the variable its accesses name


class _Compiler:
    """PrimExpr -> Python source over `E` (loop variables by handle) and `L` (buffer loads)."""

    _BIN: ClassVar[dict[str, str]] = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%", "Div": "//", "Mod": "%",
            "LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!=", "And": "&", "Or": "|"}

    def __init__(self, strides: Callable[[int], tuple[int, ...]]):
        self.strides = strides

    def flat(self, bk: int, indices) -> str:
        st = self.strides(bk)
        return "(" + " + ".join(f"({self.src(i)})*{s}" for i, s in zip(indices, st)) + ")" if st else "0"

    def src(self, e) -> str:
        name = type(e).__name__
        if name == "IntImm":
            return str(int(e.value))
        if name == "FloatImm":
            return repr(float(e.value))
        if name == "Var":
            return f"E[{_key(e)}]"
        if name in self._BIN:
            return f"({self.src(e.a)} {self._BIN[name]} {self.src(e.b)})"
        if name == "Min":
            return f"np.minimum({self.src(e.a)}, {self.src(e.b)})"
        if name == "Max":
            return f"np.maximum({self.src(e.a)}, {self.src(e.b)})"
        if name == "Not":
            return f"(~np.asarray({self.src(e.a)}))"
        if name == "Select":
            return f"np.where({self.src(e.condition)}, {self.src(e.true_value)}, {self.src(e.false_value)})"
        if name == "Cast":
            return self.src(e.value)
        if name == "Call" and e.op.name.endswith("if_then_else"):
            a = e.args
            return f"np.where({self.src(a[0])}, {self.src(a[1])}, {self.src(a[2])})"
        if name in ("BufferLoad", "TensorLoad"):
            bk = _bkey(e)
            return f"L({bk}, {self.flat(bk, e.indices)})"
        raise OpcFailure(f"tir lowering: no rule for {name} ({e})")

    def flat_fn(self, bk: int, indices) -> Callable:
        return eval(f"lambda E, L: {self.flat(bk, indices)}", {"np": np})

    def fn(self, e) -> Callable:
        return eval(f"lambda E, L: {self.src(e)}", {"np": np})  # our own generated source


class _Zero(dict):
    """Variables not given are 0."""

    def __missing__(self, k):
        return 0


def _grid(loops: list[tuple[Any, int]], E: dict) -> dict:
    """Loop variables as broadcastable index arrays, one axis per loop."""
    g = dict(E)
    n = len(loops)
    for d, (v, ext) in enumerate(loops):
        shape = [1] * n
        shape[d] = ext
        g[_key(v)] = np.arange(ext).reshape(shape)
    return g


def _full(x, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(x), shape)


_BOXES: dict[tuple, list] = {}


def _boxes(mask: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    """Split a boolean grid into rectangular boxes ((lo, hi) per axis); memoized (stages repeat)."""
    key = (mask.shape, np.packbits(mask).tobytes())
    if key not in _BOXES:
        if len(_BOXES) > 4096:
            _BOXES.clear()
        _BOXES[key] = _split(mask)
    return _BOXES[key]


def _split(mask: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    if not mask.any():
        return []
    if mask.ndim == 1:
        idx = np.flatnonzero(mask)
        cuts = np.flatnonzero(np.diff(idx) != 1)
        starts = np.r_[idx[0], idx[cuts + 1]]
        ends = np.r_[idx[cuts], idx[-1]] + 1
        return [((int(a), int(b)),) for a, b in zip(starts, ends)]
    out = []
    i = 0
    while i < mask.shape[0]:
        j = i + 1
        while j < mask.shape[0] and np.array_equal(mask[j], mask[i]):
            j += 1
        out += [((i, j),) + b for b in _split(mask[i])]
        i = j
    return out


class _Exec:
    """Functional execution of one micro-kernel call: statement by statement over the grid of
    its enclosing loops (valid here: different pixels and lanes are independent, and a
    reduction's init precedes its updates at every index)."""

    def __init__(self, low, mem, slot: int):  # low: a tir_lower.Lowerer
        self.low, self.mem, self.slot = low, mem, slot
        self.reg: dict[int, tuple[np.ndarray, list]] = {}

    def _arr(self, b: int) -> tuple[np.ndarray, int]:
        sp = self.low._sp(b)
        if sp[0] == "REG":
            return self.reg[b][0], 0
        space, base = self.low._base(b, self.slot)
        return self.mem.flat(space), base

    def _index(self, b: int, flat, g, loops) -> np.ndarray:
        """Flat element index; REG buffers are private per iteration of the loops enclosing
        their allocation."""
        if self.low._sp(b)[0] != "REG":
            return flat
        _, outer = self.reg[b]
        lin = 0
        for v, e in outer:
            lin = lin * e + g[_key(v)]
        return lin * self.low.space[b][1] + flat

    def run(self, st, E: dict, loops: list | None = None) -> None:
        loops = loops or []
        name = type(st).__name__
        if name == "For":
            ext = self.low._ev(st.extent, E)
            self.run(st.body, E, loops + [(st.loop_var, ext)])
        elif name == "SeqStmt":
            for x in st.seq:
                self.run(x, E, loops)
        elif name == "SBlockRealize":
            for b in st.block.alloc_buffers:
                outer = [(v, e) for v, e in loops]
                n = int(np.prod([e for _, e in outer])) if outer else 1
                self.reg[_bkey(b)] = (np.full(n * self.low.space[_bkey(b)][1], np.nan, np.float32), outer)
            self._masked(st.block.body, E, loops, st.predicate)
        elif name == "BufferStore":
            self._store(st, E, loops, None)
        elif name == "IfThenElse":
            self._masked(st.then_case, E, loops, st.condition)
        else:
            raise OpcFailure(f"tir lowering: unexpected {name} in a micro-kernel")

    def _masked(self, st, E, loops, cond) -> None:
        E2 = dict(E)
        masks = list(E.get("_masks", ()))
        if cond is not None:
            masks.append(cond)
        E2["_masks"] = tuple(masks)
        if type(st).__name__ == "BufferStore":
            self._store(st, E2, loops, None)
        else:
            self.run(st, E2, loops)

    def _store(self, st, E, loops, _) -> None:
        low, c = self.low, self.low.comp
        shape = tuple(e for _, e in loops)
        g = _grid(loops, {k: v for k, v in E.items() if k != "_masks"})
        mask = np.ones(shape, bool)
        for m in E.get("_masks", ()):
            mask &= _full(low._fn(m)(g, None), shape).astype(bool)

        def load(bk: int, flat):
            arr, base = self._arr(bk)
            return arr[base + self._index(bk, flat, g, loops)]

        k = _key(st)
        if k not in low._cache:
            val = st.value
            red = (type(val).__name__ == "Add" and type(val.a).__name__ in ("BufferLoad", "TensorLoad")
                   and _bkey(val.a) == _bkey(st))
            expr = val.b if red else val
            low._cache[k] = (red, c.fn(expr), c.flat_fn(_bkey(st), st.indices))
        red, fval, fidx = low._cache[k]
        arr, base = self._arr(_bkey(st))
        idx = base + self._index(_bkey(st), _full(fidx(g, None), shape), g, loops)
        with np.errstate(invalid="ignore"):
            v = _full(fval(g, load), shape).astype(np.float32)
            if red:  # a reduction: sum the update over the iterations that share an index
                sel = idx[mask]
                np.add.at(arr, sel, v[mask])
            else:
                arr[idx[mask]] = v[mask]
