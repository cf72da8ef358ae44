"""The dsp-sim lowering of a gather (embedding lookup): DMA only.

The module is the op's TE compute (`table[indices[i], j]`) with the index loop split into tiles
of `tile` indices (`schedules/dsp/gather.py`); the GM tensors (names, shapes) are read from the
lowered function's parameters. Each core takes a contiguous share of the tiles. Per tile:

    indices DDR -> SM                one DMA (the tile's indices into scalar memory)
    per index r: the core's scalar unit reads idx_SM[r] and issues one DMA of that row:
      path=ddr   table row DDR -> out row DDR            (a DDR -> DDR descriptor)
      path=am    table row DDR -> the AM row tile        (then the tile AM -> DDR in one DMA;
                                                          two AM tiles with dbuf)

With an offsets tensor (the op's `fields` > 0: row indices[i] + offsets[i % F]) the offsets go
DDR -> SM once per core, and each row DMA's source is its index plus its field's offset.

The row DMA's source is taken at execute time from the index the core read from simulated SM;
an index outside the table is a one-line OpcFailure naming it and the table size (nothing is
read). Its cost is the DMA of one row (sizes never depend on values), so timing mode needs no
values. dsp-sim's memories hold fp32: the indices travel as fp32 values (exact below 2^24 rows,
which the template enforces)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.errors import OpcFailure

from ..machine import DspMachine
from ..program import Allocator, Op, View, contiguous, dma_op, runs


class GatherLowerer:
    """Each core's ops of one scheduled gather (see the module docstring)."""

    def __init__(self, m: DspMachine, func, p: Mapping[str, Any], ddr_names: Mapping[str, str], functional: bool):
        shapes = {ddr_names.get(q.name, q.name): tuple(int(s) for s in q.shape) for q in func.params}
        names = [ddr_names.get(q.name, q.name) for q in func.params]
        if len(names) not in (3, 4):
            raise OpcFailure(f"lower.gather: a gather function has table, indices, [offsets,] out; not {names}")
        self.table, self.idx, self.out = names[0], names[1], names[-1]
        self.off = names[2] if len(names) == 4 else None
        self.fields = shapes[self.off][0] if self.off else 0
        self.rows, self.cols = shapes[self.table]
        (self.n,) = shapes[self.idx]
        self.m, self.fn = m, functional
        self.tile, self.am, self.dbuf = int(p["tile"]), p["path"] == "am", bool(p["dbuf"])
        self.tiles = -(-self.n // self.tile)
        self.cores = max(1, min(int(p["cores"]), self.tiles))

    def share(self, c: int) -> range:
        return range(c * self.tiles // self.cores, (c + 1) * self.tiles // self.cores) if c < self.cores else range(0)

    def group_key(self, c: int) -> tuple:
        """Every core timed on its own (its key names it): a core's ops are few (a DMA per index),
        and the cores' many short row DMAs interleave on the shared DDR channel, which timing
        equal cores as one group (x8) mis-times (by about 12 % of the DSP cycles at n=128)."""
        return (c, *(min(self.tile, self.n - t * self.tile) for t in self.share(c)))

    def _row(self, src_view: View, dst: View, idx: View, r: int, reads: tuple, writes: tuple,
             off: tuple[View, int] | None = None) -> Op:
        """One row's DMA, its source row read from idx[r] (+ the offsets view at its position) at
        execute time (`src_view` is row 0's)."""
        op = dma_op(self.m, src_view, dst, reads, writes, False, label="gather row")
        if self.fn:
            rows, cols = self.rows, self.cols

            def fn(mem: Any, src=src_view, dst=dst, idx=idx, r=r, off=off) -> None:
                v = float(mem.view(idx)[r]) + (float(mem.view(off[0])[off[1]]) if off else 0.0)
                k = int(v)
                if k != v or not 0 <= k < rows:
                    raise OpcFailure(f"gather: index {v:g} is out of range for a table of {rows} rows "
                                     f"(valid: 0..{rows - 1})")
                mem.view(dst)[...] = mem.view(View(src.space, src.offset + k * cols, src.shape, src.strides))
            op.fn = fn
        return op

    def core_ops(self, c: int) -> list[Op]:
        m = self.m
        sm, am = Allocator("SM", m.cap("SM")), Allocator("AM", m.cap("AM"), 128)
        slots = 2 if self.dbuf else 1
        ib = [sm.alloc(f"idx_{s}", self.tile) for s in range(slots)]
        rb = [am.alloc(f"rows_{s}", self.tile * self.cols) for s in range(slots)] if self.am else []
        row0 = contiguous(("DDR", self.table), 0, (self.cols,))
        ops: list[Op] = []
        ovw = None
        if self.off and self.share(c):  # the per-field offsets DDR -> SM, once per core
            ovw = contiguous(("SM",), sm.alloc("offsets", self.fields), (self.fields,))
            ops.append(dma_op(m, contiguous(("DDR", self.off), 0, (self.fields,)), ovw, (), ("sm:offsets",), self.fn,
                              label="offsets"))
        for k, t in enumerate(self.share(c)):
            s = k % slots
            i0 = t * self.tile
            cnt = min(self.tile, self.n - i0)
            itag = f"sm:idx_{s}"
            ivw = contiguous(("SM",), ib[s], (cnt,))
            ops.append(dma_op(m, contiguous(("DDR", self.idx), i0, (cnt,)), ivw, (), (itag,), self.fn,
                              label=f"indices {i0}..{i0 + cnt - 1}"))
            for r in range(cnt):
                off = (ovw, (i0 + r) % self.fields) if ovw is not None else None
                reads = (itag, "sm:offsets") if off else (itag,)
                if self.am:
                    dst = contiguous(("AM",), rb[s] + r * self.cols, (self.cols,))
                    ops.append(self._row(row0, dst, ivw, r, reads, (f"am:rows_{s}",), off))
                else:
                    dst = contiguous(("DDR", self.out), (i0 + r) * self.cols, (self.cols,))
                    ops.append(self._row(row0, dst, ivw, r, reads, (), off))
            if self.am:
                ops.append(dma_op(m, contiguous(("AM",), rb[s], (cnt, self.cols)),
                                  contiguous(("DDR", self.out), i0 * self.cols, (cnt, self.cols)),
                                  (f"am:rows_{s}",), (), self.fn, label="rows out"))
        return ops


def make(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    """The `lower.LOWERINGS` entry: (lowerer, core ops, group key, replication, host prepares)."""
    low = GatherLowerer(m, func, p, names, fn)
    return low, low.core_ops, low.group_key, [], []


__all__ = ["GatherLowerer", "make", "runs"]
