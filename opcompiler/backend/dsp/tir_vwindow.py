"""Window reductions of vector nests (pooling, lane reductions): the part of `tir_vector.VecLowerer`
that lowers them, a mixin (`WindowNests`) the lowering inherits before `tir_lower.Lowerer`.

A window nest (`tir_vscan._window`) becomes the taps unrolled: the first tap loaded into the
accumulator, the others through four rotating registers, one vmax / vadd each
(`_vec_window`); `opc.dsp.separable` reduces each input row over the columns first into an AM
scratch, then the rows. avg's divisor is an immediate multiply when constant, else per-column
(AM) x per-row (SM) reciprocal tables computed here (`_window_space`, DMAed once per core by
`core_ops`). A lane reduction (`opc.dsp.reduce_lanes`, `_vec_rows`) keeps `acc` accumulators
per output element, combines them and reduces the lanes by rotate-and-combine; the tile's slack
columns hold the identity (written once per buffer).

With `tile_tags`, each stage tile has its own dependency tags (in / pad / out, `_tag`), and a
copy into a stage tile waits (`_dma`) until the stage's window nest says what it reads: it is
then clipped to that box, its padding (the `if_then_else`'s other value) written by vector
stores (`_dma_tile`: whole rows each stage, side columns once per buffer).

The methods use the host lowering's state (`bstrides`, `tables`, `tile_tags`, `_mem`, ...:
`tir_vector.VecLowerer` sets it up); `super()` is `tir_lower.Lowerer` there.
"""
from __future__ import annotations

import itertools

import numpy as np

from opcompiler.errors import OpcFailure

from . import vector as vx
from .program import Allocator, View, dma_op
from .tir_eval import _bkey, _boxes, _full, _grid, _key, _Zero, _valid
from .tir_vscan import _Nest, _vars, _Win
from .tir_vselect import _combine, _reduce, _Select


