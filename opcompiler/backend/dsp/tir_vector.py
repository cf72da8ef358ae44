"""Vector nests of lowered TIR -> VPU vector kernels (`vector.VKernel`), the TBE `emit_insn` way.

A template marks a loop nest `opc.dsp.op = "vec"` (`schedules/dsp/chain_tir.py`): a perfect nest
over one block storing one expression into an AM tile. The nest becomes one VPU pass, one
`vector.Nest`:

* the innermost loop is the lanes: cut into vectors of `lanes` elements (the last one of a row
  computes whole lanes; stores write whole vectors, so AM tiles get one vector of slack); the
  other loops are the nest's independent outer iterations. The block predicate gives the box
  of iterations that exist (tails of the tensor);
* every buffer access becomes a `Mem`: its flat index evaluated at the box's corner and one step
  along each loop gives base, steps and the lane stride (checked affine over the box). A load
  whose index does not move along the lanes is a scalar: an `sld` from SM, broadcast;
* the stored expression is decomposed into vector instructions, recognised from its nodes:
  loads (`vld` / `sld`), `max(x, c)` -> vmax, `min` -> vmin, `a * b + c` -> one vfma (when b and c
  are both immediates or both per-channel operands), `+`, `-`, `*` -> vadd / vsub / vmul,
  `exp`, `log` and `1 / x` -> the VPU math-library sequences (`vector.emit_exp`, `emit_log`,
  `emit_rcp`), constants as immediates. Inner nodes live in temporaries taken from a pool
  (freed when their last reader has issued; a one-instruction node overwrites an operand that
  dies there); the second operand of a binary node, when it is a load, gets a register named by
  its role (full-shape vectors alternate f0 / f1, a per-channel operand p), an FMA's two
  per-channel operands two temporaries: the registers a nest writes bound how many of its
  iterations are in flight, so names are reused as a VPU programmer would;
* functional mode executes the kernel (`vector.execute`) on the simulated memories; its cycles
  come from list-scheduling the same instructions (`vector.kernel_cost`).

A vector nest holding a window reduction (pooling, `schedules/dsp/pool_tir.py`: a store that
reduces a load of its own buffer with max / + over loops its index does not mention) becomes the
taps unrolled: the first tap loaded into the accumulator, the others through four rotating
registers, one vmax / vadd each (the init block is the first tap). `opc.dsp.separable` reduces
each input row over the columns first into an AM scratch the lowering allocates, then the rows.
A division of the window's result (avg, accumulator in `local.REG`) by (rows factor) * (columns
factor) is one immediate multiply when the divisor is constant, else a per-column reciprocal
vector (AM) times a per-row reciprocal scalar (SM): tables the lowering computes from the
expressions over the loop ranges (`tables`, host constants DMAed once per core). With
`tile_tags`, the copy into a stage tile is clipped to the box the stage's window reads, its
padding (the `if_then_else`'s other value) written by vector stores: rows each stage, the side
columns once per buffer; tiles get their own dependency tags (in / pad / out).

A vector nest marked `opc.dsp.rows` (softmax, `schedules/dsp/softmax_tir.py`) is a row nest:
loops (rows, vectors / acc, acc, lanes) over one element-wise store, optionally followed by a
reduction of the stored element reverse_compute_at its lanes loop. One `vector.Nest` per row
block: per-row operands (loads that do not move along the row) issued once per row, the `acc`
vectors of a step unrolled, the fused reduction kept in `acc` accumulators, combined, lanes
reduced by rotate-and-combine, one lane stored; a reduced value that every other reader divides
by is stored as its reciprocal (`emit_rcp`, once per row) and those divisions become multiplies.
The vector nests of one stage are one VPU pass (their loop nests in order, `_merge_vpu`).

`VecLowerer` is the DSP lowering (`tir_lower.Lowerer`) for kernels made of such nests: buffers
keep the strides the schedule gave them (`storage_align`: each plane / pixel starts a vector),
an AM tile gets one vector of slack, a vector nest's result takes the AM tile of an operand that
dies there (computed in place, as the chip's kernels do), copies from DDR into AM are a stage's
DMA-in. Anything it cannot map is a one-line OpcFailure naming the nest.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure

from . import vector as vx
from .machine import DspMachine
from .program import Allocator, Op, View, dma_op
from .tir_eval import _bkey, _boxes, _full, _grid, _key, _Zero
from .core import sum_costs as _sum_costs
from .tir_lower import Lowerer

VEC = "vec"  # the opc.dsp.op value of a vector nest


def repacked(shape: tuple, strides: tuple, ext: list) -> tuple:
    """The strides of a tile narrowed from `shape` to `ext`: strides the schedule aligned stay,
    the ones that were packed over the axis below are recomputed over the narrowed extents."""
    new_st = list(strides)
    for d in range(len(shape) - 2, -1, -1):
        if strides[d] == shape[d + 1] * strides[d + 1]:  # not aligned: packed over the axis below
            new_st[d] = ext[d + 1] * new_st[d + 1]
    return tuple(new_st)


class VecLowerer(Lowerer):
    """The Lowerer of kernels whose VPU passes are vector nests (element-wise chains)."""

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 dbuf: bool, functional: bool, tamper: Callable | None = None,
                 vtamper: Callable[[vx.VKernel], vx.VKernel] | None = None, tile_tags: bool = False):
        """`vtamper`: tests only, rewrites each vector kernel before it is executed. `tile_tags`:
        each stage tile its own dependency tag (the copy-in, its padding fills, the result), and
        copies into a stage tile clipped to what the stage's window nest reads (pooling)."""
        self.bstrides: dict[int, tuple[int, ...]] = {}
        self.vtamper = vtamper
        self.tile_tags = tile_tags
        self.tables: dict[str, np.ndarray] = {}  # constants the lowering computed (DDR name -> values)
        self._table_ops: list[tuple] = []
        self._deferred: list[tuple] = []
        self._vec_outs: set[int] = set()
        super().__init__(m, func, ddr_names, ddr_shapes, 1, dbuf, False, functional, tamper)

    # ---- buffers --------------------------------------------------------------------------
    def _strides(self, bk: int) -> tuple[int, ...]:
        st = self.bstrides.get(bk)
        return st if st is not None else super()._strides(bk)

    def _allocate(self) -> None:
        """SM / AM buffers (twice in a double-buffered stage) with their strides; AM tiles with a
        vector of slack; a vector nest's result in place of an operand tile that dies there."""
        L = self.m.lanes
        am, sm = Allocator("AM", self.m.cap("AM"), 128), Allocator("SM", self.m.cap("SM"), 8)
        found: list[tuple[Any, bool]] = []
        reads: dict[int, int] = {}  # buffer -> statements reading it
        vec_io: list[tuple[int, list[int]]] = []  # per vector nest: (stored buffer, loaded buffers)
        self.has_shared = False

        def loads(e, acc: list) -> list:
            name = type(e).__name__
            if name in ("BufferLoad", "TensorLoad"):
                acc.append(_bkey(e))
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
                    loads(getattr(e, attr), acc)
            for x in getattr(e, "args", ()):
                loads(x, acc)
            return acc

        vec_loops: list = []
        dma_loops: list = []
        self._ext: dict[int, tuple[int, int]] = {}  # loop variable -> (min, extent), constant loops

        divisors: dict[int, bool] = {}  # buffer -> every read of it (but its own reduction's) divides

        def uses(e, own: int) -> None:
            name = type(e).__name__
            if name == "Div" and _isload(e.b) and _bkey(e.b) != own:
                divisors.setdefault(_bkey(e.b), True)
                uses(e.a, own)
                for x in e.b.indices:
                    uses(x, own)
                return
            if _isload(e) and _bkey(e) != own:
                divisors[_bkey(e)] = False
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
                    uses(getattr(e, attr), own)
            for x in getattr(e, "args", ()):
                uses(x, own)

        def visit(st, in_stage: bool, vec: set | None) -> None:
            """`vec`: the buffers stored so far in the enclosing vector nest (a load of one of
            them there, a reduction fused into the nest, is not another reader of the tile)."""
            name = type(st).__name__
            if name == "SBlockRealize":
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage, vec)
            elif name == "For":
                if st.annotations.get("opc.dsp.op") == "dma_shared":
                    raise OpcFailure("tir lowering: vector kernels have no shared (GSM) copies")
                if type(st.min).__name__ == "IntImm" and type(st.extent).__name__ == "IntImm":
                    self._ext[_key(st.loop_var)] = (int(st.min), int(st.extent))
                if st.annotations.get("opc.dsp.op") == VEC and vec is None:
                    vec_loops.append(st)
                    vec = set()
                    if int(st.annotations.get("opc.dsp.rows", 0)):
                        vec.add("rows")
                if st.annotations.get("opc.dsp.op") == "dma" and in_stage:
                    dma_loops.append(st)
                visit(st.body, in_stage or "opc.dsp.stage" in st.annotations, vec)
            elif name == "SeqStmt":
                for x in st.seq:
                    visit(x, in_stage, vec)
            elif name == "IfThenElse":
                visit(st.then_case, in_stage, vec)
            elif name == "BufferStore":
                ls = loads(st.value, [])
                uses(st.value, _bkey(st))
                for b in set(ls):
                    if vec is None or b not in vec or b == _bkey(st):
                        reads[b] = reads.get(b, 0) + 1
                if vec is not None:
                    vec_io.append((_bkey(st), ls))
                    vec.add(_bkey(st))
                    if "rows" in vec and _bkey(st) in ls:
                        row_reds.add(_bkey(st))
        row_reds: set = set()
        visit(self.func.body, False, None)
        # a reduction fused into a row nest whose every other reader divides by it: its
        # reciprocal is stored, and the divisions are multiplications
        self._recip = {b for b, v in divisors.items() if v} & row_reds
        info: dict[int, tuple] = {}
        for b, in_stage in found:
            shape = tuple(int(x) for x in b.shape)
            bk = _bkey(b)
            self.shapes[bk] = shape
            self.names[bk] = b.name
            if b.scope() == "local.REG":  # a window's accumulator: a register of the nest
                self.space[bk] = ("REG", 1)
                continue
            strides = tuple(int(s) for s in b.strides) if len(b.strides) else None
            if strides is not None and in_stage and self.tile_tags:
                shape, strides = self._tight(bk, shape, strides, dma_loops)
                self.shapes[bk] = shape
            if strides is not None:
                self.bstrides[bk] = strides
            size = shape[0] * strides[0] if strides and shape else int(np.prod(shape))
            info[bk] = (b.scope(), shape, strides, size, in_stage)
        alias: dict[int, int] = {}
        for out, ins in vec_io:  # in place: an operand tile of the same layout that only this nest reads
            if out not in info or info[out][0] != "local.AM":
                continue
            for i in ins:
                if i in info and i != out and i not in alias.values() and reads.get(i) == 1 \
                        and info[i][:3] == info[out][:3] \
                        and info[i][4] == info[out][4]:
                    alias[out] = i
                    break
        for bk, (scope, shape, strides, size, in_stage) in info.items():
            if bk in alias:
                continue
            if scope == "local.AM":
                size = -(-size // L) * L + (L if in_stage else 0)
                alloc = am
            elif scope == "local.SM":
                alloc = sm
            else:
                raise OpcFailure(f"tir lowering: buffer {self.names[bk]} in scope {scope!r} has no place in a "
                                 "vector kernel (local.AM or local.SM)")
            n = self.nbuf if in_stage else 1
            offs = tuple(alloc.alloc(f"{self.names[bk]}[{i}]", size) for i in range(n))
            self.space[bk] = (scope.split(".")[1], offs, in_stage)
        for out, i in alias.items():
            self.space[out] = self.space[i]
        for out, _ in vec_io:
            self._vec_outs.add(out)
        for st in vec_loops:
            w = _window(self, st)
            if w is not None:
                self._window_space(w, am, sm)

    # ---- stages ---------------------------------------------------------------------------
    def _emit(self, op: Op, stage: list | None, where: int) -> None:
        """A copy from off-chip into AM inside a stage is its DMA-in (the base class counts only
        SM destinations as inputs: its AM tiles are outputs)."""
        if stage is not None and where == 2 and op.kind == "dma" and op.path.split("->")[1] in ("AM", "SM") \
                and op.path.split("->")[0] in ("DDR", "GSM"):
            where = 0
        super()._emit(op, stage, where)

    def _merge_vpu(self, calls: list, slot: int) -> Op:
        """The stage's vector nests, one after the other, are one VPU pass (a kernel of their
        loop nests): it reads what its nests read that an earlier one did not write."""
        if not all(isinstance(c, Op) for c in calls):
            return super()._merge_vpu(calls, slot)
        if len(calls) == 1:
            return calls[0]
        if any(c.kind != "vpu" or c.cost is None for c in calls):
            raise OpcFailure("tir lowering: a stage mixes vector nests with other VPU work")
        cost = _sum_costs([(c.cost, 1) for c in calls])
        reads: list = []
        written: set = set()
        for c in calls:
            reads += [t for t in c.reads if t not in written]
            written |= set(c.writes)
        fns = tuple(c.fn for c in calls)
        fn = (lambda mem, fs=fns: sum(f(mem) for f in fs)) if self.fn else None
        op = Op("vpu", "vpu", cycles=cost.cycles, reads=tuple(dict.fromkeys(reads)),
                writes=tuple(dict.fromkeys(t for c in calls for t in c.writes)), cost=cost,
                nruns=sum(c.nruns for c in calls), fn=fn, label="; ".join(c.label for c in calls))
        return self._intern(op)

    # ---- vector nests -----------------------------------------------------------------------
    def _vec(self, st, E: dict, stage: list | None) -> None:
        if int(st.annotations.get("opc.dsp.rows", 0)):
            return self._vec_rownest(st, E, stage)
        w = _window(self, st)
        if w is not None:
            return self._vec_rows(w, E, stage) if w.lanes_red else self._vec_window(w, E, stage)
        self._flush_deferred(E, stage, {})
        nest = _static(self, st)
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in nest.loops]
        shape = tuple(e for _, e in ext)
        g = _grid(ext, E)
        valid = _full(nest.pred(g, None), shape).astype(bool) if nest.pred is not None else np.ones(shape, bool)
        boxes = _boxes(valid)
        if not boxes:
            return
        if len(boxes) > 1 or any(a != 0 for a, _ in boxes[0]):
            raise OpcFailure(f"tir lowering: {nest.name}: the iterations that exist are not one box from 0")
        box = tuple(b for _, b in boxes[0])
        slot = E.get("slot", 0)
        L = self.m.lanes
        mems = [self._mem(nest, a, E, ext, box, slot) for a in nest.accesses]
        outer = tuple(box[:-1]) + (-(-box[-1] // L),)
        body = []
        for ins in nest.code:
            dst = mems[ins.dst[1]] if isinstance(ins.dst, tuple) else ins.dst
            srcs = tuple(mems[s[1]] if isinstance(s, tuple) and s[0] == "mem" else s for s in ins.srcs)
            body.append(vx.VI(ins.op, dst, srcs))
        kern = vx.VKernel((vx.Nest(outer=outer, post=tuple(body)),), nest.name)
        if self.vtamper is not None:
            kern = self.vtamper(kern)
        cost = vx.kernel_cost(self.m, kern)
        fn = (lambda mem, k=kern: vx.execute(mem, k, L)) if self.fn else None
        def tag(bk: int) -> str:  # a buffer outside the stage was written with the first slot's tag
            return self._tag(bk, slot if self._sp(bk)[2] else 0)
        rd = tuple(dict.fromkeys(t for t in (tag(a[0]) for a in nest.accesses[1:]) if t))
        wr = (tag(nest.accesses[0][0]),)
        op = Op("vpu", "vpu", cycles=cost.cycles, reads=rd, writes=wr, cost=cost, nruns=len(kern.nests), fn=fn,
                label=f"{nest.name}: {int(np.prod(box))} elements")
        self._emit(self._intern(op), stage, 1)

    def _mem(self, nest: _Nest, acc: tuple, E: dict, ext: list, box: tuple, slot: int) -> vx.Mem:
        """The access as a vector operand: base and steps from its flat index at the box's corner
        and one step along each loop (checked affine over the box)."""
        bk, fflat, lvl = acc
        keys = [_key(v) for v, _ in ext]
        at = {**E, **dict.fromkeys(keys, 0)}
        off = int(fflat(at, None))
        strides = []
        for k in keys:
            at[k] = 1
            strides.append(int(fflat(at, None)) - off)
            at[k] = 0
        ck = ("vec", nest.name, bk, box)
        if self.fn or ck not in self._checked:
            self._checked.add(ck)
            g = _grid([(v, n) for (v, _), n in zip(ext, box)], E)
            flat = _full(fflat(g, None), box)
            rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(box))]) * s
                                for d, (n, s) in enumerate(zip(box, strides)))
            if not np.array_equal(flat, _full(rebuilt, box)):
                raise OpcFailure(f"tir lowering: {nest.name}: the index of {self.names.get(bk)} is not affine")
        space, base = self._base(bk, slot)
        if space[0] != lvl:
            raise OpcFailure(f"tir lowering: {nest.name}: {self.names.get(bk)} is in {space[0]}, not {lvl}")
        lane = strides[-1]
        return vx.Mem(lvl, base + off, tuple(strides[:-1]) + (lane * self.m.lanes,), lane)

    # ---- window reductions (pooling) ------------------------------------------------------
    def _tight(self, bk: int, shape: tuple, strides: tuple, dma_loops: list) -> tuple[tuple, tuple]:
        """A stage tile filled by a copy nest is as large as that nest writes along each axis
        (TVM's compaction over-approximates a tail clipped to the producer's domain); strides the
        schedule aligned are kept, the ones above recomputed."""
        for st in dma_loops:
            loops, _, store = self._nest(st)
            if _bkey(store) != bk or len(store.indices) != len(shape):
                continue
            const = {_key(lp.loop_var) for lp in loops if type(lp.extent).__name__ == "IntImm"}
            g = _Zero({_key(lp.loop_var): np.arange(int(lp.extent)).reshape([-1 if i == d else 1
                                                                             for i in range(len(loops))])
                       for d, lp in enumerate(loops) if _key(lp.loop_var) in const})
            inner = {_key(lp.loop_var) for lp in loops}
            ext = []
            for d, ix in enumerate(store.indices):
                if (_vars(ix, set()) & inner) - const:  # a copy loop whose extent moves: keep TVM's
                    ext.append(shape[d])
                    continue
                v = np.asarray(self.comp.fn(ix)(g, None))
                ext.append(min(shape[d], int(v.max()) - int(v.min()) + 1))
            return tuple(ext), repacked(shape, strides, ext)
        return shape, strides

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
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in loops]
        shape = tuple(e for _, e in ext)
        g = _grid(ext, E)
        valid = _full(fpred(g, None), shape).astype(bool) if fpred is not None else np.ones(shape, bool)
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
                cost = vx.kernel_cost(self.m, kern)
                fn = (lambda mem, kk=kern: vx.execute(mem, kk, L)) if self.fn else None
                op = Op("vpu", "vpu", cycles=cost.cycles, reads=(), writes=(f"pad{slot}",), cost=cost,
                        nruns=len(kern.nests), fn=fn, label="padding fill")
                self._emit(self._intern(op), stage, 0)
        boxes = _boxes(copy)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, b)
            dv = self._view(k, dspace, dbase, fdst, E, ext, b)
            if self.tamper is not None:
                dv = self.tamper(f"{self.names[bsrc]}->{self.names[bdst]}", dv)
            op = dma_op(self.m, sv, dv, (stag,) if stag else (), (dtag,), self.fn,
                        f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            self._emit(self._intern(op), stage, 0)

    def _vec_window(self, w: _Win, E: dict, stage: list | None) -> None:
        """A window reduction: the taps unrolled (first into the accumulator, the others through
        four rotating registers, vmax / vadd), avg's divisor, one store."""
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in w.spatial]
        shape = tuple(e for _, e in ext)
        g = _grid(ext, E)
        valid = _full(w.pred(g, None), shape).astype(bool) if w.pred is not None else np.ones(shape, bool)
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
        if self.vtamper is not None:
            kern = self.vtamper(kern)
        cost = vx.kernel_cost(self.m, kern)
        fn = (lambda mem_, k=kern: vx.execute(mem_, k, L)) if self.fn else None
        tile = self._tag(w.tap[0], slot)
        rd = (tile, f"pad{slot}") + (("const",) if w.divk is not None and w.divk[0] == "tab" else ())
        op_ = Op("vpu", "vpu", cycles=cost.cycles, reads=rd, writes=(self._tag(w.store[0], slot),), cost=cost,
                 nruns=len(kern.nests), fn=fn, label=f"{w.name}: {int(np.prod(box))} outputs")
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
                cost = vx.kernel_cost(self.m, kern)
                fn = (lambda mem, kk=kern: vx.execute(mem, kk, L)) if self.fn else None
                op = Op("vpu", "vpu", cycles=cost.cycles, reads=(), writes=(f"pad{slot}",), cost=cost,
                        nruns=len(kern.nests), fn=fn, label="identity fill")
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
        if self.vtamper is not None:
            kern = self.vtamper(kern)
        cost = vx.kernel_cost(self.m, kern)
        fn = (lambda mem_, k=kern: vx.execute(mem_, k, L)) if self.fn else None
        o = Op("vpu", "vpu", cycles=cost.cycles, reads=(self._tag(tb, slot), f"pad{slot}"),
               writes=(self._tag(w.store[0], slot),), cost=cost, nruns=len(kern.nests), fn=fn,
               label=f"{w.name}: {nr} rows")
        self._emit(self._intern(o), stage, 1)

    # ---- row nests (softmax) ----------------------------------------------------------------
    def _vec_rownest(self, st, E: dict, stage: list | None) -> None:
        """A row nest (`opc.dsp.rows`): loops (rows, vectors / acc, acc, lanes) over one
        element-wise store, optionally followed by a reduction of the stored value along the row
        (a block reverse_compute_at the lanes loop: `+` / `max` of its own buffer and the stored
        element, a constant init). One `vector.Nest`: the rows its outer iterations, the vectors /
        acc steps its inner loop, the `acc` vectors of a step unrolled (sharing registers). A load
        that does not move along the row (a per-row operand, lane stride 0) is issued once per row
        before the row's vectors. The reduction keeps `acc` accumulators of the stored register,
        combined and lanes reduced (rotate-and-combine) as a lane reduction's, one lane stored per
        row; when every other reader of it divides by it (`_recip`), the reciprocal is stored
        (`emit_rcp`) and those divisions are multiplications. The lanes past the row's end compute
        on the tile's slack, which the lane reduction reading that tile filled with its identity
        (softmax: exp(-FLT_MAX - max) is exp's clamp, ~1e-38, nothing against a sum >= 1)."""
        L = self.m.lanes
        rs = _rowstatic(self, st)
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in rs.loops]
        if ext[3][1] != L:
            raise OpcFailure(f"tir lowering: {rs.name}: the innermost loop must be the {L} lanes")
        self._flush_deferred(E, stage, {})
        g = _Zero(_grid(ext[:1], E))
        valid = _full(rs.pred(g, None), (ext[0][1],)).astype(bool) if rs.pred is not None else np.ones(ext[0][1], bool)
        boxes = _boxes(valid)
        if not boxes:
            return
        if len(boxes) > 1 or boxes[0][0][0] != 0:
            raise OpcFailure(f"tir lowering: {rs.name}: the rows that exist are not one range from 0")
        nr = boxes[0][0][1]
        slot = E.get("slot", 0)
        J, A = ext[1][1], ext[2][1]
        keys = [_key(v) for v, _ in ext]
        box = (nr, J, A, L)

        def mem(acc) -> tuple[int, list[int]]:
            bk, fflat, lvl = acc
            at = _Zero({**E, **dict.fromkeys(keys, 0)})
            off = int(fflat(at, None))
            steps = []
            for k in keys:
                at[k] = 1
                steps.append(int(fflat(at, None)) - off)
                at[k] = 0
            ck = ("rows", rs.name, bk, box)
            if self.fn or ck not in self._checked:
                self._checked.add(ck)
                gg = _Zero(_grid([(v, n) for (v, _), n in zip(ext, box)], E))
                flat = _full(fflat(gg, None), box)
                rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(4)]) * s_
                                    for d, (n, s_) in enumerate(zip(box, steps)))
                if not np.array_equal(flat, _full(rebuilt, box)):
                    raise OpcFailure(f"tir lowering: {rs.name}: the index of {self.names.get(bk)} is not affine")
            space, base = self._base(bk, slot)
            if space[0] != lvl:
                raise OpcFailure(f"tir lowering: {rs.name}: {self.names.get(bk)} is in {space[0]}, not {lvl}")
            return base + off, steps

        ms = [mem(a) for a in rs.accesses]

        def opnd(i: int, a: int) -> vx.Mem:
            b, (si, sj, sa, sl) = ms[i]
            return vx.Mem(rs.accesses[i][2], b + a * sa, (si, sj), sl)
        loads = {i: ins for ins in rs.code if ins.op in ("vld", "sld")
                 for i in [ins.srcs[0][1]]}
        other = [ins.dst for ins in rs.code if isinstance(ins.dst, str) and ins.op not in ("vld", "sld")]
        hoist = {i for i, ins in loads.items() if ms[i][1][1:] == [0, 0, 0] and ins.dst not in other
                 and sum(1 for x in loads.values() if x.dst == ins.dst) == 1}

        def inst(ins: vx.VI, a: int) -> vx.VI:
            dst = opnd(ins.dst[1], a) if isinstance(ins.dst, tuple) else ins.dst
            srcs = tuple(opnd(x[1], a) if isinstance(x, tuple) and x[0] == "mem" else x for x in ins.srcs)
            return vx.VI(ins.op, dst, srcs)
        pre = [inst(loads[i], 0) for i in sorted(hoist)]
        code = [ins for ins in rs.code if not (ins.op in ("vld", "sld") and ins.srcs[0][1] in hoist)]
        body, post = [], []
        wr = [rs.accesses[0][0]]
        red = rs.red
        if red is not None:
            rbk, racc, rload, op, ident = red
            (b0, s0), (b1, s1) = ms[0], mem(rload)
            if b0 != b1 or any(x != y for x, y, n in zip(s0, s1, box) if n > 1):
                raise OpcFailure(f"tir lowering: {rs.name}: the reduction must read the element just stored")
            pre += [vx.VI("vmov", f"s{a}", (ident,)) for a in range(A)]
            post = _combine(op, A) + vx.emit_hreduce(op, "s0", "t", L)
            val = "s0"
            if rbk in self._recip:
                post += vx.emit_rcp("s0", "y", "t")
                val = "y"
            ob, osteps = mem(racc)
            post.append(vx.VI("vst", vx.Mem("AM", ob, (osteps[0], 0)), (val,), lanes=1))
            wr.append(rbk)
        stored = rs.code[-1].srcs[0]
        for a in range(A):
            body += [inst(ins, a) for ins in code]
            if red is not None:
                body.append(vx.VI(red[3], f"s{a}", (f"s{a}", stored)))
        kern = vx.VKernel((vx.Nest(outer=(nr,), inner=(J,), pre=tuple(pre), body=tuple(body), post=tuple(post)),),
                          "row nest")
        if self.vtamper is not None:
            kern = self.vtamper(kern)
        cost = vx.kernel_cost(self.m, kern)
        fn = (lambda mem_, k=kern: vx.execute(mem_, k, L)) if self.fn else None
        rd = tuple(dict.fromkeys(t for t in (self._tag(a[0], slot) for a in rs.accesses[1:]) if t))
        o = Op("vpu", "vpu", cycles=cost.cycles, reads=rd, writes=tuple(dict.fromkeys(self._tag(b, slot) for b in wr)),
               cost=cost, nruns=len(kern.nests), fn=fn, label=f"{rs.name}: {nr} rows")
        self._emit(self._intern(o), stage, 1)


