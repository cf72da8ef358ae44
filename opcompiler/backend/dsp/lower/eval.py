"""Evaluating lowered TIR for the DSP lowering: expressions compiled to Python/numpy over loop
grids (the simulator core's evaluator, `opcompiler.sim.tir_expr`), boolean grids split into
boxes, and the functional execution of a micro-kernel call. Used by `lower/direct.py`."""
from __future__ import annotations

from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR, Compiler  # noqa: F401  (Compiler: the lowerings take it from here)


def var_key(v) -> int:
    return v.__chandle__()


def buf_key(x) -> int:
    """The identity of the buffer a load, store or allocation refers to."""
    if isinstance(x, TIR.TensorLoad):
        return var_key(x.source if hasattr(x, "source") else x.buffer)
    if isinstance(x, TIR.BufferStore):
        return var_key(x.buffer)
    return var_key(x)  # in TVM 0.27 a buffer is itself the variable its accesses name


# `Compiler`: the simulator core's one TIR expression evaluator (`opcompiler.sim.tir_expr`), used from here


class ZeroState(dict):
    """Variables not given are 0."""

    def __missing__(self, k):
        return 0


def loop_grid(loops: list[tuple[Any, int]], E: dict) -> dict:
    """Loop variables as broadcastable index arrays, one axis per loop."""
    g = dict(E)
    n = len(loops)
    for d, (v, ext) in enumerate(loops):
        shape = [1] * n
        shape[d] = ext
        g[var_key(v)] = np.arange(ext).reshape(shape)
    return g


def _pad_dims(x: np.ndarray, nd: int) -> np.ndarray:
    """Leading unit axes up to `nd` (grid expressions broadcast from the right)."""
    return x.reshape((1,) * (nd - x.ndim) + x.shape) if x.ndim < nd else x


def as_full(x, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(x), shape)


_BOXES: dict[tuple, list] = {}


