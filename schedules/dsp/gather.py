"""dsp-sim template for gather (embedding lookup): DMA only (with `bag` > 1 also the bag sums on the VPU), fp32.

The indices are cut into tiles of `tile`, the tiles shared over `cores` cores in contiguous
shares. Per tile the indices go DDR -> SM (one DMA); then per index the core reads it from SM and
issues one DMA of that table row (with `fields` > 0 the row is the index plus its field's offset,
the offsets in SM, loaded once per core): `path=ddr` straight to the output row (a DDR -> DDR
descriptor), `path=am` into an AM row tile (two with `dbuf`) that leaves in one DMA. An index
outside the table is a one-line error naming it and the table size.

With `bag` > 1 (EmbeddingBag's sum: each output row the sum of `bag` consecutive looked-up rows)
a tile holds whole bags (`tile` a multiple of `bag`) and the rows always land in the AM row tile
(`path=am` only); the VPU then adds each bag's rows in order into an AM sums tile (two with
`dbuf`), and only the sums leave, in one DMA per tile: n / bag rows written to DDR.

`apply` returns the TVM schedule of the op's compute for the backend's "gather" lowering
(`backend/dsp/lower/gather.py`): the index loop split by `tile`; with `bag` > 1 the bag loop split
by the tile's bags, the looked-up rows computed under it in AM, the sums cached in AM and written
back under it, the bag-sum nest marked `opc.dsp.op = vec` and the write-back `opc.dsp.op = dma`."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import ALIGN, DMA, F32, OP, SCOPE_AM, VEC, machine
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.ops.catalogue.gather import bag, fields
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from . import stream
from .common import refuse_invalid, require_fp32
from .stream import cores_knob

TILES = (8, 16, 32, 64, 128, 256)
MAX_ROWS = 1 << 24  # the indices travel as fp32 values in the simulated memories: exact below this


def _module(wl: Workload, tile: int):
    from tvm.s_tir import Schedule

    sch = Schedule(op_prim_func(wl))
    b = bag(wl)
    if b > 1:  # per tile of tile // b bags: its rows gathered into AM, summed on the VPU into AM, the sums out
        blk, bs = sch.get_sblock("gather"), sch.get_sblock("bag_sum")
        # (a tile past n is one tile of the n rows: TVM would clip the gather nest to them, not the bag loop)
        to, _ = sch.split(sch.get_loops(bs)[0], [None, min(tile, wl["n"]) // b])
        wb = sch.cache_write(bs, 0, SCOPE_AM)
        sch.reverse_compute_at(wb, to, preserve_unit_loops=True)
        sch.compute_at(blk, to, preserve_unit_loops=True)
        sch.set_scope(blk, 0, SCOPE_AM)
        sch.annotate(sch.get_loops(bs)[1], OP, VEC)  # the bag sums: the backend's `lower.gather` VPU pass
        sch.annotate(sch.get_loops(wb)[1], OP, DMA)  # the sums tile AM -> DDR
        return sch.mod
    i, _ = sch.get_loops(sch.get_sblock("gather"))
    sch.split(i, [None, tile])
    return sch.mod


def tiles_of(wl: Workload) -> tuple[int, ...]:
    """The `tile` knob's values: TILES below 2 n; with `bag` > 1 each rounded up to whole bags."""
    b = bag(wl)
    if b == 1:
        return tuple(t for t in TILES if t < 2 * wl["n"]) or (TILES[0],)
    whole = tuple(dict.fromkeys(-(-t // b) * b for t in TILES))
    return tuple(t for t in whole if t < 2 * wl["n"]) or whole[:1]


def _aligned(elems: int) -> int:
    """Bytes of an AM buffer of `elems` fp32 as the lowering allocates it (AM's alignment)."""
    return -(-elems * F32 // ALIGN["AM"]) * ALIGN["AM"]


@register_template
class DspGather(Template):
    """Rows of a DDR table by runtime indices: the index tile in SM, one row DMA per index (bag > 1: each
    bag's rows summed on the VPU in AM, only the sums written)."""

    name = "dsp.gather"
    op_families = ("gather",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        if wl["rows"] > MAX_ROWS:
            raise OpcError(f"{target.name} holds indices as fp32 values: tables up to {MAX_ROWS} rows", arg="rows",
                           value=wl["rows"], expected=f"<= {MAX_ROWS}")
        if bag(wl) > 1:  # the bag sums read the rows in AM: whole bags per tile, staged through AM
            return [Knob("tile", tiles_of(wl), f"indices per tile (whole bags of {bag(wl)})"),
                    Knob("path", ("am",), "rows staged through an AM row tile (the VPU sums its bags)"),
                    Knob("dbuf", (1, 0), "two index, AM row and AM sums tiles"), cores_knob(machine(target))]
        return [Knob("tile", tiles_of(wl), "indices per tile"),
                Knob("path", ("ddr", "am"), "rows DDR -> DDR, or staged through an AM row tile"),
                Knob("dbuf", (1, 0), "two index (and AM row) tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        tiles = [t for t in self.space(wl, target)[0].values]
        if bag(wl) > 1:  # path=am only: among the tiles that fit AM (two of each, else one), as below
            for dbuf in (1, 0):
                fits = [t for t in tiles if self.check(wl, target, {"tile": t, "path": "am", "dbuf": dbuf,
                                                                     "cores": m.cores}) is None]
                if fits:
                    tile = next((t for t in reversed(fits) if -(-wl["n"] // t) >= m.cores), fits[0])
                    return {"tile": tile, "path": "am", "dbuf": dbuf, "cores": m.cores}
            return {"tile": tiles[0], "path": "am", "dbuf": 0, "cores": m.cores}  # refused by check: says why
        # enough tiles for every core, then the largest
        tile = next((t for t in reversed(tiles) if -(-wl["n"] // t) >= m.cores), tiles[0])
        cfg = {"tile": tile, "path": "am", "dbuf": 1, "cores": m.cores}
        return cfg if self.check(wl, target, cfg) is None else {**cfg, "path": "ddr"}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        slots = 1 + int(config["dbuf"])
        sm = (slots * int(config["tile"]) + fields(wl)) * F32  # index tiles (+ the per-field offsets)
        if sm > m.cap("SM"):
            return f"SM needs {sm} B > {m.cap('SM')} B"
        b = bag(wl)
        if b > 1:
            if int(config["tile"]) % b:
                return f"a tile of {config['tile']} indices does not hold whole bags of {b}"
            if config["path"] != "am":
                return f"bag={b} sums the rows on the VPU: they are staged through AM (path=am)"
            # per slot: the row tile and the sums tile, each where the lowering allocates it
            tile = int(config["tile"])
            need = slots * (_aligned(tile * wl["cols"]) + _aligned(tile // b * wl["cols"]))
            if need > m.cap("AM"):
                return f"AM needs {need} B (row and sums tiles) > {m.cap('AM')} B"
            return None
        if config["path"] == "am":
            need = slots * int(config["tile"]) * wl["cols"] * F32
            if need > m.cap("AM"):
                return f"AM needs {need} B > {m.cap('AM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        tiles = -(-wl["n"] // int(config["tile"]))
        rows_out = wl["n"] // bag(wl)  # with bag > 1 only the sums leave
        return {"ddr_bytes": float((wl["n"] + rows_out) * wl["cols"] * F32), "transfers": float(wl["n"] + tiles),
                "work_per_core": tiles / max(1, min(config["cores"], tiles))}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        tile = int(config["tile"])
        tiles = -(-wl["n"] // tile)
        cores = max(1, min(int(config["cores"]), m.cores, tiles))
        key = ("gather", wl.key_str(), getattr(target, "digest", target.name), tile)
        return stream.scheduled("gather", wl, config, m, key, lambda: _module(wl, tile), None, lambda it: it,
                                {"layout_change": "none", "path": config["path"], "lowering": "tir"},
                                cores_used=cores, tile=tile, path=config["path"])