class _Rows:
    """What a row nest lowers to: its four loops, the rows' predicate, the element-wise store's
    accesses and instructions (as `_Nest`), the fused reduction (buffer, store access, load of
    the stored element, opcode, identity) or None."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _rowstatic(low: VecLowerer, st) -> _Rows:
    k = ("rows", _key(st))
    if k in low._cache:
        return low._cache[k]
    loops, s = [], st
    while type(s).__name__ == "For":
        loops.append(s)
        s = s.body
    label = f"row nest over {', '.join(lp.loop_var.name for lp in loops)}"
    if len(loops) != 4:
        raise OpcFailure(f"tir lowering: {label}: a row nest is (rows, vectors / acc, acc, lanes) loops")
    items = list(s.seq) if type(s).__name__ == "SeqStmt" else [s]
    if type(items[0]).__name__ != "SBlockRealize" or type(items[0].block.body).__name__ != "BufferStore" \
            or len(items) > 2:
        raise OpcFailure(f"tir lowering: {label}: one element-wise store, then at most one reduction of it")
    pred, S = items[0].predicate, items[0].block.body
    red = None
    if len(items) == 2:
        stores: list = []

        def collect(x, init):
            n = type(x).__name__
            if n == "For":
                if type(x.extent).__name__ != "IntImm" or int(x.extent) != 1:
                    raise OpcFailure(f"tir lowering: {label}: the fused reduction must sit at the lanes loop")
                collect(x.body, init)
            elif n == "SBlockRealize":
                collect(x.block.body, init)
            elif n == "SeqStmt":
                for y in x.seq:
                    collect(y, init)
            elif n == "IfThenElse":
                collect(x.then_case, True)
            elif n == "BufferStore":
                stores.append((x, init))
            else:
                raise OpcFailure(f"tir lowering: {label}: unexpected {n} in the fused reduction")
        collect(items[1], False)
        main = [x for x, i in stores if not i]
        inits = [_Select.const(x.value) for x, i in stores if i]
        R = main[0] if len(main) == 1 else None
        v = R.value if R is not None else None
        ops = {"Add": "vadd", "Max": "vmax"}
        ok = v is not None and type(v).__name__ in ops and len(inits) == 1 and inits[0] is not None
        ld = None
        if ok:
            for a, b in ((v.a, v.b), (v.b, v.a)):
                if _isload(a) and _bkey(a) == _bkey(R) and _isload(b) and _bkey(b) == _bkey(S):
                    ld = b
        if ld is None:
            raise OpcFailure(f"tir lowering: {label}: after the store only a reduction (+ / max with a constant "
                             "init) of the stored element maps")
        c = low.comp
        rb = _bkey(R)
        red = (rb, (rb, c.flat_fn(rb, R.indices), low._sp(rb)[0]),
               (_bkey(ld), c.flat_fn(_bkey(ld), ld.indices), low._sp(_bkey(ld))[0]), ops[type(v).__name__], inits[0])
    sel = _RowSelect(low, label + f" ({low.names.get(_bkey(S), '?')})", S)
    sel.run()
    pf = None if pred is None or (type(pred).__name__ == "IntImm" and int(pred.value)) else low.comp.fn(pred)
    r = _Rows(name=sel.name, loops=loops, pred=pf, accesses=sel.accesses, code=sel.code, red=red)
    low._cache[k] = r
    return r


class _Nest:
    """What one vector nest lowers to, whatever the enclosing iteration: its loops, predicate,
    accesses (buffer, flat index function, level; the store first) and instructions (with
    ("mem", access) placeholders)."""

    def __init__(self, name: str, loops: list, pred, accesses: list, code: list):
        self.name, self.loops, self.pred, self.accesses, self.code = name, loops, pred, accesses, code


def _static(low: VecLowerer, st) -> _Nest:
    k = ("vec", _key(st))
    if k in low._cache:
        return low._cache[k]
    loops, pred, s = [], None, st
    while True:
        name = type(s).__name__
        if name == "For":
            loops.append(s)
            s = s.body
        elif name == "SBlockRealize":
            if pred is not None:
                raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name}: nested blocks")
            pred = s.predicate
            s = s.block.body
        elif name == "BufferStore":
            break
        else:
            raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name} must be loops over one store, "
                             f"found {name}")
    label = f"vector nest over {', '.join(lp.loop_var.name for lp in loops)} ({low.names.get(_bkey(s), '?')})"
    sel = _Select(low, label, s)
    sel.run()
    pf = None if pred is None or (type(pred).__name__ == "IntImm" and int(pred.value)) else low.comp.fn(pred)
    nest = _Nest(label, loops, pf, sel.accesses, sel.code)
    low._cache[k] = nest
    return nest


POOL = "pool"  # an operand register taken from the temporaries (an FMA's per-channel operands)
_ARITH = {"Add": "vadd", "Sub": "vsub", "Mul": "vmul", "Max": "vmax", "Min": "vmin"}
_COMMUTES = {"Add", "Mul", "Max", "Min"}


class _Select:
    """Instruction selection for one stored expression (see the module docstring)."""

    def __init__(self, low: VecLowerer, name: str, store):
        self.low, self.name, self.store = low, name, store
        self.out_shape = low.shapes.get(_bkey(store))
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
        bk = _bkey(e)
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
        name = type(e).__name__
        if name in ("FloatImm", "IntImm"):
            return float(e.value)
        if name == "Cast" and type(e.value).__name__ in ("FloatImm", "IntImm"):
            return float(e.value.value)
        return None

    def is_load(self, e) -> bool:
        return type(e).__name__ in ("BufferLoad", "TensorLoad")

    def full(self, e) -> bool:
        return self.low.shapes.get(_bkey(e)) == self.out_shape

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
        name = type(e).__name__
        if self.is_load(e):
            return self.load(e, self.temp())
        if name == "Cast":
            if str(e.dtype) != "float32" or str(e.value.dtype) != "float32":
                raise self.fail(f"no conversion {e.value.dtype} -> {e.dtype} on the VPU (fp32 only)")
            return self.reg(e.value)
        if self.const(e) is not None:
            r = self.temp()
            self.code.append(vx.VI("vmov", r, (self.const(e),)))
            return r
        if name == "Call":
            op = e.op.name
            if op in ("tirx.exp", "tirx.log"):
                src = self.reg(e.args[0])
                dst = self.temp()
                self.code += vx.emit_exp(src, dst, "r", "n") if op == "tirx.exp" else vx.emit_log(src, dst, "n")
                self.free(src)
                return dst
            raise self.fail(f"no vector instruction for {op}")
        if name == "Div":
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
        if name not in _ARITH:
            raise self.fail(f"no vector instruction for {name} ({e})")
        a, b = e.a, e.b
        if name in _COMMUTES and self.const(a) is not None:
            a, b = b, a
        if self.const(a) is not None:  # c - x
            if name != "Sub":
                raise self.fail(f"constant expression not folded: {e}")
            src = self.reg(b)
            dst = self.into(src)
            self.code += [vx.VI("vmul", dst, (src, -1.0)), vx.VI("vadd", dst, (dst, self.const(a)))]
            return dst
        if name == "Add" and type(b).__name__ == "Mul" and type(a).__name__ != "Mul":
            a, b = b, a
        if name == "Add" and type(a).__name__ == "Mul" and self.fma(a.b, b):
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
        self.code.append(vx.VI(_ARITH[name], dst, (src, y)))
        if isinstance(y, str):
            self.free(y)
        return dst

    def fma(self, m, c) -> bool:
        """a * m + c is one FMA when m and c are both immediates or both per-channel loads."""
        if self.const(m) is not None and self.const(c) is not None:
            return True
        return self.is_load(m) and self.is_load(c) and not self.full(m) and not self.full(c)

    def rcp(self, d) -> str:
        src = self.reg(d)
        dst, scratch = self.temp(), self.temp()
        self.code += vx.emit_rcp(src, dst, scratch)
        self.free(scratch)
        self.free(src)
        return dst


class _RowSelect(_Select):
    """`_Select`, with x / d a multiplication when d's buffer holds its reciprocal (`_recip`)."""

    def reg(self, e) -> str:
        if type(e).__name__ == "Div" and _isload(e.b) and _bkey(e.b) in self.low._recip:
            src = self.reg(e.a)
            y = self.operand(e.b)
            dst = self.into(src)
            self.code.append(vx.VI("vmul", dst, (src, y)))
            if isinstance(y, str):
                self.free(y)
            return dst
        return super().reg(e)