class WindowNests:
    """The window-reduction and stage-tile methods of `tir_vector.VecLowerer` (see the module docstring)."""

    def _window_space(self, w: _Win, am: Allocator, sm: Allocator) -> None:
        """A separable window's AM scratch (per slot); avg's divisor as an immediate, or as
        per-row (SM) x per-column (AM) reciprocal tables the lowering computes (host constants)."""
        L = self.m.lanes
        if w.sep:
            tile, out = self.bstrides[w.tap[0]], self.bstrides[w.store[0]]
            planes = self.shapes[w.tap[0]][0]
            w.hp = (tile[0] // tile[1]) * out[1]
            w.scratch = tuple(am.alloc(f"row scratch[{i}]", planes * w.hp) for i in range(self.nbuf))
        if w.div is None:
            return
        A, B, Y = w.div
        fp = w.pred

        def over(e):
            ks = sorted(_vars(e, set()))
            g = _Zero({k: np.arange(self._ext[k][0], self._ext[k][0] + self._ext[k][1]).reshape(
                [-1 if i == d else 1 for i in range(len(ks))]) for d, k in enumerate(ks)})
            shape = tuple(self._ext[k][1] for k in ks)
            return g, shape
        try:
            g, shape = over(A)
            gy = _Zero(g)
            av = _full(self.comp.fn(A)(g, None), shape)
            ok = _full(fp(gy, None), shape).astype(bool) if fp is not None else np.ones(shape, bool)
            yv = _full(self.comp.fn(Y)(g, None), shape) if Y is not None else np.zeros(shape, int)
            gx, sx = over(B)
            bv = _full(self.comp.fn(B)(gx, None), sx).reshape(-1)
        except KeyError as e:
            raise OpcFailure(f"tir lowering: {w.name}: the divisor depends on a loop of unknown extent") from e
        av, yv = av[ok], yv[ok]
        if np.all(av == av[0]) and np.all(bv == bv[0]):
            w.divk = ("imm", 1.0 / (int(av[0]) * int(bv[0])))
            return
        if Y is None or yv.min() != 0 or len(np.unique(yv)) != int(yv.max()) + 1:
            raise OpcFailure(f"tir lowering: {w.name}: the divisor's rows are not one range from 0")
        rows = np.zeros(int(yv.max()) + 1)
        rows[yv] = 1.0 / av
        if not np.array_equal(rows[yv], 1.0 / av):
            raise OpcFailure(f"tir lowering: {w.name}: the divisor is not a function of the row")
        cols = np.zeros(-(-len(bv) // L) * L, np.float32)
        cols[:len(bv)] = 1.0 / bv
        self.tables["rcp_cols"], self.tables["rcp_rows"] = cols, rows.astype(np.float32)
        rc, rr = am.alloc("column reciprocals", len(cols)), sm.alloc("row reciprocals", len(rows))
        self._table_ops = [("rcp_cols", "AM", rc, len(cols)), ("rcp_rows", "SM", rr, len(rows))]
        w.divk = ("tab", rc, rr, Y)

    def core_ops(self, core: int, cores: int, per_image: int) -> list:
        ops = super().core_ops(core, cores, per_image)
        if ops and self._table_ops:
            pre = [dma_op(self.m, View(("DDR", nm), 0, (n,), (1,)), View((lv,), off, (n,), (1,)), (), ("const",),
                          self.fn, f"{nm} DDR->{lv}") for nm, lv, off, n in self._table_ops]
            ops = pre + ops
        return ops

    def _tag(self, bk: int, slot: int) -> str:
        sp = self._sp(bk)
        if self.tile_tags and sp[0] == "AM" and len(sp) > 2 and sp[2]:
            return f"out{slot}" if bk in self._vec_outs else f"in{slot}"
        return super()._tag(bk, slot)

    def _dma(self, st, E: dict, stage: list | None, part: tuple[int, int] | None = None) -> None:
        """With tile_tags, a copy into a stage tile waits for the stage's window nest (it copies
        what the nest reads)."""
        if self.tile_tags and stage is not None and part is None:
            _, _, store = self._nest(st)
            sp = self._sp(_bkey(store))
            if sp[0] == "AM" and len(sp) > 2 and sp[2]:
                self._deferred.append((st, E, stage))
                return None
        return super()._dma(st, E, stage, part)

    def _flush_deferred(self, E: dict, stage: list | None, clip: dict) -> None:
        todo, self._deferred = self._deferred, []
        for st, E2, stg in todo:
            if not clip:
                super()._dma(st, E2, stg)
            else:
                self._dma_tile(st, E2, stg, clip)

    def _dma_tile(self, st, E: dict, stage: list, clip: dict) -> None:
        """A copy into a stage tile, clipped to the box the window nest reads; the padding (the
        if_then_else's other value) written by vector stores: whole rows each stage, the side
        columns once per buffer (the copies never write them)."""
        k = ("tile", _key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            val = store.value
            cond, load, other = None, val, None
            if type(val).__name__ == "Call" and val.op.name.endswith("if_then_else"):
                cond, load, other = val.args
                other = _Select.const(other)
                if other is None:
                    raise OpcFailure("tir lowering: the padding of a stage tile must be a constant")
            c = self.comp
            self._cache[k] = (loops, None if pred is None else c.fn(pred), None if cond is None else c.fn(cond),
                              c.flat_fn(_bkey(store), store.indices), c.flat_fn(_bkey(load), load.indices),
                              _bkey(store), _bkey(load), [c.fn(i) for i in store.indices], other)
        loops, fpred, fcond, fdst, fsrc, bdst, bsrc, fidx, other = self._cache[k]
        ext, shape, g = self._nest_grid(loops, E)
        valid = _valid(fpred, g, shape)
        for f, (lo, hi) in zip(fidx, clip.get(bdst, ())):
            v = _full(f(g, None), shape)
            valid &= (v >= lo) & (v <= hi)
        copy = valid & _full(fcond(g, None), shape).astype(bool) if fcond is not None else valid
        zero = valid & ~copy
        slot = E.get("slot", 0)
        dspace, dbase = self._base(bdst, slot)
        sspace, sbase = self._base(bsrc, slot)
        dtag, stag = self._tag(bdst, slot), self._tag(bsrc, slot)
        if zero.any():
            if len(shape) != 3:
                raise OpcFailure("tir lowering: padding of a stage tile: (planes, rows, columns) copies only")
            strides = self._strides(bdst)
            pp, w = strides[-3], strides[-2]
            planes = np.flatnonzero(valid.any(axis=(1, 2)))
            p0, np_ = int(planes[0]), len(planes)
            if planes[-1] - p0 + 1 != np_:
                raise OpcFailure("tir lowering: the planes copied into a stage tile are not one range")
            at = {**E, **{_key(v): 0 for v, _ in ext}}
            at[_key(ext[0][0])] = p0
            corner = dbase + int(fdst(at, None))
            rows = valid[p0:p0 + np_].any(axis=(0, 2))
            fullz = rows & ~copy[p0:p0 + np_].any(axis=(0, 2))
            part = rows & ~fullz
            fills = []
            if part.any():
                cz = zero[p0:p0 + np_][:, part]
                colz = cz[0, 0]
                if not (cz == colz).all():
                    raise OpcFailure("tir lowering: padding columns differ between the rows of a stage tile")
                # once per buffer (nothing else writes these columns) over the planes the copy nest
                # spans; when TVM placed the planes at their absolute index (the region analysis
                # over-approximated: a copy loop whose extent moves), once per plane range
                key = ("pad", k, slot) if p0 == 0 and ext[0][1] == shape[0] else ("pad", k, slot, p0)
                if key not in self.zeroed:
                    self.zeroed[key] = np.ones(1, bool)
                    npl = shape[0] if len(key) == 3 else np_
                    for a, b in _runs(colz):
                        fills.append((a, (npl, shape[1], b - a)))
            for a, b in _runs(fullz):
                fills.append((a * w, (np_, b - a, w)))
            L = self.m.lanes
            for off, fs in fills:
                kern = vx.VKernel(tuple(vx.fill_nests(other, corner + off, fs, (pp, w), L)), "padding fill")
                op = self._vpu_op(kern, (), (f"pad{slot}",), "padding fill")
                self._emit(self._intern(op), stage, 0)
        boxes = _boxes(copy)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, b)
            dv = self._view(k, dspace, dbase, fdst, E, ext, b)
            op = self._copy_op(bsrc, bdst, sv, dv, (stag,) if stag else (), (dtag,),
                               f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            self._emit(self._intern(op), stage, 0)

    def _vec_window(self, w: _Win, E: dict, stage: list | None) -> None:
        """A window reduction: the taps unrolled (first into the accumulator, the others through
        four rotating registers, vmax / vadd), avg's divisor, one store."""
        ext, shape, g = self._nest_grid(w.spatial, E)
        valid = _valid(w.pred, g, shape)
        boxes = _boxes(valid)
        if not boxes:
            self._flush_deferred(E, stage, {})
            return
        if len(boxes) > 1 or any(a != 0 for a, _ in boxes[0]):
            raise OpcFailure(f"tir lowering: {w.name}: the iterations that exist are not one box from 0")
        box = tuple(b for _, b in boxes[0])
        slot = E.get("slot", 0)
        L = self.m.lanes
        red = [(lp.loop_var, self._ev(lp.extent, E)) for lp in w.red]
        taps = list(itertools.product(*[range(n) for _, n in red]))
        # what the nest reads of its tile: the copies into it are clipped to that box
        gg = _grid([(v, n) for (v, _), n in zip(ext, box)] + red, E)
        clip = {w.tap[0]: [(int(np.min(f(gg, None))), int(np.max(f(gg, None)))) for f in w.tap_idx]}
        self._flush_deferred(E, stage, clip)

        def mem(acc, t=()):
            E2 = {**E, **{_key(v): i for (v, _), i in zip(red, t)}}
            return self._mem(_Nest(f"{w.name} {t}", [], None, [], []), acc, E2, ext, box, slot)

        op = w.op
        nv = -(-box[-1] // L)
        nests = []
        if w.sep:
            if len(red) != 2 or len(ext) != 3:
                raise OpcFailure(f"tir lowering: {w.name}: separable windows are (rows, columns) over 3 loops")
            m00, m10, m01 = mem(w.tap, (0, 0)), mem(w.tap, (1, 0)), mem(w.tap, (0, 1))
            row, col = m10.base - m00.base, m01.base - m00.base
            if row <= 0 or m00.steps[1] % row:
                raise OpcFailure(f"tir lowering: {w.name}: the output rows do not step whole input rows")
            sty = m00.steps[1] // row
            hb = w.scratch[slot if self._sp(w.tap[0])[2] else 0]
            ow = mem(w.store).steps[1]
            ir = (box[1] - 1) * sty + red[0][1]
            th = [vx.Mem("AM", m00.base + s * col, (m00.steps[0], row, m00.steps[2]), m00.lane) for s in range(red[1][1])]
            nests.append(vx.Nest(outer=(box[0], ir, nv), post=tuple(
                _reduce(op, th) + [vx.VI("vst", vx.Mem("AM", hb, (w.hp, ow, L)), ("acc",))])))
            tv = [vx.Mem("AM", hb + r * ow, (w.hp, sty * ow, L), 1) for r in range(red[0][1])]
            body = _reduce(op, tv)
        else:
            body = _reduce(op, [mem(w.tap, t) for t in taps])
        if w.divk is not None and w.divk[0] == "imm":
            body.append(vx.VI("vmul", "acc", ("acc", w.divk[1])))
        elif w.divk is not None:
            _, rc, rr, Y = w.divk
            fy = self._fn(Y)
            at = {**E, **{_key(v): 0 for v, _ in ext}}
            y0 = int(fy(at, None))
            steps = []
            for v, _ in ext:
                at[_key(v)] = 1
                steps.append(int(fy(at, None)) - y0)
                at[_key(v)] = 0
            if steps[-1]:
                raise OpcFailure(f"tir lowering: {w.name}: the row divisor moves along the lanes")
            body += [vx.VI("vld", "rc", (vx.Mem("AM", rc, (0,) * (len(ext) - 1) + (L,)),)),
                     vx.VI("sld", "rr", (vx.Mem("SM", rr + y0, tuple(steps[:-1]) + (0,), 0),)),
                     vx.VI("vmul", "acc", ("acc", "rc")), vx.VI("vmul", "acc", ("acc", "rr"))]
        body.append(vx.VI("vst", mem(w.store), ("acc",)))
        nests.append(vx.Nest(outer=tuple(box[:-1]) + (nv,), post=tuple(body)))
        kern = vx.VKernel(tuple(nests), "pool2d")
        tile = self._tag(w.tap[0], slot)
        rd = (tile, f"pad{slot}") + (("const",) if w.divk is not None and w.divk[0] == "tab" else ())
        op_ = self._vpu_op(kern, rd, (self._tag(w.store[0], slot),), f"{w.name}: {int(np.prod(box))} outputs")
        self._emit(self._intern(op_), stage, 1)

    def _vec_rows(self, w: _Win, E: dict, stage: list | None) -> None:
        """A reduction along the lanes (`opc.dsp.reduce_lanes`: the reduction loops are (vectors /
        acc, acc, lanes)): per output element `acc` accumulators walk the inner loop, are combined,
        and the lanes reduced by rotate-and-combine; one lane stored. The tile's slack columns
        (its pitch beyond what the copy writes), which the predicate masks, hold the identity:
        written by vector stores once per buffer."""
        L = self.m.lanes
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in w.spatial]
        red = [(lp.loop_var, self._ev(lp.extent, E)) for lp in w.red]
        if len(ext) != 1 or len(red) != 3 or red[2][1] != L or w.ident is None:
            raise OpcFailure(f"tir lowering: {w.name}: a lane reduction is one output loop over (vectors / acc, "
                             "acc, lanes) with an identity init")
        g = _Zero(_grid(ext, E))
        valid = _full(w.pred(g, None), (ext[0][1],)).astype(bool) if w.pred is not None else np.ones(ext[0][1], bool)
        boxes = _boxes(valid)
        if not boxes:
            self._flush_deferred(E, stage, {})
            return
        if len(boxes) > 1 or boxes[0][0][0] != 0:
            raise OpcFailure(f"tir lowering: {w.name}: the iterations that exist are not one box from 0")
        nr = boxes[0][0][1]
        slot = E.get("slot", 0)
        tb = w.tap[0]
        shape, strides = self.shapes[tb], self._strides(tb)
        if len(shape) == 2 and strides[0] > shape[1]:
            key = ("ident", tb, slot)
            if key not in self.zeroed:  # once per buffer: the copies never write the slack
                self.zeroed[key] = np.ones(1, bool)
                base = self._base(tb, slot)[1]
                kern = vx.VKernel(tuple(vx.fill_nests(w.ident, base + shape[1], (1, shape[0], strides[0] - shape[1]),
                                                      (0, strides[0]), L)), "identity fill")
                op = self._vpu_op(kern, (), (f"pad{slot}",), "identity fill")
                self._emit(self._intern(op), stage, 0)
        self._flush_deferred(E, stage, {})

        def flat(acc, binds):
            at = {**E, **{_key(v): 0 for v, _ in ext + red}, **binds}
            return int(acc[1](at, None))
        iv, (jv, J), (av, A), (lv, _) = ext[0][0], red[0], red[1], red[2]
        t0 = flat(w.tap, {})
        si, sj, sl = (flat(w.tap, {_key(iv): 1}) - t0, flat(w.tap, {_key(jv): 1}) - t0,
                      flat(w.tap, {_key(lv): 1}) - t0)
        sa = flat(w.tap, {_key(av): 1}) - t0
        tbase = self._base(tb, slot)[1] + t0
        o0 = flat(w.store, {})
        so = flat(w.store, {_key(iv): 1}) - o0
        obase = self._base(w.store[0], slot)[1] + o0
        op = w.op
        body = tuple(i for a in range(A) for i in (vx.VI("vld", f"x{a}", (vx.Mem("AM", tbase + a * sa, (si, sj), sl),)),
                                                  vx.VI(op, f"s{a}", (f"s{a}", f"x{a}"))))
        post = _combine(op, A) + vx.emit_hreduce(op, "s0", "t", L) + [
            vx.VI("vst", vx.Mem("AM", obase, (so, 0)), ("s0",), lanes=1)]
        kern = vx.VKernel((vx.Nest(outer=(nr,), inner=(J,), pre=tuple(vx.VI("vmov", f"s{a}", (w.ident,))
                                                                      for a in range(A)),
                                   body=body, post=tuple(post)),), "reduce")
        o = self._vpu_op(kern, (self._tag(tb, slot), f"pad{slot}"), (self._tag(w.store[0], slot),), f"{w.name}: {nr} rows")
        self._emit(self._intern(o), stage, 1)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    cuts = np.flatnonzero(np.diff(idx) != 1)
    return list(zip(np.r_[idx[0], idx[cuts + 1]].tolist(), (np.r_[idx[cuts], idx[-1]] + 1).tolist()))
