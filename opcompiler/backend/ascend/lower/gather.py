"""Lower a scheduled gather (embedding lookup) to the AI Core program: a data-movement kernel.

The module comes from `schedules/ascend/gather.py`: the index loop split into tiles (the tile
loop carries `opc.ascend.block_dim` and `opc.ascend.double_buffer`), under it three nests:

    indices -> indices_local.UB   dma_copy     the tile's indices GM -> UB (MTE2, one DMA)
    gather (table[idx_UB[i], j])  dma_gather   per index one indirect DMA (`IndirectMove`): the
                                               row (or a chunk of it) GM -> the row tile in UB
                                               (MTE2), its address from the index the kernel
                                               read out of UB at execute time

With a fourth tensor (`fields` > 0: per-field offsets, `table[indices[i] + offsets[i % F], j]`)
an offsets copy-in nest precedes the tile loop: offsets GM -> UB once per core, and each row's
DMA address is the index plus its field's offset (`OffsetIndirectMove`: the scalar unit reads
both and adds them, one scalar op).
    gather_local.UB -> gather     dma_copy     the row tile UB -> GM (MTE3, one DMA)

Read from the module: the GM tensors (names, shapes, dtypes: the function's parameters), the tile
loop (its extent, cores and buffering), the rows per tile (the dma_gather loop's extent) and the
nests' order. `col_chunk` (from the template's params) cuts a row too long for the UB tile into
chunks, each its own indirect DMA and copy out. The tiles are split over the cores in contiguous
shares; with double buffering tile k uses slot k % 2, so the next tile's fetches (MTE2) overlap
this tile's copy out (MTE3). UB rows are padded to 32 B (the DMA's UB alignment): a row tile whose
rows are not whole blocks leaves in one strided DMA (a burst per row).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from opcompiler.errors import OpcFailure

from .builder import KernelBuilder, ceil_div, group_sums, split_even, walk_tiled
from ..program import Buf, IndirectMove, Memory, Program, Scalar
from ..machine import Machine

GATHER = "dma_gather"  # the pragma of the indirect-DMA nest
BAG_SUM = "vec_bag_sum"  # the pragma of the bag sum's nest (the tile's rows added per bag in UB)


def _walk(mod, table_l1: bool = False) -> dict[str, Any]:
    """The facts the kernel is built from, read off the module (see the module docstring)."""
    found = walk_tiled(mod)
    nparams = len(found["gm"])
    if nparams not in (3, 4):
        raise OpcFailure(f"emit_gather: a gather module has table, indices, [offsets,] out; not {nparams} tensors")
    for pr, extent in found["nests"]:
        if pr == GATHER:
            found["rows_tile"] = extent
        elif pr == BAG_SUM:
            found["bags_tile"] = extent
    nests = [pr for pr, _ in found["nests"]]
    want = ["dma_copy"] * ((nparams == 4) + table_l1) + ["dma_copy", GATHER] + [BAG_SUM] * ("bags_tile" in found) + ["dma_copy"]
    if "tiles" not in found or nests != want:
        raise OpcFailure(f"emit_gather: expected {'an offsets copy-in, ' if nparams == 4 else ''}a tile loop "
                         f"with index copy-in, {GATHER} and copy-out nests; found {nests}")
    return found


@dataclass(eq=False)
class OffsetIndirectMove(IndirectMove):
    """An indirect row DMA whose row is `index[index_pos] + offset[offset_pos]`: the scalar unit
    reads both from UB and adds them into the DMA's source address (a folded per-field id offset).
    Same bytes, bursts and cost as `IndirectMove`; the bounds check is on the sum."""

    offset: Buf | None = None
    offset_pos: int = 0

    def row(self, mem: Memory) -> int:
        return super().row(mem) + int(mem.load(self.offset).reshape(-1)[self.offset_pos])


class GatherKernel:
    """Each core's program of one scheduled gather (see the module docstring)."""

    def __init__(self, mod, col_chunk: int, table_l1: bool = False):
        w = _walk(mod, table_l1)
        self.table_l1 = table_l1
        (self.tname, (self.rows, self.cols), self.dtype), (self.iname, (self.n,), self.idt) = w["gm"][:2]
        self.oname = w["gm"][-1][0]
        self.offname, self.fields = (w["gm"][2][0], w["gm"][2][1][0]) if len(w["gm"]) == 4 else (None, 0)
        self.tiles, self.rt, self.slots = w["tiles"], w["rows_tile"], w["slots"]
        self.bag = 1  # rows summed per output row
        if "bags_tile" in w:  # a tile of whole bags (the rows nest is clipped to n when one tile holds them all)
            nout = w["gm"][-1][1][0]
            self.bag = self.n // nout
            if self.bag * nout != self.n:
                raise OpcFailure(f"emit_gather: {self.n} indices do not make {nout} whole bags")
            self.rt = w["bags_tile"] * self.bag
        if ceil_div(self.n, self.rt) != self.tiles:
            raise OpcFailure(f"emit_gather: {self.tiles} tiles of {self.rt} indices do not cover {self.n}")
        self.chunk = min(int(col_chunk) or self.cols, self.cols)
        self.active_cores = max(1, min(w["cores"], self.tiles))

    def program(self, m: Machine, core: int) -> Program:
        kb = KernelBuilder(m, core, self.active_cores)
        isz = np.dtype(self.dtype).itemsize
        epb = 32 // isz
        cpad = ceil_div(self.chunk, epb) * epb
        ipad = ceil_div(self.rt, 32 // np.dtype(self.idt).itemsize) * (32 // np.dtype(self.idt).itemsize)
        table = kb.gm(self.tname, (self.rows, self.cols), self.dtype)
        if self.table_l1:  # the whole table into L1 once, rows padded to 32 B; rows are then read L1 -> UB
            resident = kb.alloc("L1", "table_L1", (self.rows, ceil_div(self.cols, epb) * epb), self.dtype)
            kb.data_move(resident, (slice(None), slice(0, self.cols)), table, (slice(None), slice(None)))
            table = resident
        idx = kb.gm(self.iname, (self.n,), self.idt)
        b = self.bag
        out = kb.gm(self.oname, (self.n // b, self.cols), self.dtype)
        ib = [kb.alloc("UB", f"idx_{s}", (ipad,), self.idt) for s in range(self.slots)]
        rb = [kb.alloc("UB", f"rows_{s}", (self.rt, cpad), self.dtype) for s in range(self.slots)]
        sb = [kb.alloc("UB", f"sums_{s}", (self.rt // b, cpad), self.dtype) for s in range(self.slots)] if b > 1 else []
        ob = None
        if self.fields:  # the per-field offsets, once per core
            epi = 32 // np.dtype(self.idt).itemsize
            ob = kb.alloc("UB", "offsets", (ceil_div(self.fields, epi) * epi,), self.idt)
            kb.data_move(ob, (slice(0, self.fields),), kb.gm(self.offname, (self.fields,), self.idt),
                         (slice(0, self.fields),))
        t0, t1 = split_even(self.tiles, self.active_cores, core)
        for k, t in enumerate(range(t0, t1)):
            s = k % self.slots
            i0 = t * self.rt
            cnt = min(self.rt, self.n - i0)
            kb.loop()
            kb.data_move(ib[s], (slice(0, cnt),), idx, (slice(i0, i0 + cnt),))
            for c0 in range(0, self.cols, self.chunk):
                wd = min(self.chunk, self.cols - c0)
                for r in range(cnt):
                    kb.indirect_move(rb[s], (slice(r, r + 1), slice(0, wd)), table, (slice(0, 1), slice(c0, c0 + wd)),
                                     ib[s], r)
                    if ob is not None:
                        _add_offset(kb, ob, (i0 + r) % self.fields)
                if b > 1:
                    group_sums(kb, sb[s], rb[s], cnt // b, b, wd, cpad)  # each bag's rows, in order
                    kb.data_move(out, (slice(i0 // b, (i0 + cnt) // b), slice(c0, c0 + wd)), sb[s],
                                 (slice(0, cnt // b), slice(0, wd)))
                else:
                    kb.data_move(out, (slice(i0, i0 + cnt), slice(c0, c0 + wd)), rb[s], (slice(0, cnt), slice(0, wd)))
        gm_in = (self.tname, self.iname) + ((self.offname,) if self.offname else ())
        return kb.finish(gm_inputs=gm_in, lowering="emit_gather (indirect row DMAs" + (", bag sums)" if b > 1 else ")"))


def _add_offset(kb: KernelBuilder, ob: Buf, pos: int) -> None:
    """Turn the indirect move just emitted into one whose row is index + ob[pos]: the scalar unit
    reads the offset too and adds it into the address (one scalar ALU op, `issue_cycles`)."""
    mv = kb.instrs.pop()
    kb._emit(Scalar(n=kb.m.issue_cycles, what="index + offset"), "S", (), ())
    ins = OffsetIndirectMove(dst=mv.dst, dst_idx=mv.dst_idx, src=mv.src, src_idx=mv.src_idx, path=mv.path,
                             nbytes=mv.nbytes, bursts=mv.bursts, index=mv.index, index_pos=mv.index_pos, offset=ob,
                             offset_pos=pos)
    kb._emit(ins, mv.pipe, (*mv.reads, ob), mv.writes)


def lower(mod, params: Mapping[str, Any]) -> GatherKernel:
    return GatherKernel(mod, int(params.get("col_chunk", 0)), bool(params.get("table_l1", False)))


__all__ = ["GATHER", "GatherKernel", "lower"]
