"""Data-movement kernels of lowered TIR (slice, pad, transpose, concat) -> DMA descriptors and fills.

A template (`schedules/dsp/move.py`) schedules the op's own compute: the output cut into
stage items (`opc.dsp.stage`, split over the cores by `opc.dsp.cores`), each item's copy nests
annotated `opc.dsp.op = "dma"`, optionally staged through an AM tile (a `cache_write` in
`local.AM` at the stage loop, two slots when `dbuf`). `MoveLowerer` lowers
every copy nest to DMA descriptors over strided views, the way `lower.direct.Lowerer` does:

* a nest storing a load is one descriptor: the block predicate (tails) gives the box copied,
  the store / load indices (evaluated at the box's corner and one step along each loop, checked
  affine over the box) give the destination / source views;
* a nest storing `if_then_else(c, load, constant)` into an AM tile (pad) is the tile's copy plus
  its fill by vector stores (`lower.vector.VecLowerer._dma_tile`: whole padding rows each stage);
  the side columns (padding on every row that holds input, over all the stage loop's
  iterations) are filled once per buffer, in the first stage that uses the buffer, as the
  chip's kernels initialise a tile; the tile's write-back waits for both (`in` and `pad` tags).

A loop marked `opc.dsp.items` (concat: per image, a stage loop per input, in sequence) makes
its stages, in walk order, one list the cores take contiguous shares of; the AM tiles of its
stage loops share their slots (one stage runs at a time).

A copy into an AM tile is the stage's DMA-in, its write-back the DMA-out; a DDR -> DDR
descriptor is the stage's only op. AM tiles are allocated at their size (no vector of slack: a
fill's last vector of a row is predicated to the box). Imports nothing from `schedules/`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from .. import program as vx  # the VPU's vector instructions
from ..machine import DspMachine
from ..program import Allocator
from .eval import buf_key, mask_boxes, as_full, loop_grid, var_key, valid_mask
from .vector import VecLowerer
from .vselect import Select

# DMA: a copy nest; ITEMS: a loop over stage loops in sequence (concat: per image, x's stages then
# x1's): its stages, in walk order, are one item list the cores take contiguous shares of
from ..intrin import DMA, ITEMS  # noqa: E402


def _is_load(e) -> bool:
    return isinstance(e, TIR.TensorLoad)


def _select(v):
    """(condition, then, else) of an if_then_else call, or None."""
    if isinstance(v, TIR.Call) and v.op.name.endswith("if_then_else"):
        return tuple(v.args)
    return None


class MoveLowerer(VecLowerer):
    """The Lowerer of kernels made only of copy nests (see the module docstring)."""

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 dbuf: bool, functional: bool):
        self._padded = False
        self._stage_loop = None
        super().__init__(m, func, ddr_names, ddr_shapes, dbuf, functional, tile_tags=True)

    # ---- buffers --------------------------------------------------------------------------
    def _allocate(self) -> None:
        """AM tiles (twice in a double-buffered stage), exactly their size."""
        am = Allocator("AM", self.m.cap("AM"), 128)
        found: list[tuple[Any, bool]] = []
        self.has_shared = False
        self._ext = {}

        def visit(st, in_stage) -> None:
            if isinstance(st, TIR.SBlockRealize):
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage)
            elif isinstance(st, TIR.For):
                op = st.annotations.get("opc.dsp.op")
                if op is not None and op != DMA:
                    raise OpcFailure(f"tir lowering: a data-movement kernel has only dma nests, not {op!r}")
                if op == DMA:
                    self._padded |= self._pad_value(st) is not None
                visit(st.body, var_key(st) if "opc.dsp.stage" in st.annotations else in_stage)
            elif isinstance(st, TIR.SeqStmt):
                for x in st.seq:
                    visit(x, in_stage)
            elif isinstance(st, TIR.IfThenElse):
                visit(st.then_case, in_stage)
        visit(self.func.body, None)
        # the tiles of stage loops in sequence (one stage runs at a time) share their slots: the
        # j-th tile of every stage loop at the same offsets, sized for the largest
        groups: dict[Any, list] = {}
        for b, sl in found:
            if sl is not None:
                groups.setdefault(sl, []).append(b)
        shared: dict[int, tuple] = {}
        if len(groups) > 1:
            for j in range(max(len(g) for g in groups.values())):
                col = [g[j] for g in groups.values() if j < len(g)]
                size = max(self._tile_size(b) for b in col)
                offs = tuple(am.alloc(f"{col[0].name}[{i}]", size) for i in range(self.nbuf))
                for b in col:
                    shared[buf_key(b)] = offs
        for b, sl in found:
            in_stage = sl is not None
            shape = tuple(int(x) for x in b.shape)
            bk = buf_key(b)
            self.shapes[bk] = shape
            self.names[bk] = b.name
            if b.scope() != "local.AM":
                raise OpcFailure(f"tir lowering: buffer {b.name} in scope {b.scope()!r}: a data-movement "
                                 "kernel stages through local.AM")
            strides = tuple(int(s) for s in b.strides) if len(b.strides) else None
            if strides is not None:
                self.bstrides[bk] = strides
            if bk in shared:
                self.space[bk] = ("AM", shared[bk], in_stage)
                continue
            n = self.nbuf if in_stage else 1
            self.space[bk] = ("AM", tuple(am.alloc(f"{b.name}[{i}]", self._tile_size(b)) for i in range(n)), in_stage)

    @staticmethod
    def _tile_size(b) -> int:
        shape = tuple(int(x) for x in b.shape)
        strides = tuple(int(s) for s in b.strides) if len(b.strides) else None
        return shape[0] * strides[0] if strides and shape else int(np.prod(shape))

    def _pad_value(self, st) -> float | None:
        """The constant an AM-tile copy nest stores outside its input (pad), else None."""
        _, _, store = self._nest(st)
        sel = _select(store.value)
        if sel is None or _is_load(sel[2]):
            return None
        c = Select.const(sel[2])
        if c is None:
            raise OpcFailure("tir lowering: a dma nest's padding must be a constant")
        return c

    # ---- item lists: stage loops in sequence -----------------------------------------------
    def _split_extent(self, st) -> int | None:
        if isinstance(st, TIR.For) and ITEMS in st.annotations:
            return len(self._items(st, {}))
        return super()._split_extent(st)

    def _items(self, st, E: dict) -> list[tuple[Any, dict, int]]:
        """(stage loop, environment, iteration) of every stage under an items loop, in order."""
        k = ("items", var_key(st), tuple(sorted((kk, v) for kk, v in E.items() if kk != "slot")))
        if k in self._cache:
            return self._cache[k]
        out: list[tuple[Any, dict, int]] = []

        def visit(x, env: dict) -> None:
            if isinstance(x, TIR.For):
                lo, ext = self._ev(x.min, env), self._ev(x.extent, env)
                if "opc.dsp.stage" in x.annotations:
                    out.extend((x, env, i) for i in range(lo, lo + ext))
                    return
                if "opc.dsp.op" in x.annotations or "opc.dsp.cores" in x.annotations:
                    raise OpcFailure("tir lowering: an items loop holds stage loops only")
                for i in range(lo, lo + ext):
                    visit(x.body, {**env, var_key(x.loop_var): i})
            elif isinstance(x, TIR.SeqStmt):
                for y in x.seq:
                    visit(y, env)
            elif isinstance(x, TIR.SBlockRealize):
                if self._ev(x.predicate, env):
                    visit(x.block.body, env)
            elif isinstance(x, TIR.IfThenElse):
                if self._ev(x.condition, env):
                    visit(x.then_case, env)
                elif x.else_case is not None:
                    visit(x.else_case, env)
            else:
                raise OpcFailure(f"tir lowering: unexpected {type(x).__name__} in an items loop")
        visit(st, E)
        self._cache[k] = out
        return out

    def _one_stage(self, st, E: dict, i: int) -> None:
        """Iteration `i` of stage loop `st` as one stage (what the stage loop does per iteration)."""
        self._stage_loop = st
        if not self.fn:
            return self._stages_timed(st, E, range(i, i + 1))
        slot = len(self.pending) % self.nbuf
        E2 = {**E, var_key(st.loop_var): i, "slot": slot}
        stg: list = [[], [], []]
        self._walk(st.body, E2, stg)
        if stg[1]:
            stg[1] = [self._merge_vpu(stg[1], slot)]
        self.pending.append(tuple(stg))
        return None

    # ---- copies ---------------------------------------------------------------------------
    def _walk(self, st, E: dict, stage: list | None = None) -> None:
        if isinstance(st, TIR.For) and ITEMS in st.annotations:
            if stage is not None:
                raise OpcFailure("tir lowering: an items loop inside a stage")
            items = self._items(st, E)
            n = len(items)
            for sl, env, i in items[self.core * n // self.cores:(self.core + 1) * n // self.cores]:
                self._one_stage(sl, env, i)
            return None
        if isinstance(st, TIR.For) and "opc.dsp.stage" in st.annotations:
            self._stage_loop = st
        return super()._walk(st, E, stage)

    def _columns(self, st) -> list[tuple[int, int]]:
        """Runs of tile columns that are padding on every row holding input, over every iteration
        of the stage loop (the side columns the copies never write)."""
        k = ("cols", var_key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            sl = self._stage_loop
            const = [sl] + loops if sl is not None else loops
            if any(not isinstance(lp.extent, TIR.IntImm) or not isinstance(lp.min, TIR.IntImm) for lp in const):
                self._cache[k] = []
                return []
            ext = [(lp.loop_var, int(lp.extent)) for lp in const]
            shape = tuple(e for _, e in ext)
            g = loop_grid(ext, {})
            for lp in const:
                g[var_key(lp.loop_var)] = g[var_key(lp.loop_var)] + int(lp.min)
            cm = as_full(self.comp.fn(_select(store.value)[0])(g, None), shape).astype(bool)
            if pred is not None and not (isinstance(pred, TIR.IntImm) and int(pred.value)):
                cm = cm & as_full(self.comp.fn(pred)(g, None), shape).astype(bool)
            rows = cm.reshape(-1, shape[-1])
            rows = rows[rows.any(axis=1)]
            runs: list[tuple[int, int]] = []
            if len(rows) and (rows == rows[0]).all():
                idx = np.flatnonzero(~rows[0])
                for i in idx.tolist():
                    if runs and runs[-1][1] == i:
                        runs[-1] = (runs[-1][0], i + 1)
                    else:
                        runs.append((i, i + 1))
            self._cache[k] = runs
        return self._cache[k]

    def _side_fill(self, st, E: dict, stage: list) -> None:
        """The side columns of a padded tile, once per buffer: at the buffer's first stage (the key
        `_dma_tile` keeps for them, so it does not fill them again)."""
        slot = E.get("slot", 0)
        key = ("pad", ("tile", var_key(st)), slot)
        if key in self.zeroed:
            return
        runs = self._columns(st)
        if not runs:
            return
        self.zeroed[key] = np.ones(1, bool)
        loops, _, store = self._nest(st)
        if len(loops) != 3:
            raise OpcFailure("tir lowering: padding of a stage tile: (planes, rows, columns) copies only")
        bdst = buf_key(store)
        base = self._base(bdst, slot)[1]
        at = {**E, **{var_key(lp.loop_var): 0 for lp in loops}}
        corner = base + int(self.comp.flat_fn(bdst, store.indices)(at, None))
        strides = self._strides(bdst)
        L, value = self.m.lanes, self._pad_value(st)
        np_, nr = (self._ev(lp.extent, E) for lp in loops[:2])
        for a, b in runs:
            kern = vx.VKernel(tuple(vx.fill_nests(value, corner + a, (np_, nr, b - a), (strides[-3], strides[-2]), L)),
                              "padding fill")
            op = self._vpu_op(kern, (), (f"pad{slot}",), "padding fill")
            self._emit(self._intern(op), stage, 0)

    def _dma(self, st, E: dict, stage: list | None, part: tuple[int, int] | None = None) -> None:
        k = ("move", var_key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            sel = _select(store.value)
            c = self.comp
            if sel is not None and not _is_load(sel[2]):  # padding: copy + fills (VecLowerer)
                self._cache[k] = None
            else:
                if not _is_load(store.value):
                    raise OpcFailure(f"tir lowering: a dma nest must copy a buffer, found {store.value}")
                load = store.value
                pf = None if pred is None or (isinstance(pred, TIR.IntImm) and int(pred.value)) else c.fn(pred)
                self._cache[k] = (loops, pf, c.flat_fn(buf_key(store), store.indices), buf_key(store),
                                  c.flat_fn(buf_key(load), load.indices), buf_key(load))
        info = self._cache[k]
        if info is None:
            if stage is None:
                raise OpcFailure("tir lowering: a padded copy must be inside a stage")
            self._side_fill(st, E, stage)
            return self._dma_tile(st, E, stage, {})
        loops, fpred, fdst, bdst, fsrc, bsrc = info
        ext, shape, g = self._nest_grid(loops, E)
        valid = valid_mask(fpred, g, shape)
        slot = E.get("slot", 0)
        dspace, dbase = self._base(bdst, slot)
        dtag = self._tag(bdst, slot)
        boxes = mask_boxes(valid)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        sspace, sbase = self._base(bsrc, slot)
        stag = self._tag(bsrc, slot)
        reads = tuple(t for t in (stag, f"pad{slot}" if self._padded and sspace[0] == "AM" else "") if t)
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, b)
            dv = self._view(k, dspace, dbase, fdst, E, ext, b)
            op = self._copy_op(bsrc, bdst, sv, dv, reads, (dtag,), f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            # a stage's DMA-in: into its AM tile, or the one DDR -> DDR descriptor
            self._emit(self._intern(op), stage, 2 if sspace[0] == "AM" else 0)


__all__ = ["DMA", "ITEMS", "MoveLowerer"]
