"""Embedding lookup (gather) on the AI Core: a data-movement kernel (and a bag's vector adds).

    [offsets GM -> UB                             MTE2, one DMA per core (only with `fields`)]
    [table GM -> L1                               MTE2, once per core (only with `table_l1`: rows
                                                  padded to 32 B; each row below then moves
                                                  L1 -> UB on MTE1, 20 cycles of latency, not 200)]
    FOR tile of `rows_tile` indices (the tiles split over `block_dim` cores, double-buffered):
        indices GM -> UB                          MTE2, one DMA
        FOR each index r of the tile:             the scalar unit reads idx_UB[r] (+ off_UB[i % F]) ...
            table[that row, :] GM -> rows_UB[r]   ... and issues an indirect DMA (MTE2) of that row
        rows_UB[:cnt] -> out GM                   MTE3, one DMA

The indirect DMA's source row comes from the index the kernel read from simulated UB
(`program.IndirectMove`), so a functional run fetches the rows the indices name, and an index
outside the table is a one-line error naming it and the table size. Its cost is a DMA of that
row's bytes (timing mode needs no values). `table_l1` is offered when the padded table fits L1,
and preferred when loading it (its bytes at one core's share of the off-chip bandwidth) costs less
than the GM latency its rows save (a DeepFM table of 26,000 x 16 fp16 looked up 53,248 times:
338,761 -> 44,394 cycles). Otherwise the table never enters the chip whole; the machine has no
GM -> GM path, so rows stage through UB. A row longer than a UB slot (fp16 rows above ~64K
elements) moves in column chunks, one tile per index.

`apply` returns the TVM schedule of the op's own compute (the index loop split by rows_tile,
the indices cache_read into UB, the gather block cache_written into a UB row tile, pragmas
`dma_copy` / `dma_gather`) for the backend's "gather" lowering (`lower.gather`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.intrin import DMA_COPY, L1, PRAGMA, UB_SCOPE
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.catalogue.gather import bag, fields
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, machine, on_cores, spread_first, tile_knobs

ROWS_TILES = (1, 2, 4, 8, 16, 32, 64, 128)
GATHER = "dma_gather"  # the backend's `lower.gather.GATHER`
BAG_SUM = "vec_bag_sum"  # the backend's `lower.gather.BAG_SUM`: a bag's rows added on the vector unit


def _tiled(wl: Workload, rows_tile: int, table_l1: bool = False):
    from tvm.s_tir import Schedule

    sch = Schedule(op_prim_func(wl))
    blk = sch.get_sblock("gather")
    if table_l1:  # the whole table GM -> L1 once per core, before the tile loop; rows then read from L1
        tb = sch.cache_read(blk, 0, L1)
        sch.annotate(sch.get_loops(tb)[0], PRAGMA, DMA_COPY)
    b = bag(wl)
    if b > 1:  # the tile's bags: their rows gathered into UB, summed in UB (`bag_sum`), the sums out
        bs = sch.get_sblock("bag_sum")
        to, _ = sch.split(sch.get_loops(bs)[0], [None, rows_tile // b])
        rb = sch.cache_write(bs, 0, UB_SCOPE)
        sch.reverse_compute_at(rb, to, preserve_unit_loops=True)
        sch.compute_at(blk, to, preserve_unit_loops=True)
        sch.set_scope(blk, 0, UB_SCOPE)
        sch.annotate(sch.get_loops(bs)[1], PRAGMA, BAG_SUM)
    else:
        i, _ = sch.get_loops(blk)
        to, _ = sch.split(i, [None, rows_tile])
        rb = sch.cache_write(blk, 0, UB_SCOPE)
        sch.reverse_compute_at(rb, to, preserve_unit_loops=True)
    ib = sch.cache_read(blk, 1, UB_SCOPE)  # reads: table[indices[i] (+ offsets[i % F]), j], indices[i], ...
    sch.compute_at(ib, to, preserve_unit_loops=True)
    sch.annotate(sch.get_loops(ib)[1], PRAGMA, DMA_COPY)
    if fields(wl):  # the per-field offsets: GM -> UB once per core, before the tile loop
        ob = sch.cache_read(blk, 2, UB_SCOPE)
        sch.annotate(sch.get_loops(ob)[0], PRAGMA, DMA_COPY)
    sch.annotate(sch.get_loops(blk)[1], PRAGMA, GATHER)
    sch.annotate(sch.get_loops(rb)[1], PRAGMA, DMA_COPY)
    return sch.mod


def table_l1_bytes(wl: Workload) -> int:
    """The table's bytes in L1, each row padded to 32 B (the DMA's on-chip alignment)."""
    epb = 32 // np.dtype(wl.dtype).itemsize
    return wl["rows"] * ceil_div(wl["cols"], epb) * epb * np.dtype(wl.dtype).itemsize


@register_template
class AscendGather(AscendTemplate):
    """Rows of a GM table by runtime indices: indirect row DMAs through UB row tiles."""

    name = "ascend.gather"
    op_families = ("gather",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        b = bag(wl)  # a tile holds whole bags
        rows = tuple(v * b for v in ROWS_TILES if v * b < 2 * wl["n"]) or (b,)
        resident = (1, 0) if table_l1_bytes(wl) <= machine(target).level("L1").capacity else (0,)
        return tile_knobs(target, Knob("rows_tile", rows, "indices (rows) per UB tile" +
                                       (f" (whole bags of {b})" if b > 1 else "")), "ping-pong index and row tiles") + [
            Knob("table_l1", resident, "1: the whole table GM -> L1 once per core (rows padded to 32 B), each row then "
                                       "L1 -> UB (MTE1) instead of GM -> UB: offered when the table fits L1")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Fewest rows per core first (the tiles spread over every core), then larger tiles."""
        # bags: the sums (V) of one tile run under the next tile's row DMAs (MTE2): 4 tiles a core or more
        order = spread_first(self.space(wl, target)[0].values, wl["n"], target.cores, 4 if bag(wl) > 1 else 1)
        resident = self.space(wl, target)[-1].values
        if len(resident) > 1 and not self._resident_pays(wl, target):
            resident = (0, 1)
        return [{"rows_tile": t, "double_buffer": 1, "block_dim": target.cores, "table_l1": r}
                for r in resident for t in order]

    def _resident_pays(self, wl: Workload, target: Target) -> bool:
        """Whether loading the table into every core's L1 (its bytes at the core's share of the
        off-chip bandwidth, once) costs less than the latency its rows save (GM -> UB against
        L1 -> UB, per row a core looks up), by the target file's figures."""
        m = machine(target)
        cores = target.cores
        share = min(m.path("GM", "L1").bytes_per_cycle, m.offchip_gbps / m.clock_ghz / cores)
        load = m.path("GM", "L1").latency_cycles + table_l1_bytes(wl) / share
        if wl["cols"] * np.dtype(wl.dtype).itemsize % 32:  # rows padded in L1: a burst each
            load += wl["rows"] * m.path("GM", "L1").burst_cycles
        saved = ceil_div(wl["n"], cores) * (m.path("GM", "UB").latency_cycles - m.path("L1", "UB").latency_cycles)
        return load < saved

    def col_chunk(self, wl: Workload, target: Target, cfg: Mapping) -> int:
        """Columns per indirect DMA: the whole row, or (one index per tile) as much of it as a
        UB slot holds when a row does not fit."""
        isz = np.dtype(wl.dtype).itemsize
        epb = 32 // isz
        slots = 2 if cfg["double_buffer"] else 1
        room = machine(target).level("UB").capacity // slots - 64
        if cfg["rows_tile"] > 1 or ceil_div(wl["cols"], epb) * epb * isz <= room or bag(wl) > 1 or cfg.get("table_l1"):
            return wl["cols"]
        return max(epb, room // isz // epb * epb)

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        epb = 32 // isz
        rt = cfg["rows_tile"]
        cpad = ceil_div(self.col_chunk(wl, target, cfg), epb) * epb
        iisz = np.dtype(str(wl["idx"])).itemsize
        out = []
        for s in range(2 if cfg["double_buffer"] else 1):
            out.append(("UB", f"idx_{s}", ceil_div(rt * iisz, 32) * 32))
            out.append(("UB", f"rows_{s}", rt * cpad * isz))
            if bag(wl) > 1:
                out.append(("UB", f"sums_{s}", rt // bag(wl) * cpad * isz))
        if fields(wl):
            out.append(("UB", "offsets", ceil_div(fields(wl) * iisz, 32) * 32))
        if cfg.get("table_l1"):
            out.append(("L1", "table_L1", table_l1_bytes(wl)))
        return out

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        return {"gm_read_bytes": wl["n"] * wl["cols"] * np.dtype(wl.dtype).itemsize,
                **self.tile_features(wl, target, cfg, wl["n"])}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        idt = str(wl["idx"])
        pack = lambda ins: {"table": np.ascontiguousarray(ins[0], dtype=wl.dtype),  # noqa: E731
                            "indices": np.ascontiguousarray(np.asarray(ins[1]).reshape(-1), dtype=idt),
                            **({"offsets": np.ascontiguousarray(np.asarray(ins[2]).reshape(-1), dtype=idt)}
                               if fields(wl) else {})}
        return Scheduled(lowering="gather", key=(wl.key_str(), tuple(sorted(cfg.items()))),
                         module=lambda: (on_cores(_tiled(wl, int(cfg["rows_tile"]), bool(cfg.get("table_l1"))),
                                                  "indices_local.UB", cfg), ()),
                         params={"col_chunk": self.col_chunk(wl, target, cfg), "table_l1": bool(cfg.get("table_l1"))},
                         host=HostLayout(pack=pack, out_dtype=wl.dtype),
                         buffers=self.buffers(wl, target, cfg), flops=float(get_op(wl.op).flops(wl)),
                         info={"gm_layouts": {"table": "ND (rows, cols)", "indices": f"({wl['n']},) {idt}",
                                              **({"offsets": f"({fields(wl)},) {idt}"} if fields(wl) else {})},
                               "layout_change": "none"})
