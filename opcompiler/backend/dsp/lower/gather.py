"""The dsp-sim lowering of a gather (embedding lookup): DMA only, or with `bag` > 1 DMA and the bag sums on the VPU.

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
which the template enforces).

With `bag` > 1 (EmbeddingBag's sum) the module is the op's two-stage compute scheduled per tile
of whole bags: under the tile loop the gather nest (`tile` rows into an AM row tile), the bag-sum
nest marked `opc.dsp.op = vec` (its extent: the tile's bags) into an AM sums tile, and the sums'
write-back marked `opc.dsp.op = dma`. Read from the module: the tile loop's extent, the rows and
bags per tile (so `bag`), the bag-sum nest's trip count (cols x bag) and the two AM tiles. Per tile:

    indices DDR -> SM; per index one row DMA DDR -> the AM row tile (as path=am above)
    one VPU pass, per bag q and vector v of the row (32 lanes; the row's last vector predicated):
        vld acc <- rows[q*bag][v];  for r in 1..bag-1: vld row <- rows[q*bag + r][v]; vadd acc <- acc + row
        vst sums[q][v] <- acc                       (in order: rows[q*b] + rows[q*b+1], then += rows[q*b+r])
    the sums tile AM -> DDR                          one DMA of the tile's bags (n / bag rows in all)

Two row and sums tiles with `dbuf`: the next tile's indices and rows are fetched before this
tile's VPU pass (`program.stage_order`). The pass's cycles are the timing model's
(`timing.kernel_cost` of its instructions); functionally it executes them (`execute.execute_pass`),
where the functional clock (`fclock`) times them."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.errors import OpcFailure

from ..intrin import DMA, SCOPE_AM, VEC
from ..machine import DspMachine
from ..program import VI, Allocator, Mem, Nest, Op, View, VKernel, contiguous, dma_op, runs, stage_order
from .tiled import tile_share, vpu_op, walk_tiled


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
        self.bag = self._bag(func, shapes[self.out][0])

    def _bag(self, func, out_rows: int) -> int:
        """Rows summed per output row: 1 for a plain lookup; else read off the module's bag-sum
        nest (see the module docstring), each fact checked against the others."""
        w = walk_tiled(func)
        kinds = [k for k, _, _ in w["nests"]]
        if VEC not in kinds and out_rows == self.n:
            return 1
        if kinds != [None, VEC, DMA] or w["tiles"] is None:
            raise OpcFailure(f"lower.gather: a bag sum's module has a tile loop over a gather nest, a {VEC!r} "
                             f"bag-sum nest and a {DMA!r} write-back; found nests {kinds}")
        (_, rows_tile, rt_trip), (_, bags_tile, bs_trip) = w["nests"][:2]
        b = rows_tile // max(bags_tile, 1)
        if bags_tile < 1 or b < 2 or rows_tile % bags_tile or rows_tile != min(self.tile, self.n) \
                or out_rows * b != self.n or w["tiles"] != self.tiles \
                or rt_trip != self.cols or bs_trip != self.cols * b:
            raise OpcFailure(f"lower.gather: tiles of {rows_tile} rows and {bags_tile} bags ({w['tiles']} tiles, tile "
                             f"{self.tile}) are not whole bags of {self.n} rows into {out_rows}")
        tiles_am = sorted(shape for scope, shape in w["bufs"].values() if scope == SCOPE_AM)
        if tiles_am != sorted([(bags_tile, self.cols), (rows_tile, self.cols)]):
            raise OpcFailure(f"lower.gather: a bag sum keeps its row and sums tiles in AM; found {w['bufs']}")
        if not self.am:
            raise OpcFailure(f"lower.gather: bag={b} sums rows staged in AM (path=am), not path=ddr")
        return b

    def share(self, c: int) -> range:
        return tile_share(c, self.tiles, self.cores)

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

    def _bag_kernel(self, rows: int, sums: int, nb: int) -> VKernel:
        """The VPU pass summing `nb` bags of the AM row tile at `rows` into the sums tile at `sums`
        (see the module docstring): one nest over (bags, whole vectors of a row), one over the bags
        for the row's last, partial vector (its store predicated to the row's remaining lanes);
        each nest's inner loop runs over a bag's rows after its first."""
        L, b, cols = self.m.lanes, self.bag, self.cols
        full, tail = divmod(cols, L)

        def nest(outer: tuple, col: int, lanes: int | None) -> Nest:
            vec = (L,) if len(outer) == 2 else ()  # the vector loop's step along the row
            first = Mem("AM", rows + col, (b * cols,) + vec + (0,))
            nxt = Mem("AM", rows + cols + col, (b * cols,) + vec + (cols,))
            out = Mem("AM", sums + col, (cols,) + vec + (0,))
            return Nest(outer=outer, inner=(b - 1,), pre=(VI("vld", "acc", (first,)),),
                        body=(VI("vld", "row", (nxt,)), VI("vadd", "acc", ("acc", "row"))),
                        post=(VI("vst", out, ("acc",), lanes=lanes),))
        nests = ([nest((nb, full), 0, None)] if full else []) + ([nest((nb,), full * L, tail)] if tail else [])
        return VKernel(tuple(nests), f"bag sums ({nb} bags of {b} rows)")

    def _bag_op(self, kern: VKernel, s: int, label: str) -> Op:
        return vpu_op(self.m, kern, (f"am:rows_{s}",), (f"am:sums_{s}",), self.fn, label)

    def core_ops(self, c: int) -> list[Op]:
        m = self.m
        sm, am = Allocator("SM", m.cap("SM")), Allocator("AM", m.cap("AM"), 128)
        slots = 2 if self.dbuf else 1
        ib = [sm.alloc(f"idx_{s}", self.tile) for s in range(slots)]
        rb = [am.alloc(f"rows_{s}", self.tile * self.cols) for s in range(slots)] if self.am else []
        b = self.bag
        sb = [am.alloc(f"sums_{s}", self.tile // b * self.cols) for s in range(slots)] if b > 1 else []
        stages: list[tuple[list, list, list]] = []  # bag > 1: per tile (fetches, the VPU pass, the sums out)
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
            idma = dma_op(m, contiguous(("DDR", self.idx), i0, (cnt,)), ivw, (), (itag,), self.fn,
                          label=f"indices {i0}..{i0 + cnt - 1}")
            if b > 1:
                fetch = [idma]
                for r in range(cnt):
                    off = (ovw, (i0 + r) % self.fields) if ovw is not None else None
                    dst = contiguous(("AM",), rb[s] + r * self.cols, (self.cols,))
                    fetch.append(self._row(row0, dst, ivw, r, (itag, "sm:offsets") if off else (itag,),
                                           (f"am:rows_{s}",), off))
                nb, q0 = cnt // b, i0 // b
                vpu = self._bag_op(self._bag_kernel(rb[s], sb[s], nb), s, f"bag sums {q0}..{q0 + nb - 1}")
                out = dma_op(m, contiguous(("AM",), sb[s], (nb, self.cols)),
                             contiguous(("DDR", self.out), q0 * self.cols, (nb, self.cols)), (f"am:sums_{s}",), (),
                             self.fn, label="sums out")
                stages.append((fetch, [vpu], [out]))
                continue
            ops.append(idma)
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
        # bag > 1: with two slots the next tile's fetches are issued before this tile's VPU pass (a flat
        # list, as functional mode has it, in both modes: each core is timed on its own, nothing repeats)
        return ops + stage_order(stages, self.dbuf, functional=True) if stages else ops


def make(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    """The `lower.LOWERINGS` entry: (lowerer, core ops, group key, replication, host prepares)."""
    low = GatherLowerer(m, func, p, names, fn)
    return low, low.core_ops, low.group_key, [], []


__all__ = ["GatherLowerer", "make", "runs"]
