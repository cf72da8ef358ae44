"""Static analysis of the vector nests `lower/vector.py` lowers: what a nest is, whatever the iteration.

Each function reads one loop nest of the lowered TIR once (cached in the lowering's `_cache`
under the nest's loop variable) and returns what its lowering needs at every visit: the loops,
the predicate as a function, the accesses (buffer, flat index function, level; the store first)
and the selected instructions (`lower/vselect.py`):

* `nest_static` -> `NestInfo`: an element-wise vector nest (loops over one store);
* `row_static` -> `_Rows`: a row nest (`opc.dsp.rows`: (rows, vectors / acc, acc, lanes) over
  one element-wise store, optionally a fused `+` / `max` reduction of the stored element, or a
  `+` of its square);
* `nest_window` -> `WindowInfo` or None: a window reduction (a store reducing a load of its own buffer
  over loops its index does not mention: pooling, `opc.dsp.reduce_lanes` lane reductions), its
  spatial and tap loops, the reducing instruction, avg's divisor and `opc.dsp.separable`.

Each receives the lowering as a `lower.vselect.NestContext` (what it reads of it), so nothing here
imports `lower.vector`. Unsupported shapes are one-line OpcFailures naming the nest. Nothing here
emits an op.
"""
from __future__ import annotations

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .eval import buf_key, var_key, expr_vars
from .vselect import NestContext, is_buffer_load, RowSelect, Select

