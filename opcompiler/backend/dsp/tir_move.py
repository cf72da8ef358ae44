"""Data-movement kernels of lowered TIR (slice, pad, transpose) -> DMA descriptors and fills.

A template (`schedules/dsp/move_tir.py`) schedules the op's own compute: the output cut into
stage items (`opc.dsp.stage`, split over the cores by `opc.dsp.cores`), each item's copy nests
annotated `opc.dsp.op = "dma"`, optionally staged through an AM tile (a `cache_write` in
`local.AM` at the stage loop, two slots when `dbuf`). `MoveLowerer` lowers
every copy nest to DMA descriptors over strided views, the way `tir_lower.Lowerer` does:

* a nest storing a load is one descriptor: the block predicate (tails) gives the box copied,
  the store / load indices (evaluated at the box's corner and one step along each loop, checked
  affine over the box) give the destination / source views;
* a nest storing `if_then_else(c, load, constant)` into an AM tile (pad) is the tile's copy plus
  its fill by vector stores (`tir_vector.VecLowerer._dma_tile`: whole padding rows each stage);
  the side columns (padding on every row that holds input, over all the stage loop's
  iterations) are filled once per buffer, in the first stage that uses the buffer, as the
  chip's kernels initialise a tile; the tile's write-back waits for both (`in` and `pad` tags).

A copy into an AM tile is the stage's DMA-in, its write-back the DMA-out; a DDR -> DDR
descriptor is the stage's only op. AM tiles are allocated at their size (no vector of slack: a
fill's last vector of a row is predicated to the box). Imports nothing from `schedules/`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure

from . import vector as vx
from .machine import DspMachine
from .program import Allocator, Op, dma_op
from .tir_eval import _bkey, _boxes, _full, _grid, _key
from .tir_vector import VecLowerer, _Select

DMA = "dma"


def _is_load(e) -> bool:
    return type(e).__name__ in ("BufferLoad", "TensorLoad")


def _select(v):
    """(condition, then, else) of an if_then_else call, or None."""
    if type(v).__name__ == "Call" and v.op.name.endswith("if_then_else"):
        return tuple(v.args)
    return None


class MoveLowerer(VecLowerer):
    """The Lowerer of kernels made only of copy nests (see the module docstring)."""

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 dbuf: bool, functional: bool, tamper: Callable | None = None):
        self._padded = False
        self._stage_loop = None
        super().__init__(m, func, ddr_names, ddr_shapes, dbuf, functional, tamper, None, tile_tags=True)

    # ---- buffers --------------------------------------------------------------------------
    def _allocate(self) -> None:
        """AM tiles (twice in a double-buffered stage), exactly their size."""
        am = Allocator("AM", self.m.cap("AM"), 128)
        found: list[tuple[Any, bool]] = []
        self.has_shared = False
        self._ext = {}

        def visit(st, in_stage: bool) -> None:
            name = type(st).__name__
            if name == "SBlockRealize":
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage)
            elif name == "For":
                op = st.annotations.get("opc.dsp.op")
                if op is not None and op != DMA:
                    raise OpcFailure(f"tir lowering: a data-movement kernel has only dma nests, not {op!r}")
                if op == DMA:
                    self._padded |= self._pad_value(st) is not None
                visit(st.body, in_stage or "opc.dsp.stage" in st.annotations)
            elif name == "SeqStmt":
                for x in st.seq:
                    visit(x, in_stage)
            elif name == "IfThenElse":
                visit(st.then_case, in_stage)
        visit(self.func.body, False)
        for b, in_stage in found:
            shape = tuple(int(x) for x in b.shape)
            bk = _bkey(b)
            self.shapes[bk] = shape
            self.names[bk] = b.name
            if b.scope() != "local.AM":
                raise OpcFailure(f"tir lowering: buffer {b.name} in scope {b.scope()!r}: a data-movement "
                                 "kernel stages through local.AM")
            strides = tuple(int(s) for s in b.strides) if len(b.strides) else None
            if strides is not None:
                self.bstrides[bk] = strides
            size = shape[0] * strides[0] if strides and shape else int(np.prod(shape))
            n = self.nbuf if in_stage else 1
            self.space[bk] = ("AM", tuple(am.alloc(f"{b.name}[{i}]", size) for i in range(n)), in_stage)

    def _pad_value(self, st) -> float | None:
        """The constant an AM-tile copy nest stores outside its input (pad), else None."""
        _, _, store = self._nest(st)
        sel = _select(store.value)
        if sel is None or _is_load(sel[2]):
            return None
        c = _Select.const(sel[2])
        if c is None:
            raise OpcFailure("tir lowering: a dma nest's padding must be a constant")
        return c

    # ---- copies ---------------------------------------------------------------------------
    def _walk(self, st, E: dict, stage: list | None = None) -> None:
        if type(st).__name__ == "For" and "opc.dsp.stage" in st.annotations:
            self._stage_loop = st
        return super()._walk(st, E, stage)

    def _columns(self, st) -> list[tuple[int, int]]:
        """Runs of tile columns that are padding on every row holding input, over every iteration
        of the stage loop (the side columns the copies never write)."""
        k = ("cols", _key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            sl = self._stage_loop
            const = [sl] + loops if sl is not None else loops
            if any(type(lp.extent).__name__ != "IntImm" or type(lp.min).__name__ != "IntImm" for lp in const):
                self._cache[k] = []
                return []
            ext = [(lp.loop_var, int(lp.extent)) for lp in const]
            shape = tuple(e for _, e in ext)
            g = _grid(ext, {})
            for lp in const:
                g[_key(lp.loop_var)] = g[_key(lp.loop_var)] + int(lp.min)
            cm = _full(self.comp.fn(_select(store.value)[0])(g, None), shape).astype(bool)
            if pred is not None and not (type(pred).__name__ == "IntImm" and int(pred.value)):
                cm = cm & _full(self.comp.fn(pred)(g, None), shape).astype(bool)
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
        key = ("pad", ("tile", _key(st)), slot)
        if key in self.zeroed:
            return
        runs = self._columns(st)
        if not runs:
            return
        self.zeroed[key] = np.ones(1, bool)
        loops, _, store = self._nest(st)
        if len(loops) != 3:
            raise OpcFailure("tir lowering: padding of a stage tile: (planes, rows, columns) copies only")
        bdst = _bkey(store)
        base = self._base(bdst, slot)[1]
        at = {**E, **{_key(lp.loop_var): 0 for lp in loops}}
        corner = base + int(self.comp.flat_fn(bdst, store.indices)(at, None))
        strides = self._strides(bdst)
        L, value = self.m.lanes, self._pad_value(st)
        np_, nr = (self._ev(lp.extent, E) for lp in loops[:2])
        for a, b in runs:
            kern = vx.VKernel(tuple(vx.fill_nests(value, corner + a, (np_, nr, b - a), (strides[-3], strides[-2]), L)),
                              "padding fill")
            cost = vx.kernel_cost(self.m, kern)
            fn = (lambda mem, kk=kern: vx.execute(mem, kk, L)) if self.fn else None
            op = Op("vpu", "vpu", cycles=cost.cycles, reads=(), writes=(f"pad{slot}",), cost=cost,
                    nruns=len(kern.nests), fn=fn, label="padding fill")
            self._emit(self._intern(op), stage, 0)

    def _dma(self, st, E: dict, stage: list | None, part: tuple[int, int] | None = None) -> None:
        k = ("move", _key(st))
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
                pf = None if pred is None or (type(pred).__name__ == "IntImm" and int(pred.value)) else c.fn(pred)
                self._cache[k] = (loops, pf, c.flat_fn(_bkey(store), store.indices), _bkey(store),
                                  c.flat_fn(_bkey(load), load.indices), _bkey(load))
        info = self._cache[k]
        if info is None:
            if stage is None:
                raise OpcFailure("tir lowering: a padded copy must be inside a stage")
            self._side_fill(st, E, stage)
            return self._dma_tile(st, E, stage, {})
        loops, fpred, fdst, bdst, fsrc, bsrc = info
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in loops]
        shape = tuple(e for _, e in ext)
        g = _grid(ext, E)
        valid = _full(fpred(g, None), shape).astype(bool) if fpred is not None else np.ones(shape, bool)
        slot = E.get("slot", 0)
        dspace, dbase = self._base(bdst, slot)
        dtag = self._tag(bdst, slot)
        boxes = _boxes(valid)
        if len(boxes) > 1:
            raise OpcFailure(f"tir lowering: the copied region of {self.names[bsrc]} -> {self.names[bdst]} "
                             "is not one box")
        sspace, sbase = self._base(bsrc, slot)
        stag = self._tag(bsrc, slot)
        reads = tuple(t for t in (stag, f"pad{slot}" if self._padded and sspace[0] == "AM" else "") if t)
        for b in boxes:
            sv = self._view(k, sspace, sbase, fsrc, E, ext, b)
            dv = self._view(k, dspace, dbase, fdst, E, ext, b)
            if self.tamper is not None:
                dv = self.tamper(f"{self.names[bsrc]}->{self.names[bdst]}", dv)
            op = dma_op(self.m, sv, dv, reads, (dtag,), self.fn, f"{sspace[0]}->{dspace[0]} {self.names[bsrc]}")
            # a stage's DMA-in: into its AM tile, or the one DDR -> DDR descriptor
            self._emit(self._intern(op), stage, 2 if sspace[0] == "AM" else 0)


__all__ = ["DMA", "MoveLowerer"]
