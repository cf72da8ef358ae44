"""dsp-sim template for fm_interaction (DeepFM's pairwise term): e (b, f, k) -> (sum_f e)^2 - sum_f e^2, fp32.

The samples are cut into tiles of `tile`, the tiles shared over `cores` cores in contiguous
shares. Per tile:

    e[tile] (rows, f, k) DDR -> AM          one DMA (one contiguous run: AM keeps e's layout)
    one VPU pass, per sample and per 32-lane vector of k (the last vector predicated):
        s = e[i, 0] + ... + e[i, f-1]       vld / vadd, in field order
        q = -(e[i, 0]^2 + ... )             vfnma (multiply-subtract), fused into the same loop
        s * s + q                           vfma, one rounding; vst into the AM out tile
    out[tile] (rows, k) AM -> DDR           one DMA

The fields never leave AM and the sums never leave the registers: e is read from DDR once and
only (b, k) is written. With `dbuf` two e and out tiles alternate (the next tile's DMA under this
tile's VPU pass). The DSP computes fp32 only (`require_fp32`).

`apply` returns the TVM schedule of the op's compute for the backend's "fm" lowering
(`backend/dsp/lower/fm.py`): the sample loop split by `tile` (the tile loop `opc.dsp.stage` /
`opc.dsp.cores`), e cache_read into AM at it (`opc.dsp.op = dma`), the squares inlined into their
sum, the output's k axis split into vectors of the machine's lanes, both sums computed per
vector in registers (`local.REG`) under the output's sample loop (`opc.dsp.op = vec`), the output
cached in AM and written back at the tile loop (`opc.dsp.op = dma`)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import ALIGN, CORES, DMA, F32, OP, SCOPE_AM, SCOPE_REG, STAGE, VEC, machine
from opcompiler.ops import op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from . import stream
from .common import refuse_invalid, require_fp32
from .stream import cdiv, cores_knob

TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TILES_PER_CORE = 2  # the default's tile: as large as AM allows while every core still gets this many


def _module(wl: Workload, rows: int, lanes: int):
    from tvm.s_tir import Schedule

    sch = Schedule(op_prim_func(wl))
    blk = sch.get_sblock
    out = blk("fm_out")
    i, j = sch.get_loops(out)
    to, ti = sch.split(i, [None, rows])
    jv, _ = sch.split(j, [None, lanes])
    sch.annotate(to, STAGE, 1)
    sch.annotate(to, CORES, 1)
    wb = sch.cache_write(out, 0, SCOPE_AM)  # the out tile in AM, written back per tile
    sch.reverse_compute_at(wb, to, preserve_unit_loops=True)
    sch.compute_inline(blk("fm_sq"))  # e * e read where the sum of squares accumulates it (the FMA)
    for name in ("fm_sum", "fm_sumsq"):  # per vector of k, in registers: s first, then q
        sch.compute_at(blk(name), jv, preserve_unit_loops=True)
        sch.set_scope(blk(name), 0, SCOPE_REG)
    cr = sch.cache_read(blk("fm_sum"), 0, SCOPE_AM)  # e: DDR -> AM at the tile loop (both sums read it)
    sch.compute_at(cr, to, preserve_unit_loops=True)
    sch.annotate(sch.get_loops(cr)[1], OP, DMA)
    sch.annotate(ti, OP, VEC)
    sch.annotate(sch.get_loops(wb)[1], OP, DMA)
    return sch.mod


def _aligned(elems: int) -> int:
    """Bytes of an AM buffer of `elems` fp32 as the lowering allocates it (AM's alignment)."""
    return -(-elems * F32 // ALIGN["AM"]) * ALIGN["AM"]


def am_bytes(wl: Workload, lanes: int, tile: int, dbuf: int) -> int:
    """AM the lowering places per core: per slot the e tile (with one vector of slack when k is not
    whole vectors: a partial vector's load reads past the tile's last row) and the out tile."""
    rows = min(tile, wl["b"])
    slack = lanes if wl["k"] % lanes else 0
    return (1 + int(dbuf)) * (_aligned(rows * wl["f"] * wl["k"] + slack) + _aligned(rows * wl["k"]))


@register_template
class DspFm(Template):
    """A tile of samples in AM, both field sums per vector in registers, s * s - q, one DMA each way."""

    name = "dsp.fm"
    op_families = ("fm",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        tiles = tuple(t for t in TILES if t < 2 * wl["b"]) or (TILES[0],)
        return [Knob("tile", tiles, "samples per AM tile"), Knob("dbuf", (1, 0), "two e and out tiles (ping-pong)"),
                cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Two slots, every core: the largest tile that fits AM while every core gets
        `TILES_PER_CORE` tiles (else the largest that fits; one slot if two never fit)."""
        m = machine(target)
        tiles = self.space(wl, target)[0].values
        for dbuf in (1, 0):
            fits = [t for t in tiles if am_bytes(wl, m.lanes, t, dbuf) <= m.cap("AM")]
            if fits:
                per_core = [t for t in fits if cdiv(wl["b"], t) >= TILES_PER_CORE * m.cores]
                return {"tile": (per_core or fits)[-1], "dbuf": dbuf, "cores": m.cores}
        return {"tile": tiles[0], "dbuf": 0, "cores": m.cores}  # refused by check: says why

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        need = am_bytes(wl, m.lanes, int(config["tile"]), int(config["dbuf"]))
        if need > m.cap("AM"):
            return f"AM needs {need} B (e and out tiles) > {m.cap('AM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        b, f, k = wl["b"], wl["f"], wl["k"]
        tiles = cdiv(b, int(config["tile"]))
        return {"ddr_bytes": float((b * f * k + b * k) * F32), "tiles": float(tiles),
                "work_per_core": tiles / max(1, min(int(config["cores"]), tiles)),
                "am_occupancy": am_bytes(wl, m.lanes, int(config["tile"]), int(config["dbuf"])) / m.cap("AM"),
                "lane_use": k / (cdiv(k, m.lanes) * m.lanes)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        rows = min(int(config["tile"]), wl["b"])
        tiles = cdiv(wl["b"], rows)
        cores = max(1, min(int(config["cores"]), m.cores, tiles))
        key = ("fm", wl.key_str(), getattr(target, "digest", target.name), rows, m.lanes)
        return stream.scheduled("fm", wl, config, m, key, lambda: _module(wl, rows, m.lanes), None, lambda it: it,
                                {"layout_change": "none", "lowering": "tir"}, cores_used=cores, tile=rows)
