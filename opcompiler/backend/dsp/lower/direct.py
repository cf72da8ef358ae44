"""The DSP backend's TIR lowering: a scheduled, lowered TVM function -> the program the simulator runs.

Templates (`schedules/dsp/direct.py`) build an annotated `s_tir` schedule; this module is the
compiler from its lowered TIR to DSP ops, and imports nothing from `schedules/`.

The function is walked as TVM left it (loops, compacted allocations, block predicates). Loops
above the annotated nests are iterated in Python; every index, predicate and value expression
is compiled once to a Python/numpy function and evaluated over the nest's iteration grid:

* `opc.dsp.op = "dma"`: the nest is one copy. Its store/load indices give the destination and
  source addresses (buffers placed in DDR / SM / AM at the offsets this module allocates, the
  layout TVM compacted them to); the block predicate and the `if_then_else` of the padding
  split the grid into the box DMA'd and the boxes zero-filled. A box that is not rectangular
  or an index that is not affine in the loop variables is an OpcFailure.
* `opc.dsp.op = "mk"`: each iteration is one micro-kernel call (a register block). Functional
  mode executes its blocks statement by statement over the whole iteration grid (reductions
  summed, predicates masked, `local.REG` buffers private per enclosing iteration); timing uses
  the micro-kernel model of `timing.mk_out` with the pixels, vectors and reduction steps of the
  nest.
* `opc.dsp.stage`: each iteration is a stage (DMA-in, VPU, DMA-out) in the software-pipelined
  order of `program.stage_order`, its SM/AM tiles double-buffered when `dbuf`.
* `opc.dsp.cores`: iterations split in contiguous ranges across the cores.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .. import program as vx  # the VPU's vector instructions

from .. import timing as tm

from .. import execute as ex
from ..timing import EPI_REGS, mk_ew, mk_out, mk_ws
from ..machine import DspMachine
from ..program import F32, Allocator, Op, View, dma_op

from ..timing import sum_costs
from ..program import stage_order
from .eval import buf_key, mask_boxes, Compiler, TirExec, as_full, loop_grid, var_key, expr_vars, ZeroState

def blocks_in(st, loops: tuple = ()):
    """Every block realize under `st` in program order, each with the For loops around it (`st`
    itself included when it is one): the walk the nest lowerings share (For bodies, block bodies
    and SeqStmt items are entered; nothing else)."""
    if isinstance(st, TIR.For):
        yield from blocks_in(st.body, loops + (st,))
    elif isinstance(st, TIR.SBlockRealize):
        yield st, loops
        yield from blocks_in(st.block.body, loops)
    elif isinstance(st, TIR.SeqStmt):
        for x in st.seq:
            yield from blocks_in(x, loops)


def lowered(sch):
    """A scheduled module (an `s_tir.Schedule` or its IRModule) as this lowering walks it: init
    blocks lowered, allocations placed where they are used, blocks opaque, buffers compacted to
    the regions their loops touch."""
    import tvm.s_tir.transform as st

    mod = getattr(sch, "mod", sch)
    for p in (st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
              st.CompactBufferAllocation()):
        mod = p(mod)
    return mod["main"]


# epilogue blocks of the conv family in the catalogue's computes, in order
# ("vadd": a residual tensor added, the conv + eltwise fusion; its tile is a stage input in AM)
from ..intrin import ALIGN, EPI_BLOCKS  # noqa: E402,F401
REDUCTIONS = ("conv2d", "matmul", "matmul_rf_update")  # the reduction block of each family (split=k: the rfactor)


class Lowerer:
    """Walks the lowered function once per core and returns that core's op list."""

    am_in: set = frozenset()  # AM tiles a stage copies in from DDR (`_allocate`; lowerings with their own keep none)

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 kv: int, dbuf: bool, gsm_reread: bool,
                 functional: bool, core_names: Mapping[str, Callable[[int], str]] | None = None):
        """`core_names`: parameters each core reads from its own DDR copy (param -> core -> name)."""
        self.m, self.func, self.kv, self.dbuf, self.fn = m, func, kv, dbuf, functional
        self.gsm_reread = gsm_reread
        self.core_names = dict(core_names or {})
        self.core = 0
        self.nbuf = 2 if dbuf else 1
        self.space: dict[int, tuple] = {}  # buffer -> (level, base offsets per slot | DDR name)
        self.shapes: dict[int, tuple[int, ...]] = {}
        # parameters are handles; their buffers are met in the body's loads and stores
        self.names: dict[int, str] = {}
        for p in func.params:
            dn = ddr_names.get(p.name, p.name)
            self.space[var_key(p)] = ("DDR", dn, var_key(p) == var_key(func.params[-1]))
            self.shapes[var_key(p)] = tuple(ddr_shapes[dn])
            self.names[var_key(p)] = p.name
        self.comp = Compiler(lambda b: self._strides(b))
        self._cache: dict[int, Any] = {}  # per nest: compiled pieces
        self.interned: dict[tuple, Op] = {}
        self._sigs: dict[int, list] = {}  # stage loop -> its shape terms, compiled
        self._costs: dict[tuple, Any] = {}  # micro-kernel costs by shape
        self._stages: dict[tuple, tuple] = {}  # timing: (stage, slot, shape, zero state) -> ops
        self._checked: set[tuple] = set()
        self._allocate()

    # ---- buffers -----------------------------------------------------------------------
    def _sp(self, bk: int) -> tuple:
        if bk not in self.space:
            raise OpcFailure("tir lowering: a buffer is neither a parameter nor allocated")
        return self.space[bk]

    def _strides(self, bk: int) -> tuple[int, ...]:
        sh = self.shapes[self._sp(bk) and bk]
        st, acc = [], 1
        for d in reversed(sh):
            st.append(acc)
            acc *= d
        return tuple(reversed(st))

    def _allocate(self) -> None:
        """SM/AM buffers at fixed offsets (the tiles of a stage twice when double-buffered)."""
        am, sm = Allocator("AM", self.m.cap("AM"), ALIGN["AM"]), Allocator("SM", self.m.cap("SM"), ALIGN["SM"])
        gsm = Allocator("GSM", self.m.cap("GSM"), ALIGN["GSM"])  # one for the cluster: every core sees the same
        found: list[tuple[Any, bool]] = []
        self.has_shared = False
        stage_in: list[tuple[int, int]] = []  # (destination, source) of the copies inside a stage

        def visit(st, in_stage: bool) -> None:
            if isinstance(st, TIR.SBlockRealize):
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage)
            elif isinstance(st, TIR.For):
                self.has_shared |= st.annotations.get("opc.dsp.op") == "dma_shared"
                if in_stage and st.annotations.get("opc.dsp.op") == "dma":
                    _, _, store = self._nest(st)
                    val = store.value
                    if isinstance(val, TIR.TensorLoad):
                        stage_in.append((buf_key(store), buf_key(val)))
                visit(st.body, in_stage or "opc.dsp.stage" in st.annotations)
            elif isinstance(st, TIR.SeqStmt):
                for x in st.seq:
                    visit(x, in_stage)
            elif isinstance(st, TIR.IfThenElse):
                visit(st.then_case, in_stage)
        visit(self.func.body, False)
        for b, in_stage in found:
            shape = tuple(int(x) for x in b.shape)
            bk = buf_key(b)
            self.shapes[bk] = shape
            self.names[bk] = b.name
            size = int(np.prod(shape))
            scope = b.scope()
            if scope == "local.REG":
                self.space[bk] = ("REG", size)
                continue
            alloc = {"local.AM": am, "local.SM": sm, "local.GSM": gsm}.get(scope)
            if alloc is None:
                raise OpcFailure(f"tir lowering: buffer {b.name} in scope {scope!r} has no place on the DSP")
            n = self.nbuf if in_stage else 1
            if scope == "local.GSM" and in_stage:  # a staging tile in GSM: each core has its own
                n *= self.m.cores
            offs = tuple(alloc.alloc(f"{b.name}[{i}]", size) for i in range(n))
            self.space[bk] = (scope.split(".")[1], offs, in_stage)
        # an AM tile a stage copies in from DDR (a residual read in the epilogue): a stage input,
        # fetched with the SM input rows (the DMA-in phase) and read by the stage's VPU pass
        self.am_in = {d for d, src in stage_in if self.space.get(d, ("",))[0] == "AM"
                      and self.space.get(src, ("",))[0] == "DDR"}

    def _tag(self, bk: int, slot: int) -> str:
        sp = self._sp(bk)
        if sp[0] == "DDR":
            return "out" if sp[2] else ""
        if sp[0] == "SM":
            return f"sm{slot}"
        if sp[0] == "GSM":
            return f"gsmo{slot}" if sp[2] else "gsm_w"
        if bk in self.am_in:
            return f"ami{slot}"
        return f"amo{slot}" if sp[2] else "w"

    def _base(self, bk: int, slot: int) -> tuple[tuple, int]:
        sp = self._sp(bk)
        if sp[0] == "DDR":
            return ("DDR", sp[1]), 0
        if len(sp) < 3:
            raise OpcFailure(f"tir lowering: {self.names.get(bk)} is not in SM or AM: {sp}")
        if sp[0] == "GSM" and sp[2]:
            return (sp[0],), sp[1][self.core * self.nbuf + slot]
        return (sp[0],), sp[1][slot if sp[2] else 0]

    # ---- walking ------------------------------------------------------------------------
    def core_ops(self, core: int, cores: int, per_image: int) -> list:
        self.core, self.cores, self.per_image = core, cores, per_image
        for p in self.func.params:  # this core's own copies (w_path=host_copies)
            if p.name in self.core_names:
                self.space[var_key(p)] = ("DDR", self.core_names[p.name](core), False)
        self.ops: list = []
        self.pending: list[tuple[list, list, list]] = []
        self.zeroed: dict[tuple, np.ndarray] = {}
        n = self._split_extent(self.func.body)
        if n is not None and (core + 1) * n // cores == core * n // cores and not self.has_shared:
            return []  # no share of the split loop: this core sits the kernel out
        self._walk(self.func.body, {})
        self._flush()
        return self.ops

    def _split_extent(self, st) -> int | None:
        """Extent of the loop split across the cores (a constant in these schedules)."""
        if isinstance(st, TIR.For):
            if "opc.dsp.cores" in st.annotations:
                return int(st.extent)
            return self._split_extent(st.body)
        if isinstance(st, TIR.SBlockRealize):
            return self._split_extent(st.block.body)
        if isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                n = self._split_extent(x)
                if n is not None:
                    return n
        return None

    def _flush(self) -> None:
        if self.pending:
            self.ops += stage_order(self.pending, self.dbuf, self.fn, self.per_image)
            self.pending = []

    def _fn(self, e) -> Callable:
        k = var_key(e)
        if k not in self._cache:
            self._cache[k] = self.comp.fn(e)
        return self._cache[k]

    def _ev(self, e, E: dict) -> int:
        return int(self._fn(e)(E, None))

    def _nest_grid(self, loops, E: dict) -> tuple[list, tuple[int, ...], dict]:
        """A nest's (loop variable, extent) pairs at `E`, its shape, and the index grid over it."""
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in loops]
        return ext, tuple(e for _, e in ext), loop_grid(ext, E)

    def _walk(self, st, E: dict, stage: list | None = None) -> None:
        if isinstance(st, TIR.SBlockRealize):
            if self._ev(st.predicate, E):
                self._walk(st.block.body, E, stage)
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                self._walk(x, E, stage)
        elif isinstance(st, TIR.For):
            ann = st.annotations
            lo, ext = self._ev(st.min, E), self._ev(st.extent, E)
            if ann.get("opc.dsp.op") == "dma":
                return self._dma(st, E, stage)
            if ann.get("opc.dsp.op") == "dma_shared":
                a, b = self.core * ext // self.cores, (self.core + 1) * ext // self.cores
                if b > a:
                    self._dma(st, E, stage, (a, b))
                self._emit(Op("barrier", "sync", label="W in GSM"), stage, 0)
                return None
            if ann.get("opc.dsp.op") == "mk":
                return self._mk(st, E, stage)
            if ann.get("opc.dsp.op") == "mk_ws":
                return self._mk_ws(st, E, stage)
            if ann.get("opc.dsp.op") == "mk_ew":
                return self._mk_ew(st, E, stage)
            if ann.get("opc.dsp.op") == "vec":  # a vector nest: lower.vector.VecLowerer lowers it
                return self._vec(st, E, stage)
            rng = range(lo, lo + ext)
            if "opc.dsp.cores" in ann:
                rng = range(lo + self.core * ext // self.cores, lo + (self.core + 1) * ext // self.cores)
            if "opc.dsp.stage" in ann and not self.fn:
                return self._stages_timed(st, E, rng)
            for i in rng:
                E2 = {**E, var_key(st.loop_var): i}
                if "opc.dsp.stage" in ann:
                    slot = len(self.pending) % self.nbuf
                    E2["slot"] = slot
                    stg: list = [[], [], []]
                    self._walk(st.body, E2, stg)
                    if stg[1]:  # the VPU ops of a stage: one pass of all its micro-kernel calls
                        stg[1] = [self._merge_vpu(stg[1], slot)]
                    self.pending.append(tuple(stg))
                else:
                    self._walk(st.body, E2, stage)
        elif isinstance(st, TIR.IfThenElse):
            if self._ev(st.condition, E):
                self._walk(st.then_case, E, stage)
            elif st.else_case is not None:
                self._walk(st.else_case, E, stage)
        else:
            raise OpcFailure(f"tir lowering: unexpected {type(st).__name__} outside an annotated nest")

    # ---- timing mode: stages keyed by their shape -------------------------------------------
    def _stages_timed(self, st, E: dict, rng: range) -> None:
        """The stage loop in timing mode: a stage equal in shape (and zero-fill state) to one
        already lowered reuses its ops. The shape terms are evaluated for all iterations at once."""
        if not len(rng):
            return
        g = {**E, var_key(st.loop_var): np.arange(rng.start, rng.stop)}
        cols = [np.broadcast_to(np.asarray(f(g, None)), (len(rng),)) for f in self._stage_terms(st)]
        sigs = list(zip(*[c.tolist() for c in cols])) if cols else [()] * len(rng)
        zsig = self._zeroed_sig()
        k = var_key(st)
        for i, sig in zip(rng, sigs):
            slot = len(self.pending) % self.nbuf
            memo = (k, slot, sig, zsig)
            hit = self._stages.get(memo)
            if hit is not None:
                self.pending.append(hit[0])
                if hit[2] != zsig:
                    self.zeroed = {z: v.copy() for z, v in hit[1].items()}
                    zsig = hit[2]
                continue
            E2 = {**E, var_key(st.loop_var): i, "slot": slot}
            stg: list = [[], [], []]
            self._walk(st.body, E2, stg)
            if stg[1]:  # the VPU ops of a stage: one pass of all its micro-kernel calls
                stg[1] = [self._merge_vpu(stg[1], slot)]
            self.pending.append(tuple(stg))
            zsig = self._zeroed_sig()
            self._stages[memo] = (tuple(stg), {z: v.copy() for z, v in self.zeroed.items()}, zsig)

    def _stage_terms(self, st) -> list:
        """What a stage's timing ops can depend on: the values, at this iteration, of every
        outer-variable subterm of the expressions that shape its nests (loop bounds, block
        predicates, conditions, padding tests, the `min` of a tail). Address-only terms (the
        image a tile belongs to) are left out: timing ops do not carry addresses (`_intern`)."""
        k = var_key(st)
        if k not in self._sigs:
            inner: set[int] = set()
            shaping: list = []

            def visit(x) -> None:
                if isinstance(x, TIR.For):
                    inner.add(var_key(x.loop_var))
                    shaping.extend((x.min, x.extent))
                    visit(x.body)
                elif isinstance(x, TIR.SBlockRealize):
                    shaping.append(x.predicate)
                    visit(x.block.body)
                elif isinstance(x, TIR.SeqStmt):
                    for y in x.seq:
                        visit(y)
                elif isinstance(x, TIR.IfThenElse):
                    shaping.append(x.condition)
                    visit(x.then_case)
                    if x.else_case is not None:
                        visit(x.else_case)
                elif isinstance(x, TIR.BufferStore):
                    shaping.append(x.value)  # if_then_else padding tests (indices only move addresses)
            visit(st.body)
            terms: dict[str, Any] = {}
            for e in shaping:
                _outer_terms(e, inner, terms)
            self._sigs[k] = [self.comp.fn(e) for e in terms.values()]
        return self._sigs[k]

    def _zeroed_sig(self) -> tuple:
        return tuple(sorted(((k, v.shape, v.tobytes()) for k, v in self.zeroed.items()), key=lambda t: repr(t[0])))

    def _emit(self, op: Op, stage: list | None, where: int) -> None:
        if stage is None:
            self._flush()
            self.ops.append(op)
        else:
            stage[where].append(op)

    def _intern(self, op: Op) -> Op:
        """Timing mode: equal ops are one object, so repeated stages run-length encode."""
        if self.fn:
            return op
        key = (op.kind, op.pipe, op.cycles, op.reads, op.writes, op.nbytes, op.path, op.nruns, op.cost, op.label)
        return self.interned.setdefault(key, op)

    # ---- copies ------------------------------------------------------------------------
    def _nest(self, st) -> tuple[list, Any, Any]:
        """(loops, predicate, store) of a perfect copy nest."""
        loops, pred = [], None
        while True:
            if isinstance(st, TIR.For):
                loops.append(st)
                st = st.body
            elif isinstance(st, TIR.SBlockRealize):
                pred = st.predicate
                st = st.block.body
            elif isinstance(st, TIR.BufferStore):
                return loops, pred, st
            else:
                raise OpcFailure(f"tir lowering: a dma nest must be loops over one store, found {type(st).__name__}")

    def _dma(self, st, E: dict, stage: list | None, part: tuple[int, int] | None = None) -> None:
        """One copy nest -> zero fills and one DMA; `part`: this core's range of the outer loop."""
        k = var_key(st)
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            val = store.value
            cond, load = None, val
            if isinstance(val, TIR.Call) and val.op.name.endswith("if_then_else"):
                cond, load = val.args[0], val.args[1]
            if not isinstance(load, TIR.TensorLoad):
                raise OpcFailure(f"tir lowering: a dma nest must copy a buffer, found {val}")
            c = self.comp
            masks = c.src(pred) + ("" if cond is None else c.src(cond))
            # the masks are evaluated only over the loops they mention (not the channel loop)
            used = tuple(f"E[{var_key(lp.loop_var)}]" in masks for lp in loops)
            self._cache[k] = (loops, c.fn(pred), None if cond is None else c.fn(cond),
                              c.flat_fn(buf_key(store), store.indices), c.flat_fn(buf_key(load), load.indices),
                              buf_key(store), buf_key(load), used)
        loops, fpred, fcond, fdst, fsrc, bdst, bsrc, used = self._cache[k]
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in loops]
        a0 = 0
        if part is not None:
            a0 = part[0]
            ext[0] = (ext[0][0], part[1] - part[0])
        red = [(v, e if u else 1) for (v, e), u in zip(ext, used)]
        shape = tuple(e for _, e in red)
        g = loop_grid(red, E)
        g[var_key(ext[0][0])] = g[var_key(ext[0][0])] + a0
        valid = as_full(fpred(g, None), shape).astype(bool)
        copy = valid & as_full(fcond(g, None), shape).astype(bool) if fcond is not None else valid
        zero = valid & ~copy
        slot = E.get("slot", 0)
        dspace, dbase = self._base(bdst, slot)
        where = 0 if dspace[0] == "SM" or bdst in self.am_in else 2
        sspace, sbase = self._base(bsrc, slot)
        dtag, stag = self._tag(bdst, slot), self._tag(bsrc, slot)
        if dspace[0] == "SM":
            # a zero already in this SM buffer and not overwritten since is not written again
            # (the side halo of full-width tiles is zeroed once per buffer, as the direct path does)
            zk = (k, slot)
            done = self.zeroed.get(zk)
            if done is not None and done.shape == zero.shape:
                done &= ~copy
                self.zeroed[zk] = done | zero
                zero = zero & ~done
            else:
                self.zeroed[zk] = zero.copy()

        def full(box):  # back to the whole nest: loops the masks do not mention span their extent
            out = [b if u else (0, e) for b, u, (_, e) in zip(box, used, ext)]
            out[0] = (out[0][0] + a0, out[0][1] + a0)
            return tuple(out)
        zviews = [self._view(k, dspace, dbase, fdst, E, ext, full(b)) for b in mask_boxes(zero)]
        if zviews:
            nz = sum(v.size for v in zviews)
            cyc = -(-nz * F32 // (self.m.sld_per_cycle * 8))  # zeroing is scalar stores at the SM port width
            f = (lambda mem, vs=tuple(zviews): [mem.view(v).fill(0.0) for v in vs]) if self.fn else None
            self._emit(self._intern(Op("fill", "vpu", cycles=cyc, writes=(dtag,), fn=f, label="zero padding",
                                        zeros=(dspace[0], nz, "scalar"))),
                       stage, where)
        boxes = mask_boxes(copy)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, full(b))
            dv = self._view(k, dspace, dbase, fdst, E, ext, full(b))
            # reads of the shared weights in GSM are ordered by the barriers, not by the tag
            shared = sspace[0] == "GSM" and not self._sp(bsrc)[2]
            op = self._copy_op(bsrc, bdst, sv, dv, (stag,) if stag and not shared else (), (dtag,),
                               f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            self._emit(self._intern(op), stage, where)
            if shared and self.gsm_reread:  # W_g is rewritten for the next block only
                self._emit(Op("barrier", "sync", label="W_g read"), stage, where)  # after every core read it

    def _copy_op(self, bsrc: int, bdst: int, src: View, dst: View, reads: tuple, writes: tuple, label: str) -> Op:
        """The DMA of one copy box of buffer `bsrc` into `bdst` (every lowering's copies go through
        here: the one place a test injects a wrong address, `tests/dsp/dsp_lowering.py`)."""
        return dma_op(self.m, src, dst, reads, writes, self.fn, label)

    def _vpu_op(self, kern: vx.VKernel, reads: tuple, writes: tuple, label: str, cost: Any = None) -> Op:
        """One VPU pass of a vector kernel: cycles from list-scheduling its instructions (`cost`
        when the caller has it already), values from executing them in functional mode."""
        if cost is None:
            cost = tm.kernel_cost(self.m, kern)
        fn = (lambda mem, k=kern, L=self.m.lanes: ex.execute_pass(mem, k, L)) if self.fn else None
        return Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=writes, cost=cost, nruns=len(kern.nests),
                  fn=fn, label=label)

    def _view(self, nest: int, space: tuple, base: int, fflat: Callable, E: dict, ext: list, box) -> View:
        """The strided window of the index `fflat` over `box` (offset and strides from its values
        at the corner and one step along each loop); in functional mode, and once per nest and
        box shape in timing mode, every element is checked to be on that window (affine index)."""
        lo = [a for a, _ in box]
        shape = tuple(b - a for a, b in box)
        keys = [var_key(v) for v, _ in ext]
        at = {**E, **dict(zip(keys, lo))}
        off = int(fflat(at, None))
        strides = []
        for d, n in enumerate(shape):
            if n > 1:
                at[keys[d]] = lo[d] + 1
                strides.append(int(fflat(at, None)) - off)
                at[keys[d]] = lo[d]
            else:
                strides.append(0)
        ck = (nest, space[0], shape)
        if self.fn or ck not in self._checked:
            self._checked.add(ck)
            g = loop_grid([(v, n) for (v, _), n in zip(ext, shape)], E)
            for (v, _), a in zip(ext, lo):
                g[var_key(v)] = g[var_key(v)] + a
            flat = as_full(fflat(g, None), shape)
            rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(shape))]) * s
                                for d, (n, s) in enumerate(zip(shape, strides)))
            if not np.array_equal(flat, as_full(rebuilt, shape)):
                raise OpcFailure(f"tir lowering: a {space[0]} index is not affine over its copy box")
        keep = [d for d, n in enumerate(shape) if n > 1] or [len(shape) - 1]
        return View(space, base + off, tuple(shape[d] for d in keep), tuple(strides[d] or 1 for d in keep))

    # ---- micro-kernels -------------------------------------------------------------------
    def _mk_static(self, st) -> dict:
        """Per mk nest: the pixel loop, reduction steps, epilogue and the statement programs."""
        k = var_key(st)
        if k in self._cache:
            return self._cache[k]
        body, pix = st.body, None
        while isinstance(body, (TIR.For, TIR.SBlockRealize)) and pix is None:
            if isinstance(body, TIR.For):
                pix = body
            else:
                body = body.block.body
        names, steps, red_pred = [], 1, None

        def scan(s, depth_loops):
            nonlocal steps, red_pred
            if isinstance(s, TIR.For):
                scan(s.body, depth_loops + [s])
            elif isinstance(s, TIR.SBlockRealize):
                names.append(s.block.name_hint)
                if s.block.name_hint in REDUCTIONS:
                    red_pred = s.predicate
                    inner = [lp for lp in depth_loops if not lp.same_as(pix)]
                    steps = int(np.prod([int(lp.extent) for lp in inner[1:]]))  # loops under the lane loop
                scan(s.block.body, depth_loops)
            elif isinstance(s, TIR.SeqStmt):
                for x in s.seq:
                    scan(x, depth_loops)
            elif isinstance(s, TIR.IfThenElse):
                scan(s.then_case, depth_loops)
        scan(st.body, [])
        epi = tuple(EPI_BLOCKS[n] for n in names if n in EPI_BLOCKS)
        info = {"pix": pix, "steps": steps, "epi": epi, "pred": self.comp.fn(red_pred), "costs": {}}
        self._cache[k] = info
        return info

    def _mk(self, st, E: dict, stage: list | None) -> None:
        info = self._mk_static(st)
        lo, ext = self._ev(st.min, E), self._ev(st.extent, E)
        pix = info["pix"]
        pe = int(pix.extent)
        whole = (st, E) if self.fn else None  # functional: the calls run as one grid over this loop
        for i in range(lo, lo + ext):
            E2 = {**E, var_key(st.loop_var): i}
            # pixels of this register block: pixel-loop values whose reduction predicate holds
            g = {**E2, var_key(pix.loop_var): np.arange(pe)}
            npix = int(np.count_nonzero(as_full(self._pred_at(info, g), (pe,)).astype(bool)))
            if npix == 0:
                continue
            if npix not in info["costs"]:
                info["costs"][npix] = mk_out(self.m, npix, self.kv, info["steps"], info["epi"])
            stage[1].append((info["costs"][npix], whole))
            whole = None

    def _valid_pixels(self, st, E: dict) -> np.ndarray:
        """The pixel loop directly under `st` (or `st` itself): which of its values the first
        block's predicate keeps (other inner loops at 0)."""
        k = ("pix", var_key(st))
        if k not in self._cache:
            pix, body, pred = st, st.body, None
            if "opc.dsp.op" in st.annotations and st.annotations["opc.dsp.op"] == "mk_ws":
                pix = body
                body = pix.body
            while pred is None:
                if isinstance(body, TIR.SBlockRealize):
                    pred = body.predicate
                elif isinstance(body, TIR.For):
                    body = body.body
                elif isinstance(body, TIR.SeqStmt):
                    body = body.seq[0]
                else:
                    raise OpcFailure(f"tir lowering: no block under the pixel loop, found {type(body).__name__}")
            self._cache[k] = (pix, self.comp.fn(pred))
        pix, fpred = self._cache[k]
        pe = self._ev(pix.extent, E)
        g = {**E, var_key(pix.loop_var): np.arange(pe)}
        return as_full(fpred(ZeroState(g), None), (pe,)).astype(bool)

    def _mk_ws(self, st, E: dict, stage: list | None) -> None:
        """Each iteration (an input channel) is one weight-stationary call over the tile."""
        ann = st.annotations
        cols, r, s = int(ann["opc.dsp.ws_cols"]), int(ann["opc.dsp.ws_r"]), int(ann["opc.dsp.ws_s"])
        lo, ext = self._ev(st.min, E), self._ev(st.extent, E)
        valid = self._valid_pixels(st, E)
        npix = int(np.count_nonzero(valid))
        if npix == 0:
            return
        wo = min(int(np.count_nonzero(valid[:cols])), npix)
        whole = (st, E) if self.fn else None  # functional: the channel passes run as one grid
        for i in range(lo, lo + ext):
            key = ("ws", npix, wo, i > lo)
            if key not in self._costs:
                self._costs[key] = mk_ws(self.m, npix, self.kv, r, s, wo, i > lo)
            stage[1].append((self._costs[key], whole))
            whole = None

    def _vec(self, st, E: dict, stage: list | None) -> None:
        raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name}: lowered by lower.vector.VecLowerer")

    def _mk_ew(self, st, E: dict, stage: list | None) -> None:
        """The whole nest is one element-wise call over the tile's pixels (the epilogue)."""
        k = ("ew", var_key(st))
        if k not in self._cache:
            names = [x.block.name_hint for x, _ in blocks_in(st)]
            self._cache[k] = tuple(EPI_BLOCKS[n] for n in names if n in EPI_BLOCKS)
        epi = self._cache[k]
        npix = int(np.count_nonzero(self._valid_pixels(st, E)))
        if npix == 0:
            return
        key = ("ew", npix, epi)
        if key not in self._costs:
            fm = sum(e in ("bias", "bn", "res") for e in epi)  # the residual: one more load and add
            self._costs[key] = mk_ew(self.m, npix * self.kv, 1 + int("res" in epi), fm, int("relu" in epi),
                                     sum(EPI_REGS[e] for e in epi), int("hswish" in epi))
        stage[1].append((self._costs[key], (st, E) if self.fn else None))

    def _pred_at(self, info, g: dict):
        """The reduction block's predicate with the inner loops other than the pixel loop at 0."""
        return info["pred"](ZeroState(g), None)

    def _merge_vpu(self, calls: list, slot: int) -> Op:
        cost = sum_costs([(c, 1) for c, _ in calls])
        f = None
        if self.fn:
            bodies = [b for _, b in calls if b is not None]
            n = len(calls)

            def f(mem, bodies=bodies, slot=slot, n=n) -> int:
                for body, E in bodies:
                    TirExec(self, mem, slot).run(body, E)
                return n
        reads = (f"sm{slot}", "w") + ((f"ami{slot}",) if self.am_in else ())
        op = Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=(f"amo{slot}",), cost=cost,
                nruns=len(calls), fn=f, label=f"VPU pass out {len(calls)} blocks")
        return self._intern(op)


def _has_load(e) -> bool:
    if isinstance(e, TIR.TensorLoad):
        return True
    for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
        if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)) and _has_load(getattr(e, attr)):
            return True
    return any(_has_load(x) for x in getattr(e, "args", ()))


def _outer_terms(e, inner: set[int], out: dict[str, Any]) -> None:
    """The largest subterms of `e` that mention no loop variable of the stage (and mention some
    variable), by their script text. The indices of a load are not entered: they only move an
    address, which timing ops do not carry, and a subterm that holds a load is split further (a
    stored value such as max(reg[i], 0) of a one-feature layer's epilogue, whose indices are all
    outer variables, is data, not a shape)."""
    if isinstance(e, TIR.TensorLoad):
        return
    vs = expr_vars(e, set())
    if not vs:
        return
    if not (vs & inner) and not _has_load(e):
        out.setdefault(str(e), e)
        return
    for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
        if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
            _outer_terms(getattr(e, attr), inner, out)
    for x in getattr(e, "args", ()):
        _outer_terms(x, inner, out)
