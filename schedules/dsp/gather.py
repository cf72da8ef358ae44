"""dsp-sim template for gather (embedding lookup): DMA only, fp32.

The indices are cut into tiles of `tile`, the tiles shared over `cores` cores in contiguous
shares. Per tile the indices go DDR -> SM (one DMA); then per index the core reads it from SM and
issues one DMA of that table row (with `fields` > 0 the row is the index plus its field's offset,
the offsets in SM, loaded once per core): `path=ddr` straight to the output row (a DDR -> DDR
descriptor), `path=am` into an AM row tile (two with `dbuf`) that leaves in one DMA. An index
outside the table is a one-line error naming it and the table size.

`apply` returns the TVM schedule of the op's compute (the index loop split by `tile`) for the
backend's "gather" lowering (`backend/dsp/lower/gather.py`)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, machine
from opcompiler.errors import OpcError
from opcompiler.ops import op_prim_func
from opcompiler.ops.catalogue.gather import fields
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
    i, _ = sch.get_loops(sch.get_sblock("gather"))
    sch.split(i, [None, tile])
    return sch.mod


@register_template
class DspGather(Template):
    """Rows of a DDR table by runtime indices: the index tile in SM, one row DMA per index."""

    name = "dsp.gather"
    op_families = ("gather",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        if wl["rows"] > MAX_ROWS:
            raise OpcError(f"{target.name} holds indices as fp32 values: tables up to {MAX_ROWS} rows", arg="rows",
                           value=wl["rows"], expected=f"<= {MAX_ROWS}")
        return [Knob("tile", tuple(t for t in TILES if t < 2 * wl["n"]) or (TILES[0],), "indices per tile"),
                Knob("path", ("ddr", "am"), "rows DDR -> DDR, or staged through an AM row tile"),
                Knob("dbuf", (1, 0), "two index (and AM row) tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        tiles = [t for t in self.space(wl, target)[0].values]
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
        if config["path"] == "am":
            need = slots * int(config["tile"]) * wl["cols"] * F32
            if need > m.cap("AM"):
                return f"AM needs {need} B > {m.cap('AM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        tiles = -(-wl["n"] // int(config["tile"]))
        return {"ddr_bytes": float(2 * wl["n"] * wl["cols"] * F32), "transfers": float(wl["n"] + tiles),
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
