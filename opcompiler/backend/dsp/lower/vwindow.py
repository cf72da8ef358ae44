"""Window reductions of vector nests (pooling, lane reductions): a collaborator of
`lower.vector.VecLowerer`, which calls these functions with itself as the lowering they read and emit
into (`WindowContext`: its buffers, tiles, tables and emit helpers); nothing here imports it.

A window nest (`lower.vscan.nest_window`) becomes the taps unrolled: the first tap loaded into the
accumulator, the others through four rotating registers, one vmax / vadd each
(`vec_window`); `opc.dsp.separable` reduces each input row over the columns first into an AM
scratch, then the rows. avg's divisor is an immediate multiply when constant, else per-column
(AM) x per-row (SM) reciprocal tables computed here (with the channels on the lanes, NHWC, both
tables in SM, read as scalars; `window_space`, DMAed once per core by `VecLowerer.core_ops`). A
lane reduction (`opc.dsp.reduce_lanes`, `vec_rows`) keeps `acc` accumulators per output element,
combines them and reduces the lanes by rotate-and-combine; the tile's slack columns hold the
identity (written once per buffer).

A window nest's copies into its stage tile wait until the nest says what it reads
(`VecLowerer._dma` / `_dma_tile`, with `tile_tags`): they are then clipped to that box
(`_flush_deferred` with the clip this module computes).
"""
from __future__ import annotations

import itertools
from typing import Any, Protocol

import numpy as np

from opcompiler.errors import OpcFailure

from .. import program as vx  # the VPU's vector instructions
from ..program import Allocator
from .eval import mask_boxes, as_full, loop_grid, var_key, ZeroState, valid_mask
from .vscan import NestInfo, nest_vars, WindowInfo
from .vselect import NestContext, combine_ops, reduce_ops


class WindowContext(NestContext, Protocol):
    """What the window functions read of, and emit into, the lowering that calls them (the
    vector lowering: `lower.vector.VecLowerer`)."""

    m: Any
    nbuf: int
    bstrides: dict
    tables: dict
    zeroed: dict
    _ext: dict
    _table_ops: list

    def _tag(self, bk: int, slot: int) -> str: ...
    def _base(self, bk: int, slot: int) -> tuple: ...
    def _emit(self, op: Any, stage: list | None, where: int) -> None: ...
    def _intern(self, op: Any) -> Any: ...
    def _vpu_op(self, kern: Any, reads: tuple, writes: tuple, label: str, cost: Any = None) -> Any: ...
    def _flush_deferred(self, E: dict, stage: list | None, clip: dict) -> None: ...