def _reduce(op: str, taps: list) -> list:
    """acc <- op over the taps, loads rotating over 4 registers."""
    out = [vx.VI("vld", "acc", (taps[0],))]
    for t, m in enumerate(taps[1:]):
        r = f"x{t % 4}"
        out += [vx.VI("vld", r, (m,)), vx.VI(op, "acc", ("acc", r))]
    return out


def _combine(op: str, A: int) -> list:
    """s0 <- s0 op s1 op ... (a tree over the accumulators)."""
    out, k = [], 1
    while k < A:
        out += [vx.VI(op, f"s{a}", (f"s{a}", f"s{a + k}")) for a in range(0, A, 2 * k)]
        k *= 2
    return out


def _isload(e) -> bool:
    return type(e).__name__ in ("BufferLoad", "TensorLoad")


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    cuts = np.flatnonzero(np.diff(idx) != 1)
    return list(zip(np.r_[idx[0], idx[cuts + 1]].tolist(), (np.r_[idx[cuts], idx[-1]] + 1).tolist()))


def _vars(e, acc: set) -> set:
    name = type(e).__name__
    if name == "Var":
        acc.add(_key(e))
    for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
        if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
            _vars(getattr(e, attr), acc)
    for x in getattr(e, "args", ()):
        _vars(x, acc)
    return acc


