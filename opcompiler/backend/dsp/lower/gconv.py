"""Register-blocked convolution nests of lowered TIR -> VPU vector kernels (grouped / depthwise conv).

A template marks a loop nest `opc.dsp.op = "gconv"` (`schedules/dsp/grouped.py`): four loops
(group, channel in group, row block, column vector) over a convolution reduction into a
`local.REG` buffer (`acc += x * w`) and the blocks after it (epilogue, ending in a store to an AM
tile). The nest becomes one `program.Nest` per register-block shape (the full blocks, then the
tail block of the item's rows):

* the four loops are the nest's outer iterations; the box of them that exists comes from the
  reduction block's predicate (channel tails, row tails, the last vector's columns);
* under the reduction block, the loop indexing the accumulator's last axis is the lanes; the
  one indexing the axis before is the register block's rows: one accumulator register each,
  unrolled; a reduction loop above them is the nest's sequential inner loop (accumulators
  carried: the group's input channels); the reduction loops below are the taps, unrolled;
* every tap load (AM, lane stride from the index) is issued once per distinct address in address
  order through four rotating registers, each followed by the FMAs of the accumulators that use
  it (a tap's weight: an SM scalar broadcast, loaded once per nest iteration);
* the blocks after the reduction become instructions on each accumulator: `+ v` -> vadd, `* s + t`
  -> vfma, `max(x, c)` / `min` -> vmax / vmin, `* v` -> vmul, with per-channel SM scalars loaded
  once per iteration; an operation of two expressions of the accumulator (HardSwish's
  x * (max(min(x + 3, 6), 0) * 1/6)) computes the second into one temporary register first
  (vadd tmp <- acc + 3, vmin, vmax, vmul tmp <- tmp * 1/6, then vmul acc <- acc * tmp); the last
  block's store is a vector store into the AM tile;
* addresses (base, steps, lane stride) are the flat indices evaluated at the corner and one step
  along each loop, checked affine over the box.

A stage's copies are clipped to what its nest touches, since TVM's regions ignore the block
predicates (a block of channels slicing a group reaches into the next group, the register
blocks' rows past the item's): the copies into the input tile and into SM (weights and
per-channel parameters fetched per stage) to the box the nest reads, the input tile's padding
written by vector stores (`lower.vector.VecLowerer._dma_tile`, issued first in the stage, as they
read nothing), weights before the input; the copy out of the output tile to the channels the nest
stored (another stage owns the rest: copying them would race with it across cores). The output
tile is allocated as tall as the copy out reads, the input tile with as many planes as its copy
loop's largest extent. Anything else is a one-line OpcFailure.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .. import program as vx  # the VPU's vector instructions
from ..machine import DspMachine
from .eval import buf_key, mask_boxes, as_full, var_key, expr_vars, ZeroState, valid_mask
from .vector import VecLowerer, repacked
from .vselect import is_buffer_load, Select

from ..intrin import GCONV  # noqa: E402  (the opc.dsp.op value of a register-blocked convolution nest)
X_REGS = 4  # tap loads in flight (register names rotate)
TEMP = ("t",)  # an epilogue operand: the temporary register (`GConvLowerer._temp`)
TEMP_REG = "tmp"  # its name in the nest


def _reads(e, bk: int) -> bool:
    """Whether the expression loads buffer `bk`."""
    if is_buffer_load(e):
        return buf_key(e) == bk
    kids = [getattr(e, f) for f in ("a", "b", "value") if hasattr(e, f)] + list(getattr(e, "args", ()))
    return any(_reads(x, bk) for x in kids if not isinstance(x, (int, float, str)))


def _nest_pred(st):
    """The block predicate of a copy nest (loops over one block), None when it is true."""
    while isinstance(st, TIR.For):
        st = st.body
    if isinstance(st, TIR.SBlockRealize):
        p = st.predicate
        return None if isinstance(p, TIR.IntImm) and int(p.value) else p
    return None


class _Static:
    """What a gconv nest lowers to, whatever the enclosing iteration."""


class GConvLowerer(VecLowerer):
    """The Lowerer of kernels whose VPU pass is a register-blocked convolution nest."""

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 dbuf: bool, functional: bool):
        self._stored: dict[int, list] = {}  # AM tile -> the box the last conv nest stored into it
        super().__init__(m, func, ddr_names, ddr_shapes, dbuf, functional, tile_tags=True)

        def visit(st, inside: bool) -> None:  # the AM tiles a gconv nest stores are stage outputs
            if isinstance(st, TIR.For):
                visit(st.body, inside or st.annotations.get("opc.dsp.op") == GCONV)
            elif isinstance(st, TIR.SBlockRealize):
                visit(st.block.body, inside)
            elif isinstance(st, TIR.SeqStmt):
                for x in st.seq:
                    visit(x, inside)
            elif isinstance(st, TIR.IfThenElse):
                visit(st.then_case, inside)
            elif isinstance(st, TIR.BufferStore) and inside and self.space.get(buf_key(st), ("",))[0] == "AM":
                self._vec_outs.add(buf_key(st))
        visit(func.body, False)

    def _tight(self, bk: int, shape: tuple, strides: tuple, dma_loops: list) -> tuple[tuple, tuple]:
        """A stage tile no copy fills but a copy nest drains (the output tile) is as large as that
        nest reads along each axis: TVM's compaction takes the register blocks' rows past the
        item's (the block predicate is not a region bound); aligned strides are kept."""
        for st in dma_loops:
            loops, _, store = self._nest(st)
            if buf_key(store) == bk:
                shape, strides = super()._tight(bk, shape, strides, dma_loops)
                # planes copied by a loop whose extent moves (a block slicing a group reads one or
                # two groups' planes): as many as its largest extent over the loops around it
                e0 = loops[0].extent
                vs = sorted(expr_vars(e0, set()))
                if not isinstance(e0, TIR.IntImm) and vs and all(v in self._ext for v in vs):
                    g = ZeroState({v: np.arange(self._ext[v][0], self._ext[v][0] + self._ext[v][1]).reshape(
                        [-1 if i == d else 1 for i in range(len(vs))]) for d, v in enumerate(vs)})
                    n0 = int(np.max(self.comp.fn(e0)(g, None)))
                    if 0 < n0 < shape[0]:
                        shape = (n0,) + tuple(shape[1:])
                return shape, strides
        for st in dma_loops:
            loops, _, store = self._nest(st)
            load = store.value
            if not is_buffer_load(load) or buf_key(load) != bk or len(load.indices) != len(shape):
                continue
            if any(not isinstance(lp.extent, TIR.IntImm) for lp in loops):
                return shape, strides
            g = ZeroState({var_key(lp.loop_var): np.arange(int(lp.extent)).reshape(
                [-1 if i == d else 1 for i in range(len(loops))]) for d, lp in enumerate(loops)})
            ext = []
            for d, ix in enumerate(load.indices):
                v = np.asarray(self.comp.fn(ix)(g, None))
                ext.append(min(shape[d], int(v.max()) - int(v.min()) + 1))
            return tuple(ext), repacked(shape, strides, ext)
        return shape, strides

    def _walk(self, st, E: dict, stage: list | None = None) -> None:
        if isinstance(st, TIR.For) and st.annotations.get("opc.dsp.op") == GCONV:
            return self._gconv(st, E, stage)
        return super()._walk(st, E, stage)

    # ---- the nest's structure ---------------------------------------------------------------
    def _fail(self, st, what: str) -> OpcFailure:
        return OpcFailure(f"tir lowering: conv nest over {st.loop_var.name}: {what}")

    def _gstatic(self, st) -> _Static:
        k = ("gconv", var_key(st))
        if k in self._cache:
            return self._cache[k]
        outer, s = [], st
        while isinstance(s, TIR.For):
            outer.append(s)
            s = s.body
        if len(outer) != 4:
            raise self._fail(st, "expected 4 loops (group, channel, row block, column vector)")
        while isinstance(s, TIR.SBlockRealize):
            s = s.block.body
        parts = list(s.seq) if isinstance(s, TIR.SeqStmt) else [s]
        nests = []
        for p in parts:  # each: loops -> one block -> its stores
            loops, q, pred, name = [], p, None, None
            while True:
                if isinstance(q, TIR.For):
                    loops.append(q)
                    q = q.body
                elif isinstance(q, TIR.SBlockRealize):
                    pred, name = q.predicate, q.block.name_hint
                    q = q.block.body
                    break
                else:
                    raise self._fail(st, f"each statement must be loops over one block, found {type(q).__name__}")
            stores: list = []

            def collect(x) -> None:
                if isinstance(x, TIR.BufferStore):
                    stores.append(x)
                elif isinstance(x, TIR.SeqStmt):
                    for y in x.seq:
                        collect(y)
                elif isinstance(x, TIR.IfThenElse):
                    collect(x.then_case)
                else:
                    raise self._fail(st, f"block {name}: unexpected {type(x).__name__}")
            collect(q)
            nests.append((name, loops, pred, stores))
        # the reduction: acc = acc + x * w
        name, loops, pred, stores = nests[0]
        upd = stores[-1]
        v = upd.value
        if not (isinstance(v, TIR.Add) and isinstance(v.b, TIR.Mul) and is_buffer_load(v.a)
                and buf_key(v.a) == buf_key(upd) and is_buffer_load(v.b.a) and is_buffer_load(v.b.b)):
            raise self._fail(st, f"the first block ({name}) must accumulate a product of two loads")
        if self._sp(buf_key(upd))[0] != "REG":
            raise self._fail(st, "the accumulator must be in local.REG")
        x, w = v.b.a, v.b.b
        if self._sp(buf_key(x))[0] != "AM":
            x, w = w, x
        if self._sp(buf_key(x))[0] != "AM" or self._sp(buf_key(w))[0] != "SM":
            raise self._fail(st, "the product must be of an AM tile and an SM scalar")
        S = _Static()
        lane_v = expr_vars(upd.indices[-1], set())
        row_v = expr_vars(upd.indices[-2], set()) if len(upd.indices) > 1 else set()
        kinds = []
        for lp in loops:
            kv = var_key(lp.loop_var)
            kinds.append("lane" if kv in lane_v else "row" if kv in row_v else "red")
        if "lane" not in kinds:
            raise self._fail(st, "no lane loop under the reduction")
        first = min(i for i, t in enumerate(kinds) if t != "red")
        last = max(i for i, t in enumerate(kinds) if t != "red")
        if any(t == "red" for t in kinds[first:last + 1]):
            raise self._fail(st, "a reduction loop between the rows and the lanes")
        inner = [lp for lp in loops[:first]]
        if len(inner) > 1:
            raise self._fail(st, "more than one sequential reduction loop")
        S.outer = outer
        S.inner = inner[0] if inner else None
        S.row = next((lp for lp, t in zip(loops, kinds) if t == "row"), None)
        S.lane = next(lp for lp, t in zip(loops, kinds) if t == "lane")
        S.taps = loops[last + 1:]
        S.pred = self.comp.fn(pred)
        c = self.comp
        S.x = (buf_key(x), c.flat_fn(buf_key(x), x.indices), [c.fn(i) for i in x.indices])
        S.w = (buf_key(w), c.flat_fn(buf_key(w), w.indices), [c.fn(i) for i in w.indices])
        # the blocks after the reduction: instructions on each accumulator
        prev = buf_key(upd)
        S.epi, S.params = [], []
        for name, loops, _, stores in nests[1:]:
            if len(stores) != 1:
                raise self._fail(st, f"block {name}: one store expected")
            stv = stores[0]
            lv = expr_vars(stv.indices[-1], set())
            rv = expr_vars(stv.indices[-2], set()) if len(stv.indices) > 1 else set()
            lane = next((lp for lp in loops if var_key(lp.loop_var) in lv), None)
            row = next((lp for lp in loops if var_key(lp.loop_var) in rv), None)
            code = self._select(st, stv.value, prev, S)
            S.epi.append((name, row, lane, code, buf_key(stv), c.flat_fn(buf_key(stv), stv.indices), stv.indices))
            prev = buf_key(stv)
        if not S.epi or self._sp(prev)[0] != "AM":
            raise self._fail(st, "the last block must store the accumulators into an AM tile")
        self._cache[k] = S
        return S

    def _select(self, st, e, prev: int, S: _Static) -> list:
        """Instructions computing `e` from the accumulator (a load of `prev`) in place:
        [(opcode, operands)], an operand "acc", an immediate or ("p", parameter index)."""
        if is_buffer_load(e):
            if buf_key(e) != prev:
                raise self._fail(st, f"an epilogue block reads {self.names.get(buf_key(e))}, not the accumulator")
            return []

        def param(x):
            c = Select.const(x)
            if c is not None:
                return c
            if not is_buffer_load(x) or self._sp(buf_key(x))[0] != "SM":
                raise self._fail(st, f"an epilogue operand must be a constant or an SM scalar: {x}")
            S.params.append((buf_key(x), self.comp.flat_fn(buf_key(x), x.indices), x))
            return ("p", len(S.params) - 1)
        if isinstance(e, TIR.Cast):
            return self._select(st, e.value, prev, S)
        ops = {TIR.Add: "vadd", TIR.Mul: "vmul", TIR.Max: "vmax", TIR.Min: "vmin"}
        if isinstance(e, TIR.Add) and isinstance(e.a, TIR.Mul) or isinstance(e, TIR.Add) and isinstance(e.b, TIR.Mul):
            m, c = (e.a, e.b) if isinstance(e.a, TIR.Mul) else (e.b, e.a)
            a, s = (m.a, m.b) if not (is_buffer_load(m.b) and buf_key(m.b) == prev) else (m.b, m.a)
            if not (is_buffer_load(a) and buf_key(a) == prev) and type(a) not in ops:
                raise self._fail(st, f"no vector instruction for {e}")
            code = self._select(st, a, prev, S)
            return code + [("vfma", param(s), param(c))]
        if type(e) in ops:
            a, b = e.a, e.b
            if Select.const(a) is not None or (is_buffer_load(a) and self._sp(buf_key(a))[0] == "SM"):
                a, b = b, a
            if _reads(b, prev) and _reads(a, prev):  # both computed from the accumulator: b in a temporary
                return self._temp(st, b, prev, S) + self._select(st, a, prev, S) + [(ops[type(e)], TEMP)]
            return self._select(st, a, prev, S) + [(ops[type(e)], param(b))]
        raise self._fail(st, f"no vector instruction for {type(e).__name__} ({e})")

    def _temp(self, st, e, prev: int, S: _Static) -> list:
        """Instructions computing `e` from the accumulator into the temporary register, the
        accumulator kept (HardSwish's x * (max(min(x + 3, 6), 0) * 1/6): the clip chain's vadd reads
        the accumulator and writes the temporary, the rest run on it): [(TEMP, opcode, source,
        operands)]. One temporary: an expression needing two is refused."""
        code = self._select(st, e, prev, S)
        if any(x == TEMP for ins in code for x in ins[1:]):
            raise self._fail(st, f"an epilogue needing more than one temporary register: {e}")
        if not code:
            return [(TEMP, "vmov", "acc")]
        return [(TEMP, ins[0], "acc" if i == 0 else TEMP, *ins[1:]) for i, ins in enumerate(code)]

    # ---- addresses ---------------------------------------------------------------------------
    def _mem(self, st, acc: tuple, lvl: str, slot: int, at: dict, loops: list, lane, check: tuple | None):
        """The access as a vector operand: base and steps (one per loop of `loops`) from its flat
        index at `at` and one step along each loop; `lane`: the loop on the lanes (None: a scalar);
        `check`: (extents) to verify the index affine over that box."""
        bk, fflat = acc[0], acc[1]
        at = ZeroState(at)
        off = int(fflat(at, None))
        steps = []
        for lp in loops:
            if lp is None:
                steps.append(0)
                continue
            k = var_key(lp.loop_var)
            b = ZeroState(at)
            b[k] = at[k] + 1
            steps.append(int(fflat(b, None)) - off)
        ln = 0
        if lane is not None:
            b = ZeroState(at)
            b[var_key(lane.loop_var)] = at[var_key(lane.loop_var)] + 1
            ln = int(fflat(b, None)) - off
        if check is not None:
            ck = ("gconv", var_key(st), bk, check)
            if self.fn or ck not in self._checked:
                self._checked.add(ck)
                nd = len(loops)
                g = ZeroState(at)
                for d, (lp, n) in enumerate(zip(loops, check)):
                    if lp is not None:
                        g[var_key(lp.loop_var)] = at[var_key(lp.loop_var)] + np.arange(n).reshape(
                            [-1 if i == d else 1 for i in range(nd)])
                flat = as_full(fflat(g, None), check)
                rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(nd)]) * s
                                    for d, (n, s) in enumerate(zip(check, steps)))
                if not np.array_equal(flat, as_full(rebuilt, check)):
                    raise self._fail(st, f"the index of {self.names.get(bk)} is not affine")
        space, base = self._base(bk, slot)
        if space[0] != lvl:
            raise self._fail(st, f"{self.names.get(bk)} is in {space[0]}, not {lvl}")
        return vx.Mem(lvl, base + off, tuple(steps), ln)

    # ---- lowering one nest -------------------------------------------------------------------
    def _gconv(self, st, E: dict, stage: list | None) -> None:
        S = self._gstatic(st)
        ext = [self._ev(lp.extent, E) for lp in S.outer]
        rb_n = self._ev(S.row.extent, E) if S.row is not None else 1
        ln_n = self._ev(S.lane.extent, E)
        keys = [var_key(lp.loop_var) for lp in S.outer]
        nd = 6
        g = dict(E)
        sp_loops = [*keys, var_key(S.row.loop_var) if S.row is not None else None, var_key(S.lane.loop_var)]
        sp_ext = [*ext, rb_n, ln_n]
        for d, (kv, n) in enumerate(zip(sp_loops, sp_ext)):
            if kv is not None:
                g[kv] = np.arange(n).reshape([-1 if i == d else 1 for i in range(nd)])
        shape = tuple(sp_ext)
        valid = as_full(S.pred(ZeroState(g), None), shape).astype(bool)
        if not valid.any():
            self._flush_deferred(E, stage, {})
            return None

        def prefix(axis_any: np.ndarray, what: str) -> int:
            n = int(axis_any.sum())
            if not axis_any[:n].all():
                raise self._fail(st, f"the {what} that exist are not a range from 0")
            return n
        gbn = prefix(valid.any(axis=(1, 2, 3, 4, 5)), "groups")
        kpg = prefix(valid.any(axis=(0, 2, 3, 4, 5)), "channels")
        nvv = prefix(valid.any(axis=(0, 1, 2, 4, 5)), "column vectors")
        counts = valid.any(axis=(0, 1, 3, 5)).sum(axis=1)  # valid rows per row block
        full = int(np.sum(counts == rb_n)) if counts[0] == rb_n else 0
        tail = int(counts[full]) if full < len(counts) else 0
        if not (counts[:full] == rb_n).all() or (counts[full + 1:] != 0).any() or (tail == 0 and full == 0):
            raise self._fail(st, "the rows that exist are not whole register blocks and a tail")
        # what the nest reads of its tile: the copies into it are clipped to that box
        red = ([S.inner] if S.inner is not None else []) + list(S.taps)
        nt = nd + len(red)
        gg = dict(E)
        for d, (kv, n) in enumerate(zip(sp_loops, sp_ext)):
            if kv is not None:
                gg[kv] = np.arange(n).reshape([-1 if i == d else 1 for i in range(nt)])
        for d, lp in enumerate(red):  # indices grow with every loop: its first and last values
            n = self._ev(lp.extent, E)
            gg[var_key(lp.loop_var)] = np.array([0, n - 1]).reshape([-1 if i == nd + d else 1 for i in range(nt)])
        vmask = valid.reshape(shape + (1,) * len(red))
        def box(fns) -> list:
            out = []
            for f in fns:
                v = np.asarray(f(ZeroState(gg), None))
                vals = np.broadcast_to(v, np.broadcast_shapes(vmask.shape, v.shape))
                sel = vals[np.broadcast_to(vmask, vals.shape)]
                out.append((int(sel.min()), int(sel.max())))
            return out
        # the copies into the stage's tiles (input planes, and with w_path=stage the weights and
        # per-channel parameters) are clipped to what the iterations that exist read
        clip = {S.x[0]: box(S.x[2]), S.w[0]: box(S.w[2])}
        for bk, _, e in S.params:
            clip[bk] = box([self.comp.fn(i) for i in e.indices])
        # weights first, then the input tile (its padding fills, VPU, ahead of both)
        self._deferred.sort(key=lambda d: self._sp(buf_key(self._nest(d[0])[2]))[0] != "SM")
        self._flush_deferred(E, stage, clip)
        if stage is not None:  # padding fills (VPU, reading nothing) issue before the stage's copies
            stage[0][:] = [o for o in stage[0] if o.pipe == "vpu"] + [o for o in stage[0] if o.pipe != "vpu"]
        slot = E.get("slot", 0)
        self._stored[S.epi[-1][4]] = self._stored_box(S, E, (gbn, kpg, full + (1 if tail else 0), nvv), rb_n)
        nests = []
        if full:
            nests.append(self._block(st, S, E, slot, 0, rb_n, (gbn, kpg, full, nvv)))
        if tail:
            nests.append(self._block(st, S, E, slot, full, tail, (gbn, kpg, 1, nvv)))
        kern = vx.VKernel(tuple(nests), "grouped conv")

        def tag(bk: int) -> str:
            return self._tag(bk, slot if self._sp(bk)[2] else 0)
        rd = tuple(dict.fromkeys(t for t in [tag(S.x[0]), f"pad{slot}", tag(S.w[0])] +
                                 [tag(p[0]) for p in S.params] if t))
        nr = full * rb_n + tail
        op = self._vpu_op(kern, rd, (tag(S.epi[-1][4]),), f"conv {gbn * kpg} ch x {nr} rows")
        self._emit(self._intern(op), stage, 1)
        return None

    def _stored_box(self, S: _Static, E: dict, outer: tuple, rb: int) -> list:
        """Per index of the AM tile the last block stores: (min, max) over the iterations that
        exist (rows and lanes at their extremes: the copy out clips only the channels by it)."""
        _, row, lane = S.epi[-1][:3]
        nd = len(S.outer) + 2
        g = dict(E)
        for d, (lp, n) in enumerate(zip(S.outer, outer)):
            g[var_key(lp.loop_var)] = np.arange(n).reshape([-1 if i == d else 1 for i in range(nd)])
        for d, (lp, n) in enumerate(((row, rb), (lane, self.m.lanes))):
            if lp is not None:
                g[var_key(lp.loop_var)] = np.array([0, n - 1]).reshape(
                    [-1 if i == len(S.outer) + d else 1 for i in range(nd)])
        out = []
        for f in self._store_idx(S):
            v = np.asarray(f(ZeroState(g), None))
            out.append((int(v.min()), int(v.max())))
        return out

    def _store_idx(self, S: _Static) -> list:
        k = ("gconv_store", id(S))
        if k not in self._cache:
            self._cache[k] = [self.comp.fn(i) for i in S.epi[-1][6]]
        return self._cache[k]

    def _dma(self, st, E: dict, stage: list | None, part: tuple[int, int] | None = None) -> None:
        """A copy out of a tile a conv nest stored is clipped to the channels the nest stored: TVM's
        region of a block of channels that slices a group runs past the group's end (the block
        predicate is not a region bound), and those channels belong to another stage."""
        loops, _, store = self._nest(st)
        src = store.value
        sp = self._sp(buf_key(store))
        if part is None and stage is not None and sp[0] == "SM" and len(sp) > 2 and sp[2]:
            self._deferred.append((st, E, stage))  # a stage's SM copy: clipped by the conv nest
            return None
        if not (is_buffer_load(src) and buf_key(src) in self._stored) or part is not None:
            return super()._dma(st, E, stage, part)
        clip = self._stored[buf_key(src)]
        k = ("gconv_out", var_key(st))
        if k not in self._cache:
            c = self.comp
            self._cache[k] = (c.flat_fn(buf_key(store), store.indices), c.flat_fn(buf_key(src), src.indices),
                              [c.fn(i) for i in src.indices], None if _nest_pred(st) is None else c.fn(_nest_pred(st)))
        fdst, fsrc, fidx, fpred = self._cache[k]
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in loops]
        shape = tuple(e for _, e in ext)
        g = {**E}
        for d, (v, n) in enumerate(ext):
            g[var_key(v)] = np.arange(n).reshape([-1 if i == d else 1 for i in range(len(ext))])
        valid = valid_mask(fpred, g, shape)
        for d, (f, (lo, hi)) in enumerate(zip(fidx, clip)):
            if d < len(clip) - 2:  # the channel axes (rows and columns: the copy's own box)
                v = as_full(f(g, None), shape)
                valid &= (v >= lo) & (v <= hi)
        boxes = mask_boxes(valid)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copy out of {self.names[buf_key(src)]} is not one box")
        slot = E.get("slot", 0)
        bsrc, bdst = buf_key(src), buf_key(store)
        sspace, sbase = self._base(bsrc, slot)
        dspace, dbase = self._base(bdst, slot)
        for b in boxes:
            sv = self._view(var_key(st), sspace, sbase, fsrc, E, ext, b)
            dv = self._view(var_key(st), dspace, dbase, fdst, E, ext, b)
            op = self._copy_op(bsrc, bdst, sv, dv, (self._tag(bsrc, slot),), (self._tag(bdst, slot),),
                               f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            self._emit(self._intern(op), stage, 2)

    def _block(self, st, S: _Static, E: dict, slot: int, yb0: int, rb: int, outer: tuple) -> vx.Nest:
        """One nest: register blocks of `rb` rows, the first at row block `yb0`."""
        at0 = {**E, **{var_key(lp.loop_var): 0 for lp in S.outer}}
        at0[var_key(S.outer[2].loop_var)] = yb0
        loops = list(S.outer) + [S.inner]
        cin = self._ev(S.inner.extent, E) if S.inner is not None else 1
        box = tuple(outer) + (cin,)
        zero_red = {var_key(lp.loop_var): 0 for lp in ([S.inner] if S.inner is not None else []) + list(S.taps)}
        taps = list(itertools.product(*[range(self._ev(lp.extent, E)) for lp in S.taps]))
        # every (row, tap): the address of its input vector
        uses: dict[int, list] = {}
        mems: dict[int, vx.Mem] = {}
        for j in range(rb):
            for t in taps:
                at = {**at0, **zero_red, **{var_key(lp.loop_var): i for lp, i in zip(S.taps, t)}}
                if S.row is not None:
                    at[var_key(S.row.loop_var)] = j
                at[var_key(S.lane.loop_var)] = 0
                mm = self._mem(st, S.x, "AM", slot, at, loops, S.lane, box if (j, t) == (0, taps[0]) else None)
                uses.setdefault(mm.base, []).append((j, t))
                mems[mm.base] = mm
        wmems = {}
        for t in taps:
            at = {**at0, **zero_red, **{var_key(lp.loop_var): i for lp, i in zip(S.taps, t)}}
            wm = self._mem(st, S.w, "SM", slot, at, loops, None, box if t == taps[0] else None)
            wmems[t] = wm
        pre = tuple(vx.VI("vmov", f"acc{j}", (0.0,)) for j in range(rb))
        body: list = []
        loaded: set = set()
        nx = 0
        for addr in sorted(uses):
            xr = f"x{nx % X_REGS}"
            nx += 1
            body.append(vx.VI("vld", xr, (mems[addr],)))
            for j, t in uses[addr]:
                wr = "w" + "_".join(map(str, t))
                if t not in loaded:
                    loaded.add(t)
                    body.append(vx.VI("sld", wr, (wmems[t],)))
                body.append(vx.VI("vfma", f"acc{j}", (xr, wr, f"acc{j}")))
        # the epilogue: per-channel scalars once per iteration, then each accumulator's instructions
        post: list = []
        for i, (bk, fflat, _) in enumerate(S.params):
            post.append(vx.VI("sld", f"p{i}", (self._mem(st, (bk, fflat), "SM", slot, dict(at0), loops, None, None),)))

        def opnd(x):
            if x == TEMP:
                return TEMP_REG
            return f"p{x[1]}" if isinstance(x, tuple) else x
        for j in range(rb):
            a = f"acc{j}"
            for _, row, lane, code, bk, fflat, _ in S.epi:
                for ins in code:
                    if ins[0] == TEMP:  # into the temporary (one register, the block's rows in turn)
                        post.append(vx.VI(ins[1], TEMP_REG, tuple(a if x == "acc" else opnd(x) for x in ins[2:])))
                    else:
                        post.append(vx.VI(ins[0], a, (a,) + tuple(opnd(x) for x in ins[1:])))
            _, row, lane, _, bk, fflat, _ = S.epi[-1]
            at = dict(at0)
            if row is not None:
                at[var_key(row.loop_var)] = j
            if lane is not None:
                at[var_key(lane.loop_var)] = 0
            sm = self._mem(st, (bk, fflat), "AM", slot, at, loops, lane, None)
            if lane is not None and sm.lane != 1:
                raise self._fail(st, "the output tile's columns are not contiguous")
            post.append(vx.VI("vst", vx.Mem("AM", sm.base, sm.steps, 1), (a,)))
        return vx.Nest(outer=tuple(outer), inner=(cin,), pre=pre, body=tuple(body), post=tuple(post))