def window_space(low: WindowContext, w: WindowInfo, am: Allocator, sm: Allocator) -> None:
    """A separable window's AM scratch (per slot); avg's divisor as an immediate, or as
    per-row (SM) x per-column (AM) reciprocal tables the lowering computes (host constants)."""
    L = low.m.lanes
    if w.sep:
        tile, out = low._strides(w.tap[0]), low._strides(w.store[0])
        planes = low.shapes[w.tap[0]][0]
        w.hp = (tile[0] // tile[1]) * out[1]
        w.scratch = tuple(am.alloc(f"row scratch[{i}]", planes * w.hp) for i in range(low.nbuf))
    if w.div is None:
        return
    A, B, Y, X = w.div
    fp = w.pred

    def over(e):
        ks = sorted(nest_vars(e, set()))
        g = ZeroState({k: np.arange(low._ext[k][0], low._ext[k][0] + low._ext[k][1]).reshape(
            [-1 if i == d else 1 for i in range(len(ks))]) for d, k in enumerate(ks)})
        shape = tuple(low._ext[k][1] for k in ks)
        return g, shape
    try:
        g, shape = over(A)
        gy = ZeroState(g)
        av = as_full(low.comp.fn(A)(g, None), shape)
        ok = as_full(fp(gy, None), shape).astype(bool) if fp is not None else np.ones(shape, bool)
        yv = as_full(low.comp.fn(Y)(g, None), shape) if Y is not None else np.zeros(shape, int)
        gx, sx = over(B)
        bv = as_full(low.comp.fn(B)(gx, None), sx).reshape(-1)
    except KeyError as e:
        raise OpcFailure(f"tir lowering: {w.name}: the divisor depends on a loop of unknown extent") from e
    av, yv = av[ok], yv[ok]
    if np.all(av == av[0]) and np.all(bv == bv[0]):
        w.divk = ("imm", 1.0 / (int(av[0]) * int(bv[0])))
        return
    if X is not None and Y is None and not nest_vars(A, set()):
        pass  # channels on the lanes and one output row (its loop folded): a one-entry row table
    elif Y is None or yv.min() != 0 or len(np.unique(yv)) != int(yv.max()) + 1:
        raise OpcFailure(f"tir lowering: {w.name}: the divisor's rows are not one range from 0")
    rows = np.zeros(int(yv.max()) + 1)
    rows[yv] = 1.0 / av
    if not np.array_equal(rows[yv], 1.0 / av):
        raise OpcFailure(f"tir lowering: {w.name}: the divisor is not a function of the row")
    if X is not None:  # channels on the lanes: the column factor is an SM scalar too
        xv = as_full(low.comp.fn(X)(gx, None), sx).reshape(-1)
        if xv.min() != 0 or len(np.unique(xv)) != int(xv.max()) + 1:
            raise OpcFailure(f"tir lowering: {w.name}: the divisor's columns are not one range from 0")
        cols = np.zeros(int(xv.max()) + 1)
        cols[xv] = 1.0 / bv
        if not np.array_equal(cols[xv], 1.0 / bv):
            raise OpcFailure(f"tir lowering: {w.name}: the divisor is not a function of the column")
        low.tables["rcp_cols"], low.tables["rcp_rows"] = cols.astype(np.float32), rows.astype(np.float32)
        rc, rr = sm.alloc("column reciprocals", len(cols)), sm.alloc("row reciprocals", len(rows))
        low._table_ops = [("rcp_cols", "SM", rc, len(cols)), ("rcp_rows", "SM", rr, len(rows))]
        w.divk = ("tab2", rc, rr, Y, X)
        return
    cols = np.zeros(-(-len(bv) // L) * L, np.float32)
    cols[:len(bv)] = 1.0 / bv
    if not nest_vars(B, set()):  # the lanes loop folded (one column): a constant on every lane
        cols[:] = 1.0 / bv[0]
    low.tables["rcp_cols"], low.tables["rcp_rows"] = cols, rows.astype(np.float32)
    rc, rr = am.alloc("column reciprocals", len(cols)), sm.alloc("row reciprocals", len(rows))
    low._table_ops = [("rcp_cols", "AM", rc, len(cols)), ("rcp_rows", "SM", rr, len(rows))]
    w.divk = ("tab", rc, rr, Y)


def vec_window(low: WindowContext, w: WindowInfo, E: dict, stage: list | None) -> None:
    """A window reduction: the taps unrolled (first into the accumulator, the others through
    four rotating registers, vmax / vadd), avg's divisor, one store."""
    ext, shape, g = low._nest_grid(w.spatial, E)
    valid = valid_mask(w.pred, g, shape)
    boxes = mask_boxes(valid)
    if not boxes:
        low._flush_deferred(E, stage, {})
        return
    if len(boxes) > 1 or any(a != 0 for a, _ in boxes[0]):
        raise OpcFailure(f"tir lowering: {w.name}: the iterations that exist are not one box from 0")
    box = tuple(b for _, b in boxes[0])
    slot = E.get("slot", 0)
    L = low.m.lanes
    red = [(lp.loop_var, low._ev(lp.extent, E)) for lp in w.red]
    taps = list(itertools.product(*[range(n) for _, n in red]))
    # what the nest reads of its tile: the copies into it are clipped to that box
    gg = loop_grid([(v, n) for (v, _), n in zip(ext, box)] + red, E)
    clip = {w.tap[0]: [(int(np.min(f(gg, None))), int(np.max(f(gg, None)))) for f in w.tap_idx]}
    low._flush_deferred(E, stage, clip)

    def mem(acc, t=()):
        E2 = {**E, **{var_key(v): i for (v, _), i in zip(red, t)}}
        return low._mem(NestInfo(f"{w.name} {t}", [], None, [], []), acc, E2, ext, box, slot)

    op = w.op
    nv = -(-box[-1] // L)
    nests = []
    if w.sep:
        # (planes, rows, vectors) (NCHW: output columns on the lanes) or (planes, rows, columns,
        # vectors) (NHWC: channels on the lanes): the loops after the rows are kept as they are
        if len(red) != 2 or len(ext) not in (3, 4):
            raise OpcFailure(f"tir lowering: {w.name}: separable windows are (rows, columns) over 3 or 4 loops")
        m00, m10, m01 = mem(w.tap, (0, 0)), mem(w.tap, (1, 0)), mem(w.tap, (0, 1))
        row, col = m10.base - m00.base, m01.base - m00.base
        if row <= 0 or m00.steps[1] % row:
            raise OpcFailure(f"tir lowering: {w.name}: the output rows do not step whole input rows")
        sty = m00.steps[1] // row
        hb = w.scratch[slot if low._sp(w.tap[0])[2] else 0]
        so = mem(w.store).steps
        ow, inner = so[1], tuple(so[2:])  # output row pitch; the steps of the loops after the rows
        ir = (box[1] - 1) * sty + red[0][1]
        mid = tuple(box[2:-1]) + (nv,)
        th = [vx.Mem("AM", m00.base + s * col, (m00.steps[0], row) + tuple(m00.steps[2:]), m00.lane)
              for s in range(red[1][1])]
        nests.append(vx.Nest(outer=(box[0], ir) + mid, post=tuple(
            reduce_ops(op, th) + [vx.VI("vst", vx.Mem("AM", hb, (w.hp, ow) + inner), ("acc",))])))
        tv = [vx.Mem("AM", hb + r * ow, (w.hp, sty * ow) + inner, 1) for r in range(red[0][1])]
        body = reduce_ops(op, tv)
    else:
        body = reduce_ops(op, [mem(w.tap, t) for t in taps])
    if w.divk is not None and w.divk[0] == "imm":
        body.append(vx.VI("vmul", "acc", ("acc", w.divk[1])))
    elif w.divk is not None and w.divk[0] == "tab2":
        _, rc, rr, Y, X = w.divk

        def scalar(F, base: int, what: str) -> vx.Mem:
            """An SM scalar of a divisor table at index F (None: the table's one entry)."""
            if F is None:  # one row: its only entry
                return vx.Mem("SM", base, (0,) * len(ext), 0)
            f = low._fn(F)
            at = {**E, **{var_key(v): 0 for v, _ in ext}}
            i0 = int(f(at, None))
            steps = []
            for v, _ in ext:
                at[var_key(v)] = 1
                steps.append(int(f(at, None)) - i0)
                at[var_key(v)] = 0
            if steps[-1]:
                raise OpcFailure(f"tir lowering: {w.name}: the {what} divisor moves along the lanes")
            return vx.Mem("SM", base + i0, tuple(steps[:-1]) + (0,), 0)
        body += [vx.VI("sld", "rr", (scalar(Y, rr, "row"),)), vx.VI("sld", "rc", (scalar(X, rc, "column"),)),
                 vx.VI("vmul", "acc", ("acc", "rr")), vx.VI("vmul", "acc", ("acc", "rc"))]
    elif w.divk is not None:
        _, rc, rr, Y = w.divk
        fy = low._fn(Y)
        at = {**E, **{var_key(v): 0 for v, _ in ext}}
        y0 = int(fy(at, None))
        steps = []
        for v, _ in ext:
            at[var_key(v)] = 1
            steps.append(int(fy(at, None)) - y0)
            at[var_key(v)] = 0
        if steps[-1]:
            raise OpcFailure(f"tir lowering: {w.name}: the row divisor moves along the lanes")
        body += [vx.VI("vld", "rc", (vx.Mem("AM", rc, (0,) * (len(ext) - 1) + (L,)),)),
                 vx.VI("sld", "rr", (vx.Mem("SM", rr + y0, tuple(steps[:-1]) + (0,), 0),)),
                 vx.VI("vmul", "acc", ("acc", "rc")), vx.VI("vmul", "acc", ("acc", "rr"))]
    body.append(vx.VI("vst", mem(w.store), ("acc",)))
    nests.append(vx.Nest(outer=tuple(box[:-1]) + (nv,), post=tuple(body)))
    kern = vx.VKernel(tuple(nests), "pool2d")
    tile = low._tag(w.tap[0], slot)
    rd = (tile, f"pad{slot}") + (("const",) if w.divk is not None and w.divk[0] in ("tab", "tab2") else ())
    op_ = low._vpu_op(kern, rd, (low._tag(w.store[0], slot),), f"{w.name}: {int(np.prod(box))} outputs")
    low._emit(low._intern(op_), stage, 1)


def vec_rows(low: WindowContext, w: WindowInfo, E: dict, stage: list | None) -> None:
    """A reduction along the lanes (`opc.dsp.reduce_lanes`: the reduction loops are (vectors /
    acc, acc, lanes)): per output element `acc` accumulators walk the inner loop, are combined,
    and the lanes reduced by rotate-and-combine; one lane stored. The tile's slack columns
    (its pitch beyond what the copy writes), which the predicate masks, hold the identity:
    written by vector stores once per buffer."""
    L = low.m.lanes
    ext = [(lp.loop_var, low._ev(lp.extent, E)) for lp in w.spatial]
    red = [(lp.loop_var, low._ev(lp.extent, E)) for lp in w.red]
    if len(ext) != 1 or len(red) != 3 or red[2][1] != L or w.ident is None:
        raise OpcFailure(f"tir lowering: {w.name}: a lane reduction is one output loop over (vectors / acc, "
                         "acc, lanes) with an identity init")
    g = ZeroState(loop_grid(ext, E))
    valid = as_full(w.pred(g, None), (ext[0][1],)).astype(bool) if w.pred is not None else np.ones(ext[0][1], bool)
    boxes = mask_boxes(valid)
    if not boxes:
        low._flush_deferred(E, stage, {})
        return
    if len(boxes) > 1 or boxes[0][0][0] != 0:
        raise OpcFailure(f"tir lowering: {w.name}: the iterations that exist are not one box from 0")
    nr = boxes[0][0][1]
    slot = E.get("slot", 0)
    tb = w.tap[0]
    shape, strides = low.shapes[tb], low._strides(tb)
    if len(shape) == 2 and strides[0] > shape[1]:
        key = ("ident", tb, slot)
        if key not in low.zeroed:  # once per buffer: the copies never write the slack
            low.zeroed[key] = np.ones(1, bool)
            base = low._base(tb, slot)[1]
            kern = vx.VKernel(tuple(vx.fill_nests(w.ident, base + shape[1], (1, shape[0], strides[0] - shape[1]),
                                                  (0, strides[0]), L)), "identity fill")
            op = low._vpu_op(kern, (), (f"pad{slot}",), "identity fill")
            low._emit(low._intern(op), stage, 0)
    low._flush_deferred(E, stage, {})

    def flat(acc, binds):
        at = {**E, **{var_key(v): 0 for v, _ in ext + red}, **binds}
        return int(acc[1](at, None))
    iv, (jv, J), (av, A), (lv, _) = ext[0][0], red[0], red[1], red[2]
    t0 = flat(w.tap, {})
    si, sj, sl = (flat(w.tap, {var_key(iv): 1}) - t0, flat(w.tap, {var_key(jv): 1}) - t0,
                  flat(w.tap, {var_key(lv): 1}) - t0)
    sa = flat(w.tap, {var_key(av): 1}) - t0
    tbase = low._base(tb, slot)[1] + t0
    o0 = flat(w.store, {})
    so = flat(w.store, {var_key(iv): 1}) - o0
    obase = low._base(w.store[0], slot)[1] + o0
    op = w.op
    body = tuple(i for a in range(A) for i in (vx.VI("vld", f"x{a}", (vx.Mem("AM", tbase + a * sa, (si, sj), sl),)),
                                              vx.VI(op, f"s{a}", (f"s{a}", f"x{a}"))))
    post = combine_ops(op, A) + vx.emit_hreduce(op, "s0", "t", L) + [
        vx.VI("vst", vx.Mem("AM", obase, (so, 0)), ("s0",), lanes=1)]
    kern = vx.VKernel((vx.Nest(outer=(nr,), inner=(J,), pre=tuple(vx.VI("vmov", f"s{a}", (w.ident,))
                                                                  for a in range(A)),
                               body=body, post=tuple(post)),), "reduce")
    o = low._vpu_op(kern, (low._tag(tb, slot), f"pad{slot}"), (low._tag(w.store[0], slot),), f"{w.name}: {nr} rows")
    low._emit(low._intern(o), stage, 1)


def mask_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    cuts = np.flatnonzero(np.diff(idx) != 1)
    return list(zip(np.r_[idx[0], idx[cuts + 1]].tolist(), (np.r_[idx[cuts], idx[-1]] + 1).tolist()))
