"""Vector nests of lowered TIR -> VPU vector kernels (`program.VKernel`), the TBE `emit_insn` way.

A template marks a loop nest `opc.dsp.op = "vec"` (`schedules/dsp/chain.py`): a perfect nest
over one block storing one expression into an AM tile. The nest becomes one VPU pass, one
`program.Nest`:

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
  `exp`, `log` and `1 / x` -> the VPU math-library sequences (`program.emit_exp`, `emit_log`,
  `emit_rcp`), constants as immediates. Inner nodes live in temporaries taken from a pool
  (freed when their last reader has issued; a one-instruction node overwrites an operand that
  dies there); the second operand of a binary node, when it is a load, gets a register named by
  its role (full-shape vectors alternate f0 / f1, a per-channel operand p), an FMA's two
  per-channel operands two temporaries: the registers a nest writes bound how many of its
  iterations are in flight, so names are reused as a VPU programmer would;
* functional mode executes the kernel (`execute.execute_pass`) on the simulated memories; its cycles
  come from list-scheduling the same instructions (`timing.kernel_cost`).

A vector nest holding a window reduction (pooling, `schedules/dsp/pool.py`: a store that
reduces a load of its own buffer with max / + over loops its index does not mention) becomes the
taps unrolled: the first tap loaded into the accumulator, the others through four rotating
registers, one vmax / vadd each (the init block is the first tap). `opc.dsp.separable` reduces
each input row over the columns first into an AM scratch the lowering allocates, then the rows.
A division of the window's result (avg, accumulator in `local.REG`) by (rows factor) * (columns
factor) is one immediate multiply when the divisor is constant, else a per-column reciprocal
vector (AM) times a per-row reciprocal scalar (SM), or, when neither factor moves along the lanes
(channels on the lanes, NHWC), a per-row times a per-column reciprocal scalar (both SM): tables the
lowering computes from the expressions over the loop ranges (`tables`, host constants DMAed once
per core). With `tile_tags`, the copy into a stage tile is clipped to the box the stage's window
reads, its padding (the `if_then_else`'s other value) written by vector stores: rows each stage,
the side columns once per buffer (a (planes, rows, pixels, channels) tile with packed pixels is
filled as (planes, rows, pixels x channels), whole pixels); tiles get their own dependency tags
(in / pad / out).

A vector nest marked `opc.dsp.rows` (softmax, `schedules/dsp/reduce.py`) is a row nest:
loops (rows, vectors / acc, acc, lanes) over one element-wise store, optionally followed by a
reduction of the stored element (or a sum of its square: layer norm's variance, one FMA a
vector) reverse_compute_at its lanes loop. One `program.Nest` per row block: per-row operands (loads that do not move along the row) issued once per row, the `acc`
vectors of a step unrolled, the fused reduction kept in `acc` accumulators, combined, lanes
reduced by rotate-and-combine, one lane stored; a reduced value that every other reader divides
by is stored as its reciprocal (`emit_rcp`, once per row) and those divisions become multiplies.
With `opc.dsp.mask_tail` (`schedules/dsp/norm.py`), the lanes past the row's end that the
store's block predicate excludes are multiplied by 0 before they are reduced: a column table (1 on
the row, 0 past it) the lowering computes from the predicate, a host constant DMAed once per core;
the slack columns of the stage tiles the nest loads are zero-filled, so the lanes it masks hold
finite values: once per buffer (copies never write them), or every stage where a vector nest's
result takes the tile (its whole-vector stores write them).
The vector nests of one stage are one VPU pass (their loop nests in order, `_merge_vpu`).

`VecLowerer` is the DSP lowering (`lower.direct.Lowerer`) for kernels made of such nests: buffers
keep the strides the schedule gave them (`storage_align`: each plane / pixel starts a vector),
an AM tile gets one vector of slack, a vector nest's result takes the AM tile of an operand that
dies there (computed in place, as the chip's kernels do), copies from DDR into AM are a stage's
DMA-in. Anything it cannot map is a one-line OpcFailure naming the nest.

The code is in four modules: this one (`VecLowerer`: buffers, stages and their tiles, element-wise
and row nests) and three collaborators it calls with what they need, none of which imports it:
`lower/vwindow.py` (window reductions), `lower/vscan.py` (what each nest is, read once from the TIR)
and `lower/vselect.py` (instruction selection of a stored expression).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .. import program as vx  # the VPU's vector instructions
from ..timing import sum_costs
from ..machine import DspMachine
from ..program import Allocator, Op, View, dma_op
from .eval import buf_key, mask_boxes, as_full, loop_grid, var_key, ZeroState, valid_mask
from .direct import Lowerer
from .vscan import NestInfo, row_static, nest_static, nest_vars, nest_window
from .vselect import combine_ops, is_buffer_load, Select
from .vwindow import mask_runs, vec_rows, vec_window, window_space

from ..intrin import VEC  # noqa: E402  (the opc.dsp.op value of a vector nest)


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
                 dbuf: bool, functional: bool, tile_tags: bool = False):
        """`tile_tags`:
        each stage tile its own dependency tag (the copy-in, its padding fills, the result), and
        copies into a stage tile clipped to what the stage's window nest reads (pooling)."""
        self.bstrides: dict[int, tuple[int, ...]] = {}
        self.tile_tags = tile_tags
        self.tables: dict[str, np.ndarray] = {}  # constants the lowering computed (DDR name -> values)
        self._table_ops: list[tuple] = []
        self._deferred: list[tuple] = []
        self._vec_outs: set[int] = set()
        self._masks: dict[int, int] = {}  # masked row nest (its loop) -> AM offset of its column table
        super().__init__(m, func, ddr_names, ddr_shapes, 1, dbuf, False, functional)

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
            if isinstance(e, TIR.TensorLoad):
                acc.append(buf_key(e))
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
            if isinstance(e, TIR.Div) and is_buffer_load(e.b) and buf_key(e.b) != own:
                divisors.setdefault(buf_key(e.b), True)
                uses(e.a, own)
                for x in e.b.indices:
                    uses(x, own)
                return
            if is_buffer_load(e) and buf_key(e) != own:
                divisors[buf_key(e)] = False
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
                    uses(getattr(e, attr), own)
            for x in getattr(e, "args", ()):
                uses(x, own)

        def visit(st, in_stage: bool, vec: set | None) -> None:
            """`vec`: the buffers stored so far in the enclosing vector nest (a load of one of
            them there, a reduction fused into the nest, is not another reader of the tile)."""
            if isinstance(st, TIR.SBlockRealize):
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage, vec)
            elif isinstance(st, TIR.For):
                if st.annotations.get("opc.dsp.op") == "dma_shared":
                    raise OpcFailure("tir lowering: vector kernels have no shared (GSM) copies")
                if isinstance(st.min, TIR.IntImm) and isinstance(st.extent, TIR.IntImm):
                    self._ext[var_key(st.loop_var)] = (int(st.min), int(st.extent))
                if st.annotations.get("opc.dsp.op") == VEC and vec is None:
                    vec_loops.append(st)
                    vec = set()
                    if int(st.annotations.get("opc.dsp.rows", 0)):
                        vec.add("rows")
                if st.annotations.get("opc.dsp.op") == "dma" and in_stage:
                    dma_loops.append(st)
                visit(st.body, in_stage or "opc.dsp.stage" in st.annotations, vec)
            elif isinstance(st, TIR.SeqStmt):
                for x in st.seq:
                    visit(x, in_stage, vec)
            elif isinstance(st, TIR.IfThenElse):
                visit(st.then_case, in_stage, vec)
            elif isinstance(st, TIR.BufferStore):
                ls = loads(st.value, [])
                uses(st.value, buf_key(st))
                for b in set(ls):
                    if vec is None or b not in vec or b == buf_key(st):
                        reads[b] = reads.get(b, 0) + 1
                if vec is not None:
                    vec_io.append((buf_key(st), ls))
                    vec.add(buf_key(st))
                    if "rows" in vec and buf_key(st) in ls:
                        row_reds.add(buf_key(st))
        row_reds: set = set()
        visit(self.func.body, False, None)
        # a reduction fused into a row nest whose every other reader divides by it: its
        # reciprocal is stored, and the divisions are multiplications
        self._recip = {b for b, v in divisors.items() if v} & row_reds
        info: dict[int, tuple] = {}
        for b, in_stage in found:
            shape = tuple(int(x) for x in b.shape)
            bk = buf_key(b)
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
            w = nest_window(self, st)
            if w is not None:
                window_space(self, w, am, sm)
            elif int(st.annotations.get("opc.dsp.mask_tail", 0)):
                self._mask_table(st, am)

    def _mask_table(self, st, am: Allocator) -> None:
        """A masked row nest's column table (`opc.dsp.mask_tail`): 1.0 where the store's block
        predicate holds along (vectors / acc, acc, lanes) of a row, else 0; none when every lane
        of the row's vectors is on the row. Equal tables are one."""
        loops, s = [], st
        while isinstance(s, TIR.For):
            loops.append(s)
            s = s.body
        s = s.seq[0] if isinstance(s, TIR.SeqStmt) else s
        if len(loops) != 4 or not isinstance(s, TIR.SBlockRealize):
            raise OpcFailure("tir lowering: opc.dsp.mask_tail marks a row nest (rows, vectors / acc, acc, lanes)")
        ext = [(lp.loop_var, 1 if d == 0 else int(lp.extent)) for d, lp in enumerate(loops)]
        shape = tuple(n for _, n in ext[1:])
        keep = as_full(self.comp.fn(s.predicate)(ZeroState(loop_grid(ext, {})), None), (1,) + shape).reshape(-1)
        if keep.all():
            return
        vals = keep.astype(np.float32)
        for nm, v in self.tables.items():
            if nm.startswith("row_mask") and np.array_equal(v, vals):
                self._masks[var_key(st)] = next(off for t, _, off, _ in self._table_ops if t == nm)
                return
        nm = f"row_mask{sum(1 for t in self.tables if t.startswith('row_mask'))}"
        self.tables[nm] = vals
        off = am.alloc(f"{nm} (tail mask)", len(vals))
        self._table_ops.append((nm, "AM", off, len(vals)))
        self._masks[var_key(st)] = off

    def _tight(self, bk: int, shape: tuple, strides: tuple, dma_loops: list) -> tuple[tuple, tuple]:
        """A stage tile filled by a copy nest is as large as that nest writes along each axis
        (TVM's compaction over-approximates a tail clipped to the producer's domain); strides the
        schedule aligned are kept, the ones above recomputed."""
        for st in dma_loops:
            loops, _, store = self._nest(st)
            if buf_key(store) != bk or len(store.indices) != len(shape):
                continue
            const = {var_key(lp.loop_var) for lp in loops if isinstance(lp.extent, TIR.IntImm)}
            g = ZeroState({var_key(lp.loop_var): np.arange(int(lp.extent)).reshape([-1 if i == d else 1
                                                                             for i in range(len(loops))])
                       for d, lp in enumerate(loops) if var_key(lp.loop_var) in const})
            inner = {var_key(lp.loop_var) for lp in loops}
            ext = []
            for d, ix in enumerate(store.indices):
                if (nest_vars(ix, set()) & inner) - const:  # a copy loop whose extent moves: keep TVM's
                    ext.append(shape[d])
                    continue
                v = np.asarray(self.comp.fn(ix)(g, None))
                ext.append(min(shape[d], int(v.max()) - int(v.min()) + 1))
            return tuple(ext), repacked(shape, strides, ext)
        return shape, strides

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
        cost = sum_costs([(c.cost, 1) for c in calls])
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
    # ---- stage tiles (tile_tags) and the window nests' tables ------------------------------------
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
            sp = self._sp(buf_key(store))
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
        k = ("tile", var_key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            val = store.value
            cond, load, other = None, val, None
            if isinstance(val, TIR.Call) and val.op.name.endswith("if_then_else"):
                cond, load, other = val.args
                other = Select.const(other)
                if other is None:
                    raise OpcFailure("tir lowering: the padding of a stage tile must be a constant")
            c = self.comp
            self._cache[k] = (loops, None if pred is None else c.fn(pred), None if cond is None else c.fn(cond),
                              c.flat_fn(buf_key(store), store.indices), c.flat_fn(buf_key(load), load.indices),
                              buf_key(store), buf_key(load), [c.fn(i) for i in store.indices], other)
        loops, fpred, fcond, fdst, fsrc, bdst, bsrc, fidx, other = self._cache[k]
        ext, shape, g = self._nest_grid(loops, E)
        valid = valid_mask(fpred, g, shape)
        for f, (lo, hi) in zip(fidx, clip.get(bdst, ())):
            v = as_full(f(g, None), shape)
            valid &= (v >= lo) & (v <= hi)
        copy = valid & as_full(fcond(g, None), shape).astype(bool) if fcond is not None else valid
        zero = valid & ~copy
        slot = E.get("slot", 0)
        dspace, dbase = self._base(bdst, slot)
        sspace, sbase = self._base(bsrc, slot)
        dtag, stag = self._tag(bdst, slot), self._tag(bsrc, slot)
        if zero.any():
            strides = self._strides(bdst)
            fvalid, fcopy, fshape = valid, copy, shape
            if len(shape) == 4 and strides[-1] == 1 and strides[-2] == shape[-1]:
                # (planes, rows, pixels, channels) with the pixels packed (NHWC): a row is one run of
                # pixels x channels; padding is whole pixels (a channel block's tail lanes with them)
                nc = shape[-1]
                fshape = shape[:2] + (shape[2] * nc,)
                zero = np.repeat(zero.any(axis=-1), nc, axis=-1).reshape(fshape)
                fvalid, fcopy = valid.reshape(fshape) | zero, copy.reshape(fshape)
                strides = strides[:2] + (1,)
            if len(fshape) != 3:
                raise OpcFailure("tir lowering: padding of a stage tile: (planes, rows, columns) copies only")
            pp, w = strides[-3], strides[-2]
            planes = np.flatnonzero(fvalid.any(axis=(1, 2)))
            p0, np_ = int(planes[0]), len(planes)
            if planes[-1] - p0 + 1 != np_:
                raise OpcFailure("tir lowering: the planes copied into a stage tile are not one range")
            at = {**E, **{var_key(v): 0 for v, _ in ext}}
            at[var_key(ext[0][0])] = p0
            corner = dbase + int(fdst(at, None))
            rows = fvalid[p0:p0 + np_].any(axis=(0, 2))
            fullz = rows & ~fcopy[p0:p0 + np_].any(axis=(0, 2))
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
                key = ("pad", k, slot) if p0 == 0 and ext[0][1] == fshape[0] else ("pad", k, slot, p0)
                if key not in self.zeroed:
                    self.zeroed[key] = np.ones(1, bool)
                    npl = fshape[0] if len(key) == 3 else np_
                    for a, b in mask_runs(colz):
                        fills.append((a, (npl, fshape[1], b - a)))
            for a, b in mask_runs(fullz):
                fills.append((a * w, (np_, b - a, w)))
            L = self.m.lanes
            for off, fs in fills:
                kern = vx.VKernel(tuple(vx.fill_nests(other, corner + off, fs, (pp, w), L)), "padding fill")
                op = self._vpu_op(kern, (), (f"pad{slot}",), "padding fill")
                self._emit(self._intern(op), stage, 0)
        boxes = mask_boxes(copy)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, b)
            dv = self._view(k, dspace, dbase, fdst, E, ext, b)
            op = self._copy_op(bsrc, bdst, sv, dv, (stag,) if stag else (), (dtag,),
                               f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            self._emit(self._intern(op), stage, 0)

    def _vec(self, st, E: dict, stage: list | None) -> None:
        if int(st.annotations.get("opc.dsp.rows", 0)):
            return self._vec_rownest(st, E, stage)
        w = nest_window(self, st)
        if w is not None:
            return vec_rows(self, w, E, stage) if w.lanes_red else vec_window(self, w, E, stage)
        self._flush_deferred(E, stage, {})
        nest = nest_static(self, st)
        ext, shape, g = self._nest_grid(nest.loops, E)
        valid = valid_mask(nest.pred, g, shape)
        boxes = mask_boxes(valid)
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

        def tag(bk: int) -> str:  # a buffer outside the stage was written with the first slot's tag
            return self._tag(bk, slot if self._sp(bk)[2] else 0)
        rd = tuple(dict.fromkeys(t for t in (tag(a[0]) for a in nest.accesses[1:]) if t))
        wr = (tag(nest.accesses[0][0]),)
        op = self._vpu_op(kern, rd, wr, f"{nest.name}: {int(np.prod(box))} elements")
        self._emit(self._intern(op), stage, 1)

    def _mem(self, nest: NestInfo, acc: tuple, E: dict, ext: list, box: tuple, slot: int) -> vx.Mem:
        """The access as a vector operand: base and steps from its flat index at the box's corner
        and one step along each loop (checked affine over the box)."""
        bk, fflat, lvl = acc
        keys = [var_key(v) for v, _ in ext]
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
            g = loop_grid([(v, n) for (v, _), n in zip(ext, box)], E)
            flat = as_full(fflat(g, None), box)
            rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(box))]) * s
                                for d, (n, s) in enumerate(zip(box, strides)))
            if not np.array_equal(flat, as_full(rebuilt, box)):
                raise OpcFailure(f"tir lowering: {nest.name}: the index of {self.names.get(bk)} is not affine")
        space, base = self._base(bk, slot)
        if space[0] != lvl:
            raise OpcFailure(f"tir lowering: {nest.name}: {self.names.get(bk)} is in {space[0]}, not {lvl}")
        lane = strides[-1]
        return vx.Mem(lvl, base + off, tuple(strides[:-1]) + (lane * self.m.lanes,), lane)

    # ---- row nests (softmax) ----------------------------------------------------------------
    def _vec_rownest(self, st, E: dict, stage: list | None) -> None:
        """A row nest (`opc.dsp.rows`): loops (rows, vectors / acc, acc, lanes) over one
        element-wise store, optionally followed by a reduction of the stored value along the row
        (a block reverse_compute_at the lanes loop: `+` / `max` of its own buffer and the stored
        element, a constant init). One `program.Nest`: the rows its outer iterations, the vectors /
        acc steps its inner loop, the `acc` vectors of a step unrolled (sharing registers). A load
        that does not move along the row (a per-row operand, lane stride 0) is issued once per row
        before the row's vectors. The reduction keeps `acc` accumulators of the stored register,
        combined and lanes reduced (rotate-and-combine) as a lane reduction's, one lane stored per
        row; when every other reader of it divides by it (`_recip`), the reciprocal is stored
        (`emit_rcp`) and those divisions are multiplications. The lanes past the row's end compute
        on the tile's slack, which the lane reduction reading that tile filled with its identity
        (softmax: exp(-FLT_MAX - max) is exp's clamp, ~1e-38, nothing against a sum >= 1)."""
        L = self.m.lanes
        rs = row_static(self, st)
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in rs.loops]
        if ext[3][1] != L:
            raise OpcFailure(f"tir lowering: {rs.name}: the innermost loop must be the {L} lanes")
        self._flush_deferred(E, stage, {})
        slot = E.get("slot", 0)
        mask = self._masks.get(var_key(st))
        if mask is not None:  # the loaded tiles' slack columns: finite (0)
            for bk in dict.fromkeys(a[0] for a in rs.accesses[1:]):
                shape, strides = self.shapes[bk], self._strides(bk)
                sp = self._sp(bk)
                if sp[0] != "AM" or len(sp) < 3 or not sp[2] or len(shape) != 2 or strides[0] <= shape[1] \
                        or ("ident", bk, slot) in self.zeroed:
                    continue
                if not any(self._sp(o)[:2] == sp[:2] for o in self._vec_outs):  # else: every stage
                    self.zeroed[("ident", bk, slot)] = np.ones(1, bool)
                base = self._base(bk, slot)[1]
                kern = vx.VKernel(tuple(vx.fill_nests(0.0, base + shape[1], (1, shape[0], strides[0] - shape[1]),
                                                      (0, strides[0]), L)), "slack fill")
                self._emit(self._intern(self._vpu_op(kern, (), (f"pad{slot}",), "slack fill")), stage, 0)
        g = ZeroState(loop_grid(ext[:1], E))
        valid = as_full(rs.pred(g, None), (ext[0][1],)).astype(bool) if rs.pred is not None else np.ones(ext[0][1], bool)
        boxes = mask_boxes(valid)
        if not boxes:
            return
        if len(boxes) > 1 or boxes[0][0][0] != 0:
            raise OpcFailure(f"tir lowering: {rs.name}: the rows that exist are not one range from 0")
        nr = boxes[0][0][1]
        J, A = ext[1][1], ext[2][1]
        keys = [var_key(v) for v, _ in ext]
        box = (nr, J, A, L)

        def mem(acc) -> tuple[int, list[int]]:
            bk, fflat, lvl = acc
            at = ZeroState({**E, **dict.fromkeys(keys, 0)})
            off = int(fflat(at, None))
            steps = []
            for k in keys:
                at[k] = 1
                steps.append(int(fflat(at, None)) - off)
                at[k] = 0
            ck = ("rows", rs.name, bk, box)
            if self.fn or ck not in self._checked:
                self._checked.add(ck)
                gg = ZeroState(loop_grid([(v, n) for (v, _), n in zip(ext, box)], E))
                flat = as_full(fflat(gg, None), box)
                rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(4)]) * s_
                                    for d, (n, s_) in enumerate(zip(box, steps)))
                if not np.array_equal(flat, as_full(rebuilt, box)):
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
            rbk, racc, rload, op, ident, square = red
            (b0, s0), (b1, s1) = ms[0], mem(rload)
            if b0 != b1 or any(x != y for x, y, n in zip(s0, s1, box) if n > 1):
                raise OpcFailure(f"tir lowering: {rs.name}: the reduction must read the element just stored")
            pre += [vx.VI("vmov", f"s{a}", (ident,)) for a in range(A)]
            post = combine_ops(op, A) + vx.emit_hreduce(op, "s0", "t", L)
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
            if red is None:
                continue
            if mask is not None:  # the lanes past the row's end times 0 (the column table)
                body.append(vx.VI("vld", "mk", (vx.Mem("AM", mask + a * L, (0, A * L)),)))
            if square and mask is not None:
                body += [vx.VI("vmul", "mx", (stored, "mk")), vx.VI("vfma", f"s{a}", ("mx", stored, f"s{a}"))]
            elif square or mask is not None:
                body.append(vx.VI("vfma", f"s{a}", (stored, "mk" if mask is not None else stored, f"s{a}")))
            else:
                body.append(vx.VI(red[3], f"s{a}", (f"s{a}", stored)))
        kern = vx.VKernel((vx.Nest(outer=(nr,), inner=(J,), pre=tuple(pre), body=tuple(body), post=tuple(post)),),
                          "row nest")
        rd = tuple(dict.fromkeys(t for t in (self._tag(a[0], slot) for a in rs.accesses[1:]) if t)) + \
            (("const", f"pad{slot}") if mask is not None else ())
        o = self._vpu_op(kern, rd, tuple(dict.fromkeys(self._tag(b, slot) for b in wr)), f"{rs.name}: {nr} rows")
        self._emit(self._intern(o), stage, 1)