class _Rows:
    """What a row nest lowers to: its four loops, the rows' predicate, the element-wise store's
    accesses and instructions (as `NestInfo`), the fused reduction (buffer, store access, load of
    the stored element, opcode, identity, whether it sums the element's square) or None."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def row_static(low: NestContext, st) -> _Rows:
    k = ("rows", var_key(st))
    if k in low._cache:
        return low._cache[k]
    loops, s = [], st
    while isinstance(s, TIR.For):
        loops.append(s)
        s = s.body
    label = f"row nest over {', '.join(lp.loop_var.name for lp in loops)}"
    if len(loops) != 4:
        raise OpcFailure(f"tir lowering: {label}: a row nest is (rows, vectors / acc, acc, lanes) loops")
    items = list(s.seq) if isinstance(s, TIR.SeqStmt) else [s]
    if not isinstance(items[0], TIR.SBlockRealize) or not isinstance(items[0].block.body, TIR.BufferStore) \
            or len(items) > 2:
        raise OpcFailure(f"tir lowering: {label}: one element-wise store, then at most one reduction of it")
    pred, S = items[0].predicate, items[0].block.body
    red = None
    if len(items) == 2:
        stores: list = []

        def collect(x, init):
            if isinstance(x, TIR.For):
                if not isinstance(x.extent, TIR.IntImm) or int(x.extent) != 1:
                    raise OpcFailure(f"tir lowering: {label}: the fused reduction must sit at the lanes loop")
                collect(x.body, init)
            elif isinstance(x, TIR.SBlockRealize):
                collect(x.block.body, init)
            elif isinstance(x, TIR.SeqStmt):
                for y in x.seq:
                    collect(y, init)
            elif isinstance(x, TIR.IfThenElse):
                collect(x.then_case, True)
            elif isinstance(x, TIR.BufferStore):
                stores.append((x, init))
            else:
                raise OpcFailure(f"tir lowering: {label}: unexpected {type(x).__name__} in the fused reduction")
        collect(items[1], False)
        main = [x for x, i in stores if not i]
        inits = [Select.const(x.value) for x, i in stores if i]
        R = main[0] if len(main) == 1 else None
        v = R.value if R is not None else None
        ops = {TIR.Add: "vadd", TIR.Max: "vmax"}
        ok = v is not None and type(v) in ops and len(inits) == 1 and inits[0] is not None
        ld, square = None, False
        if ok:
            for a, b in ((v.a, v.b), (v.b, v.a)):
                if is_buffer_load(a) and buf_key(a) == buf_key(R) and is_buffer_load(b) and buf_key(b) == buf_key(S):
                    ld = b
                elif is_buffer_load(a) and buf_key(a) == buf_key(R) and isinstance(v, TIR.Add) and \
                        isinstance(b, TIR.Mul) and all(is_buffer_load(x) and buf_key(x) == buf_key(S) for x in (b.a, b.b)) \
                        and str(b.a.indices) == str(b.b.indices):  # + x * x: a sum of squares (one FMA)
                    ld, square = b.a, True
        if ld is None:
            raise OpcFailure(f"tir lowering: {label}: after the store only a reduction (+ / max with a constant "
                             "init) of the stored element, or a + of its square, maps")
        c = low.comp
        rb = buf_key(R)
        red = (rb, (rb, c.flat_fn(rb, R.indices), low._sp(rb)[0]),
               (buf_key(ld), c.flat_fn(buf_key(ld), ld.indices), low._sp(buf_key(ld))[0]), ops[type(v)], inits[0],
               square)
    sel = RowSelect(low, label + f" ({low.names.get(buf_key(S), '?')})", S)
    sel.run()
    pf = None if pred is None or (isinstance(pred, TIR.IntImm) and int(pred.value)) else low.comp.fn(pred)
    r = _Rows(name=sel.name, loops=loops, pred=pf, accesses=sel.accesses, code=sel.code, red=red)
    low._cache[k] = r
    return r


class NestInfo:
    """What one vector nest lowers to, whatever the enclosing iteration: its loops, predicate,
    accesses (buffer, flat index function, level; the store first) and instructions (with
    ("mem", access) placeholders)."""

    def __init__(self, name: str, loops: list, pred, accesses: list, code: list):
        self.name, self.loops, self.pred, self.accesses, self.code = name, loops, pred, accesses, code


def nest_static(low: NestContext, st) -> NestInfo:
    k = ("vec", var_key(st))
    if k in low._cache:
        return low._cache[k]
    loops, pred, s = [], None, st
    while True:
        if isinstance(s, TIR.For):
            loops.append(s)
            s = s.body
        elif isinstance(s, TIR.SBlockRealize):
            if pred is not None:
                raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name}: nested blocks")
            pred = s.predicate
            s = s.block.body
        elif isinstance(s, TIR.BufferStore):
            break
        else:
            raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name} must be loops over one store, "
                             f"found {type(s).__name__}")
    label = f"vector nest over {', '.join(lp.loop_var.name for lp in loops)} ({low.names.get(buf_key(s), '?')})"
    sel = Select(low, label, s)
    sel.run()
    pf = None if pred is None or (isinstance(pred, TIR.IntImm) and int(pred.value)) else low.comp.fn(pred)
    nest = NestInfo(label, loops, pf, sel.accesses, sel.code)
    low._cache[k] = nest
    return nest


def nest_vars(e, acc: set) -> set:
    """The variables an expression mentions, without entering load indices."""
    return expr_vars(e, acc, indices=False)


def _nodes(e, out: list) -> list:
    out.append(e)
    for attr in ("a", "b", "value"):
        if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
            _nodes(getattr(e, attr), out)
    for x in getattr(e, "args", ()):
        _nodes(x, out)
    return out


def _index_node(e):
    """The smallest node of `e` that mentions every variable `e` does (the row / column index a
    divisor factor is a function of), or None (no variables, or no single smallest one)."""
    ev = nest_vars(e, set())
    cands = [n for n in _nodes(e, []) if ev and nest_vars(n, set()) == ev]
    if not cands:
        return None
    small = min(len(str(n)) for n in cands)
    ys = {str(n) for n in cands if len(str(n)) == small}
    return next(n for n in cands if len(str(n)) == small) if len(ys) == 1 else None


def _unit(lp) -> bool:
    return isinstance(lp.extent, TIR.IntImm) and int(lp.extent) == 1


class WindowInfo:
    """A window reduction nest: spatial loops (the last one on the lanes), reduction loops (the
    taps), the predicate, the tap load and the store (buffer, flat index, level), the reducing
    instruction, avg's divisor (rows factor, lanes factor, the row index, and None; or, channels
    on the lanes, rows factor, columns factor, the row index, the column index) and `separable`."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.divk = None
        self.scratch = ()
        self.hp = 0