def mask_boxes(mask: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
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


class TirExec:
    """Functional execution of one micro-kernel call: statement by statement over the grid of
    its enclosing loops (valid here: different pixels and lanes are independent, and a
    reduction's init precedes its updates at every index)."""

    def __init__(self, low, mem, slot: int):  # low: a lower.direct.Lowerer
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
            lin = lin * e + g[var_key(v)]
        return lin * self.low.space[b][1] + flat

    def _masked_load(self, bk: int, arr: np.ndarray, i: np.ndarray, mask: np.ndarray, nd: int) -> np.ndarray:
        """A load whose index leaves its memory somewhere on the grid. A statement is evaluated
        over the whole grid of its loops and masked when stored, so its loads are evaluated at
        iterations its predicates exclude too (the tail of a register block: the pixels past the
        tile, which the micro-kernel does not load); the load is not performed there, and the
        value, never stored, is NaN. An index outside the memory at an iteration that runs is
        the program's: an OpcFailure."""
        bad = (i < 0) | (i >= arr.size)
        if np.any(_pad_dims(bad, nd) & mask):
            raise OpcFailure(f"tir lowering: a load of {self.low.names.get(bk, '?')} outside its memory "
                             f"(index {int(i[bad].flat[0])}, size {arr.size}) at an iteration that runs")
        return np.where(bad, np.float32(np.nan), arr[np.where(bad, 0, i)])

    def run(self, st, E: dict, loops: list | None = None) -> None:
        loops = loops or []
        if isinstance(st, TIR.For):
            ext = self.low._ev(st.extent, E)
            self.run(st.body, E, loops + [(st.loop_var, ext)])
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                self.run(x, E, loops)
        elif isinstance(st, TIR.SBlockRealize):
            for b in st.block.alloc_buffers:
                outer = [(v, e) for v, e in loops]
                n = int(np.prod([e for _, e in outer])) if outer else 1
                self.reg[buf_key(b)] = (np.full(n * self.low.space[buf_key(b)][1], np.nan, np.float32), outer)
            self._masked(st.block.body, E, loops, st.predicate)
        elif isinstance(st, TIR.BufferStore):
            self._store(st, E, loops, None)
        elif isinstance(st, TIR.IfThenElse):
            self._masked(st.then_case, E, loops, st.condition)
        else:
            raise OpcFailure(f"tir lowering: unexpected {type(st).__name__} in a micro-kernel")

    def _masked(self, st, E, loops, cond) -> None:
        E2 = dict(E)
        masks = list(E.get("_masks", ()))
        if cond is not None:
            masks.append(cond)
        E2["_masks"] = tuple(masks)
        if isinstance(st, TIR.BufferStore):
            self._store(st, E2, loops, None)
        else:
            self.run(st, E2, loops)

    def _store(self, st, E, loops, _) -> None:
        """One statement over the grid of its enclosing loops. Indices and masks are evaluated on
        broadcastable grids (an axis only where they vary); a reduction sums along the loops its
        store index does not mention (a product of two terms contracted with einsum), else
        np.add.at."""
        low, c = self.low, self.low.comp
        shape = tuple(e for _, e in loops)
        nd = len(shape)
        g = loop_grid(loops, {k: v for k, v in E.items() if k != "_masks"})
        mask = np.ones((1,) * nd, bool)
        for m in E.get("_masks", ()):
            mk = np.asarray(low._fn(m)(g, None))
            mask = mask & (mk if mk.dtype == bool else mk.astype(bool))
        mask = _pad_dims(mask, nd)

        def load(bk: int, flat):
            arr, base = self._arr(bk)
            i = np.asarray(base + self._index(bk, flat, g, loops))
            if i.size == 0 or (i.min() >= 0 and i.max() < arr.size):
                return arr[i]
            return self._masked_load(bk, arr, i, mask, nd)

        k = var_key(st)
        if k not in low._cache:
            val = st.value
            red = (isinstance(val, TIR.Add) and isinstance(val.a, TIR.TensorLoad)
                   and buf_key(val.a) == buf_key(st))
            expr = val.b if red else val
            factors = None
            if red:
                e = expr
                while isinstance(e, TIR.Cast):
                    e = e.value
                if isinstance(e, TIR.Mul):
                    factors = (c.fn(e.a), c.fn(e.b))
            low._cache[k] = (red, c.fn(expr), c.flat_fn(buf_key(st), st.indices), factors)
        red, fval, fidx, factors = low._cache[k]
        bk = buf_key(st)
        arr, base = self._arr(bk)
        idx = _pad_dims(np.asarray(base + self._index(bk, np.asarray(fidx(g, None)), g, loops)), nd)
        with np.errstate(invalid="ignore"):
            if not red:
                # axes along which neither the index nor the value varies write the same element
                # with the same value: once, where the mask holds anywhere along them
                v = _pad_dims(np.asarray(fval(g, load), dtype=np.float32), nd)
                same = tuple(i for i in range(nd) if idx.shape[i] == 1 and v.shape[i] == 1 and shape[i] > 1)
                m = mask.any(axis=same, keepdims=True) if same and mask.size > 1 else mask
                tshape = tuple(1 if i in same else e for i, e in enumerate(shape))
                m = np.broadcast_to(m, tshape)
                arr[np.broadcast_to(idx, tshape)[m]] = np.broadcast_to(v, tshape)[m]
                return
            # reduction axes: where the store index does not vary (loops of more than one
            # iteration); over the rest the index must address distinct elements
            raxes = tuple(i for i in range(nd) if idx.shape[i] == 1 and shape[i] > 1)
            rk = ("distinct", k, shape)
            if rk not in low._cache:
                i0 = np.broadcast_to(idx, tuple(1 if i in raxes else e for i, e in enumerate(shape)))
                low._cache[rk] = bool(raxes) and np.unique(i0).size == i0.size
            if not low._cache[rk] or any(mask.shape[i] != 1 for i in raxes):
                v = np.asarray(as_full(fval(g, load), shape), dtype=np.float32)
                m = np.broadcast_to(mask, shape)
                np.add.at(arr, np.broadcast_to(idx, shape)[m], v[m])
                return
            sp_shape = tuple(e for i, e in enumerate(shape) if i not in raxes)
            if factors is not None:
                a = _pad_dims(np.asarray(factors[0](g, load), np.float32), nd)
                b = _pad_dims(np.asarray(factors[1](g, load), np.float32), nd)
                ax_a = [i for i in range(nd) if a.shape[i] != 1]
                ax_b = [i for i in range(nd) if b.shape[i] != 1]
                out = [i for i in range(nd) if i not in raxes and (i in ax_a or i in ax_b)]
                vs = np.einsum(a.reshape([a.shape[i] for i in ax_a]), ax_a,
                               b.reshape([b.shape[i] for i in ax_b]), ax_b, out)
                # a reduction axis neither term varies along adds the same product once per iteration
                rep = int(np.prod([shape[i] for i in raxes if i not in ax_a and i not in ax_b]))
                if rep > 1:
                    vs = vs * np.float32(rep)
                vs = vs.reshape([shape[i] if i in out else 1 for i in range(nd) if i not in raxes])
            else:
                vs = np.asarray(as_full(fval(g, load), shape), dtype=np.float32).sum(axis=raxes, dtype=np.float32)
            vs = np.broadcast_to(vs, sp_shape)
            i0 = np.broadcast_to(np.squeeze(idx, axis=raxes), sp_shape)
            m0 = np.broadcast_to(np.squeeze(mask, axis=raxes), sp_shape)
            if m0.all():
                arr[i0] += vs
            else:
                arr[i0[m0]] += vs[m0]


def valid_mask(pred, g, shape) -> np.ndarray:
    """Where a nest's compiled predicate holds over the grid `g` (everywhere without one)."""
    return np.ones(shape, bool) if pred is None else as_full(pred(g, None), shape).astype(bool)


def expr_vars(e, acc: set[int], indices: bool = True) -> set[int]:
    """The loop / let variables (by handle) an expression mentions, load indices included unless
    `indices` is False (TVM's structural visitor; a `Let` contributes its value only). On a
    store: its value's and its indices' variables."""
    import tvm_ffi

    def var(v, _) -> None:
        acc.add(var_key(v))

    def load(ld, visitor) -> None:  # its indices, not the buffer it reads
        if indices:
            for x in ld.indices:
                visitor.visit(x)

    def store(st, visitor) -> None:  # its value and indices, not the buffer it writes
        visitor.visit(st.value)
        load(st, visitor)

    tvm_ffi.structural_visit(e, [(TIR.Var, var), (TIR.TensorLoad, load), (TIR.BufferStore, store),
                                 (TIR.Let, lambda let, visitor: visitor.visit(let.value))])
    return acc
