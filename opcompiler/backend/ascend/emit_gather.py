"""Lower a scheduled gather (embedding lookup) to the AI Core program: a data-movement kernel.

The module comes from `schedules/ascend/gather.py`: the index loop split into tiles (the tile
loop carries `opc.ascend.block_dim` and `opc.ascend.double_buffer`), under it three nests:

    indices -> indices_local.UB   dma_copy     the tile's indices GM -> UB (MTE2, one DMA)
    gather (table[idx_UB[i], j])  dma_gather   per index one indirect DMA (`IndirectMove`): the
                                               row (or a chunk of it) GM -> the row tile in UB
                                               (MTE2), its address from the index the kernel
                                               read out of UB at execute time
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

from typing import Any, Mapping

import numpy as np

from opcompiler.errors import OpcFailure

from .builder import KernelBuilder, Program, split_even, ceil_div
from .intrin import CORES, PRAGMA, SLOTS
from .machine import Machine

GATHER = "dma_gather"  # the pragma of the indirect-DMA nest


def _walk(mod) -> dict[str, Any]:
    """The facts the kernel is built from, read off the module (see the module docstring)."""
    from tvm import tirx as T

    f = mod["main"]
    params = list(f.params)  # the tensors themselves (TVM 0.27: buffer parameters)
    if len(params) != 3:
        raise OpcFailure(f"emit_gather: a gather module has table, indices, out; not {len(params)} tensors")
    gm = [(b.name, tuple(int(s) for s in b.shape), str(b.dtype)) for b in params]
    found: dict[str, Any] = {"gm": gm, "nests": []}

    def visit(s):
        if isinstance(s, T.For):
            if CORES in s.annotations:
                found["tiles"] = int(s.extent)
                found["cores"] = int(s.annotations[CORES])
                found["slots"] = 2 if int(s.annotations.get(SLOTS, 0)) else 1
            pr = s.annotations.get(PRAGMA)
            if pr is not None:
                found["nests"].append(str(pr))
                if str(pr) == GATHER:
                    found["rows_tile"] = int(s.extent)
                return
            visit(s.body)
        elif isinstance(s, T.SeqStmt):
            for x in s.seq:
                visit(x)
        elif hasattr(s, "body"):
            visit(s.body)
        elif hasattr(s, "block"):
            visit(s.block)

    visit(f.body)
    if "tiles" not in found or found.get("nests") != ["dma_copy", GATHER, "dma_copy"]:
        raise OpcFailure(f"emit_gather: expected a tile loop with index copy-in, {GATHER} and copy-out nests; "
                         f"found {found.get('nests')}")
    return found


class GatherKernel:
    """Each core's program of one scheduled gather (see the module docstring)."""

    def __init__(self, mod, col_chunk: int):
        w = _walk(mod)
        (self.tname, (self.rows, self.cols), self.dtype), (self.iname, (self.n,), self.idt), \
            (self.oname, _, _) = w["gm"]
        self.tiles, self.rt, self.slots = w["tiles"], w["rows_tile"], w["slots"]
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
        idx = kb.gm(self.iname, (self.n,), self.idt)
        out = kb.gm(self.oname, (self.n, self.cols), self.dtype)
        ib = [kb.alloc("UB", f"idx_{s}", (ipad,), self.idt) for s in range(self.slots)]
        rb = [kb.alloc("UB", f"rows_{s}", (self.rt, cpad), self.dtype) for s in range(self.slots)]
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
                kb.data_move(out, (slice(i0, i0 + cnt), slice(c0, c0 + wd)), rb[s], (slice(0, cnt), slice(0, wd)))
        return kb.finish(gm_inputs=(self.tname, self.iname), lowering="emit_gather (indirect row DMAs)")


def lower(mod, params: Mapping[str, Any]) -> GatherKernel:
    return GatherKernel(mod, int(params.get("col_chunk", 0)))


__all__ = ["GATHER", "GatherKernel", "lower"]