def nest_window(low: NestContext, st) -> WindowInfo | None:
    """The window reduction under a vector nest (a store reducing a load of its own buffer with
    max / + over loops its index does not mention), or None for an element-wise nest."""
    if int(st.annotations.get("opc.dsp.rows", 0)):
        return None
    k = ("win", var_key(st))
    if k in low._cache:
        return low._cache[k]
    stores: list = []

    def collect(s, path, preds, init):
        if isinstance(s, TIR.For):
            collect(s.body, path + [s], preds, init)
        elif isinstance(s, TIR.SBlockRealize):
            collect(s.block.body, path, preds + [s.predicate], init)
        elif isinstance(s, TIR.SeqStmt):
            for x in s.seq:
                collect(x, path, preds, init)
        elif isinstance(s, TIR.IfThenElse):
            collect(s.then_case, path, preds, True)
        elif isinstance(s, TIR.BufferStore):
            stores.append((s, path, preds, init))
    collect(st, [], [], False)
    main = [x for x in stores if not x[3]]
    R = None
    for s, path, preds, _ in main:
        v = s.value
        if isinstance(v, (TIR.Max, TIR.Add)):
            for a, b in ((v.a, v.b), (v.b, v.a)):
                if is_buffer_load(a) and buf_key(a) == buf_key(s) and is_buffer_load(b):
                    R = (s, path, b, "vmax" if isinstance(v, TIR.Max) else "vadd")
    if R is None:
        low._cache[k] = None
        return None
    F, fpath, fpreds, _ = main[-1]
    fv: set = set()
    for ix in F.indices:
        nest_vars(ix, fv)
    spatial = [lp for lp in fpath if var_key(lp.loop_var) in fv]
    if F is not R[0]:
        spatial = list(fpath)  # the store after the window (avg's division) sits outside the taps
    elif spatial:
        # the output loops are the path down to the deepest one the store's index mentions: a
        # unit-extent output loop above it may have no index left (TVM folds a plane / row of
        # extent 1 to 0)
        last = max(i for i, lp in enumerate(fpath) if var_key(lp.loop_var) in fv)
        if all(var_key(lp.loop_var) in fv or _unit(lp) for lp in fpath[:last + 1]):
            spatial = fpath[:last + 1]
    if int(st.annotations.get("opc.dsp.reduce_lanes", 0)) and len(fpath) == 4:
        spatial = fpath[:1]  # (rows, vectors / acc, acc, lanes): the rows loop even when unit (no index left)
    label = f"window nest over {', '.join(lp.loop_var.name for lp in R[1])} ({low.names.get(buf_key(F), '?')})"
    if spatial != fpath[:len(spatial)] or [var_key(x.loop_var) for x in R[1][:len(spatial)]] != \
            [var_key(x.loop_var) for x in spatial]:
        raise OpcFailure(f"tir lowering: {label}: the output loops must enclose the window loops")
    red = R[1][len(spatial):]
    preds = [p for p in fpreds if not (isinstance(p, TIR.IntImm) and int(p.value))]
    fns = [low.comp.fn(p) for p in preds]
    pred = None
    if fns:
        pred = (lambda E, L, fs=tuple(fns): np.logical_and.reduce([np.asarray(f(E, L), bool) for f in fs])
                if len(fs) > 1 else fs[0](E, L))
    div = None
    if F is not R[0]:
        v = F.value
        if not (isinstance(v, TIR.Div) and is_buffer_load(v.a) and buf_key(v.a) == buf_key(R[0])):
            raise OpcFailure(f"tir lowering: {label}: after the window only a division of its result maps")
        d = v.b
        if isinstance(d, TIR.Cast):
            d = d.value
        lane = var_key(spatial[-1].loop_var)
        if not isinstance(d, TIR.Mul):
            raise OpcFailure(f"tir lowering: {label}: the divisor must be (rows factor) * (columns factor)")
        A, B = (d.a, d.b) if lane not in nest_vars(d.a, set()) else (d.b, d.a)
        X = None
        if lane in nest_vars(A, set()) or nest_vars(B, set()) - {lane}:
            # channels on the lanes (NHWC): neither factor moves along them; each is a scalar of
            # the loops it mentions (rows, columns), the column factor a function of its index X
            if lane in nest_vars(d, set()) or nest_vars(A, set()) & nest_vars(B, set()):
                raise OpcFailure(f"tir lowering: {label}: the divisor must be (rows factor) * (columns factor)")
            X = _index_node(B)
            if X is None:
                raise OpcFailure(f"tir lowering: {label}: the column divisor has no single column index")
        div = (A, B, _index_node(A), X)
    tap = R[2]
    sep = bool(int(st.annotations.get("opc.dsp.separable", 0))) and len(red) > 0
    inits = [Select.const(x[0].value) for x in stores if x[3] and buf_key(x[0]) == buf_key(R[0])]
    ident = inits[0] if inits and inits[0] is not None else None
    lanes_red = bool(int(st.annotations.get("opc.dsp.reduce_lanes", 0)))
    w = WindowInfo(name=label, spatial=spatial, red=red, pred=pred, op=R[3],
             tap=(buf_key(tap), low.comp.flat_fn(buf_key(tap), tap.indices), low._sp(buf_key(tap))[0]),
             tap_idx=[low.comp.fn(i) for i in tap.indices],
             store=(buf_key(F), low.comp.flat_fn(buf_key(F), F.indices), low._sp(buf_key(F))[0]), div=div, sep=sep,
             ident=ident, lanes_red=lanes_red)
    low._cache[k] = w
    return w