def _nodes(e, out: list) -> list:
    out.append(e)
    for attr in ("a", "b", "value"):
        if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
            _nodes(getattr(e, attr), out)
    for x in getattr(e, "args", ()):
        _nodes(x, out)
    return out


class _Win:
    """A window reduction nest: spatial loops (the last one on the lanes), reduction loops (the
    taps), the predicate, the tap load and the store (buffer, flat index, level), the reducing
    instruction, avg's divisor (rows factor, lanes factor, the row index) and `separable`."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.divk = None
        self.scratch = ()
        self.hp = 0


def _window(low: VecLowerer, st) -> _Win | None:
    """The window reduction under a vector nest (a store reducing a load of its own buffer with
    max / + over loops its index does not mention), or None for an element-wise nest."""
    if int(st.annotations.get("opc.dsp.rows", 0)):
        return None
    k = ("win", _key(st))
    if k in low._cache:
        return low._cache[k]
    stores: list = []

    def collect(s, path, preds, init):
        n = type(s).__name__
        if n == "For":
            collect(s.body, path + [s], preds, init)
        elif n == "SBlockRealize":
            collect(s.block.body, path, preds + [s.predicate], init)
        elif n == "SeqStmt":
            for x in s.seq:
                collect(x, path, preds, init)
        elif n == "IfThenElse":
            collect(s.then_case, path, preds, True)
        elif n == "BufferStore":
            stores.append((s, path, preds, init))
    collect(st, [], [], False)
    main = [x for x in stores if not x[3]]
    R = None
    for s, path, preds, _ in main:
        v = s.value
        if type(v).__name__ in ("Max", "Add"):
            for a, b in ((v.a, v.b), (v.b, v.a)):
                if _isload(a) and _bkey(a) == _bkey(s) and _isload(b):
                    R = (s, path, b, "vmax" if type(v).__name__ == "Max" else "vadd")
    if R is None:
        low._cache[k] = None
        return None
    F, fpath, fpreds, _ = main[-1]
    fv: set = set()
    for ix in F.indices:
        _vars(ix, fv)
    spatial = [lp for lp in fpath if _key(lp.loop_var) in fv]
    if int(st.annotations.get("opc.dsp.reduce_lanes", 0)) and len(fpath) == 4:
        spatial = fpath[:1]  # (rows, vectors / acc, acc, lanes): the rows loop even when unit (no index left)
    label = f"window nest over {', '.join(lp.loop_var.name for lp in R[1])} ({low.names.get(_bkey(F), '?')})"
    if spatial != fpath[:len(spatial)] or [_key(x.loop_var) for x in R[1][:len(spatial)]] != \
            [_key(x.loop_var) for x in spatial]:
        raise OpcFailure(f"tir lowering: {label}: the output loops must enclose the window loops")
    red = R[1][len(spatial):]
    preds = [p for p in fpreds if not (type(p).__name__ == "IntImm" and int(p.value))]
    fns = [low.comp.fn(p) for p in preds]
    pred = None
    if fns:
        pred = (lambda E, L, fs=tuple(fns): np.logical_and.reduce([np.asarray(f(E, L), bool) for f in fs])
                if len(fs) > 1 else fs[0](E, L))
    div = None
    if F is not R[0]:
        v = F.value
        if not (type(v).__name__ == "Div" and _isload(v.a) and _bkey(v.a) == _bkey(R[0])):
            raise OpcFailure(f"tir lowering: {label}: after the window only a division of its result maps")
        d = v.b
        if type(d).__name__ == "Cast":
            d = d.value
        lane = _key(spatial[-1].loop_var)
        if type(d).__name__ != "Mul":
            raise OpcFailure(f"tir lowering: {label}: the divisor must be (rows factor) * (columns factor)")
        A, B = (d.a, d.b) if lane not in _vars(d.a, set()) else (d.b, d.a)
        if lane in _vars(A, set()) or _vars(B, set()) - {lane}:
            raise OpcFailure(f"tir lowering: {label}: the divisor must be (rows factor) * (columns factor)")
        av = _vars(A, set())
        cands = [n for n in _nodes(A, []) if av and _vars(n, set()) == av]
        Y = None
        if cands:
            small = min(len(str(n)) for n in cands)
            ys = {str(n) for n in cands if len(str(n)) == small}
            if len(ys) == 1:
                Y = next(n for n in cands if len(str(n)) == small)
        div = (A, B, Y)
    tap = R[2]
    sep = bool(int(st.annotations.get("opc.dsp.separable", 0))) and len(red) > 0
    inits = [_Select.const(x[0].value) for x in stores if x[3] and _bkey(x[0]) == _bkey(R[0])]
    ident = inits[0] if inits and inits[0] is not None else None
    lanes_red = bool(int(st.annotations.get("opc.dsp.reduce_lanes", 0)))
    w = _Win(name=label, spatial=spatial, red=red, pred=pred, op=R[3],
             tap=(_bkey(tap), low.comp.flat_fn(_bkey(tap), tap.indices), low._sp(_bkey(tap))[0]),
             tap_idx=[low.comp.fn(i) for i in tap.indices],
             store=(_bkey(F), low.comp.flat_fn(_bkey(F), F.indices), low._sp(_bkey(F))[0]), div=div, sep=sep,
             ident=ident, lanes_red=lanes_red)
    low._cache[k] = w
    return w
