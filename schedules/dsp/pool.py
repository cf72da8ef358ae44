"""dsp-sim template for pool2d (max / average, kernel, stride, padding), NCHW and NHWC: its knobs, the
tile geometry and the AM budget. The program is lowered from the TVM schedule of the op's own
compute (`pool_schedule`, below) by the backend's window-nest lowering (`backend/dsp/lower/vector.py`).

NCHW: the N*C planes are independent. An item is (block of `planes` planes, block of `rows` output
rows); items are split over the cores. Per item the input rows it needs (with the halo of the
window) are DMAed DDR -> AM into a tile whose rows are padded (pitch `Wr`, the widest vector's
reach): the padding columns and any rows outside the image hold the pooling identity, written
by vector stores (the side columns once per buffer, the top / bottom rows when an item needs
them). Output columns sit on the 32 lanes: for output row y and vector v, tap (r, s) is a vector
load of input row y*stride + r at column 32*v*stride + s with lane stride `stride`. `separable=1`
reduces each input row over the S taps first (into an AM scratch) and then the R rows of that.
Average pooling divides by the number of valid elements in the window (padding not counted):
1/k^2 as an immediate when there is no padding, else a vector of per-column reciprocals (AM)
times a per-row reciprocal (SM scalar), constants computed at compile time (like weights).

NHWC: the channels are contiguous, so they sit on the lanes. An item is (block of `planes`
images, block of `rows` output rows, block of `chans` channels: every channel, or a multiple of
the 32 lanes). The input rows an item needs are DMAed into a tile of rows of `Wt` pixels (the ones
the windows read) packed at `chans` elements (with every channel a row of w*c elements is one
contiguous run; a channel block is a run per pixel), the padding pixels filled with the identity
as for NCHW; tap (r, s) of output pixel (y, x) is a unit-stride vector load at input pixel
(y*stride + r, x*stride + s) (`cdiv(chans, 32)` vectors; the lanes past the block read the next
pixel's channels and are never written back). Output pixels sit at a vector pitch in AM and are
written back as runs of the block's channels. `separable=1` reduces each input row over the S
taps first (AM scratch of `rows` pixels per input row). Average pooling's divisor is a per-row
times a per-column reciprocal (both SM scalars). The default picks the blocks that fit AM with
the least estimated copy time of the busiest core (`_nhwc_default`).

The schedule (`pool_schedule`, `pool_schedule_nhwc`): pooling as the TVM schedule the DSP simulator
executes.
Built over the op's own TE compute (`pool_pad` -> `pool2d` window reduction [-> `pool2d_avg`]),
with the template's knobs as schedule primitives and annotations:

    planes x rows items              transform_layout / transform_block_layout to (n*c, h, w)
                                     planes; the planes split by `planes`; split of the output rows by
                                     `rows`; the two outer loops fused: the stage loop
                                     (opc.dsp.stage, opc.dsp.cores: contiguous shares of items)
    the padded input tile            pool_pad computed at the stage in local.AM (a DMA nest,
                                     opc.dsp.op = "dma": the rows inside the image copied, the
                                     padding filled with the reduction's identity); its rows
                                     storage_align'ed to the pitch the widest vector reads
    the window reduction             the output tile (cache_write, local.AM, rows at a vector
                                     pitch) computed by one vector nest, opc.dsp.op = "vec":
                                     output columns on the lanes, the window taps unrolled
    avg's divisor                    pool2d_avg computed at the reduction's column loop (the
                                     window sum stays in a register, local.REG)
    separable                        opc.dsp.separable = 1 on the vector nest: the lowering
                                     reduces each input row over the columns first (AM scratch)
    dbuf / cores                     read by the lowering

NHWC (`pool_schedule_nhwc`): the channels are contiguous, so they go on the lanes. Items are
(block of `planes` images, block of `rows` output rows, block of `chans` channels): the three
outer loops fused into the stage loop. The padded input tile (or the cache_read of x) is
(images, rows, pixels, channels) with the pixels packed (storage_align to `chans`): with every
channel in the block a row is one contiguous run of w*c elements (one DMA run), otherwise runs of
`chans` per pixel; the padding is whole pixels at the ends of a row (the same fills as NCHW). The
output tile puts each pixel at a vector pitch (storage_align to the lanes); a tap of output pixel
(y, x) is a unit-stride vector load of input pixel (y*stride + r, x*stride + s), and the
write-back is a strided copy of the pixels' channels. avg's divisor varies with the row and the
column, not the lanes: two SM reciprocal tables (per row, per column).

The backend's vector lowering (`tir_vector`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
import itertools
from typing import Any

import numpy as np

from opcompiler.backend.dsp.intrin import CORES, DMA, F32, OP, SCOPE_AM, SCOPE_REG, STAGE, VEC, DspMachine, machine
from opcompiler.ops import op_prim_func
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from . import stream
from .common import capacity_why, require_fp32
from .stream import cdiv, cores_knob, geo_shares

PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 7, 8, 14, 16, 28, 32, 56)
CHANS = (32, 64, 128, 256, 512, 1024)  # NHWC channel blocks (below c; c itself is the first value)


class _Geo:
    """Tile geometry of one workload and config (elements)."""

    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.k, self.st, self.pad, self.mode = p["kernel"], p["stride"], p["pad"], p["mode"]
        self.ho = (self.h + 2 * self.pad - self.k) // self.st + 1
        self.wo = (self.w + 2 * self.pad - self.k) // self.st + 1
        self.nhwc = wl.layout == "NHWC"
        self.L = L = m.lanes
        self.P = self.n if self.nhwc else self.n * self.c  # NHWC: the images are the planes
        if self.nhwc:  # channels on the lanes: `chans` per stage, pixels at a vector pitch in the output tile
            self.chans = max(1, min(int(cfg.get("chans", self.c)), self.c))
            self.nv = cdiv(self.chans, L)
            self.Cp = self.nv * L
            self.Wt = (self.wo - 1) * self.st + self.k  # input pixels per tile row (what the windows read)
            self.OW = self.wo * self.Cp  # output tile row pitch
            self.Wr = self.Wt * self.chans  # input tile row pitch
            self.lane_use = self.c / (cdiv(self.c, self.chans) * self.Cp)
        else:
            self.nv = cdiv(self.wo, L)
            self.OW = self.nv * L  # output tile row pitch (lanes of every vector)
            self.Wr = max(self.w + 2 * self.pad, (self.OW - 1) * self.st + self.k)  # input tile row pitch
        self.planes = max(1, min(int(cfg["planes"]), self.P))
        self.rows = max(1, min(int(cfg["rows"]), self.ho))
        self.IR = self.ir(self.rows)
        self.sep = bool(cfg["separable"]) and self.k > 1
        self.nbuf = 1 + int(cfg["dbuf"])
        self.PP = self.IR * self.Wr
        self.OP = self.rows * self.OW
        self.HP = self.IR * self.OW
        self.full = self.pad == 0  # every window inside the image: avg divides by k*k
        self.ident = -np.inf if self.mode == "max" else 0.0

    def ir(self, nr: int) -> int:
        return (nr - 1) * self.st + self.k

    def am_elems(self, lanes: int) -> int:
        if self.nhwc:  # each tile rounded to the allocator's 32 elements, plus its vector of slack
            tiles = [self.planes * self.PP, self.planes * self.OP] + ([self.planes * self.HP] if self.sep else [])
            return self.nbuf * sum(cdiv(t, 32) * 32 + 2 * lanes for t in tiles)
        per = self.planes * (self.PP + self.OP + (self.HP if self.sep else 0))
        consts = self.OW if (self.mode == "avg" and not self.full) else 0
        return self.nbuf * (per + lanes * self.st) + consts

    def sm_elems(self) -> int:
        if self.nhwc:
            return self.ho + self.wo + 4 if (self.mode == "avg" and not self.full) else 0
        return self.ho if (self.mode == "avg" and not self.full) else 0

    def items(self) -> list[tuple[int, ...]]:
        """(first plane, planes, first output row, rows) per item, in stage order; NHWC
        (first image, images, first output row, rows, first channel, channels)."""
        if self.nhwc:
            return [(p0, min(self.planes, self.P - p0), y0, min(self.rows, self.ho - y0), c0,
                     min(self.chans, self.c - c0))
                    for p0 in range(0, self.P, self.planes) for y0 in range(0, self.ho, self.rows)
                    for c0 in range(0, self.c, self.chans)]
        return [(p0, min(self.planes, self.P - p0), y0, min(self.rows, self.ho - y0))
                for p0 in range(0, self.P, self.planes) for y0 in range(0, self.ho, self.rows)]

    def key(self, it: tuple[int, ...]) -> tuple:
        _, np_, y0, nr = it[:4]
        iy0 = y0 * self.st - self.pad
        lo, hi = max(0, iy0), min(self.h, iy0 + self.ir(nr))
        return (np_, nr, lo - iy0, hi - lo) + tuple(it[5:])

    def item_bytes(self, it: tuple[int, ...]) -> tuple[int, int]:
        """DDR bytes an item reads (its input rows, halo included) and writes."""
        np_, nr = it[1], it[3]
        ch = it[5] if self.nhwc else 1  # an NHWC plane is an image of c channels
        return (np_ * min(self.h, self.ir(nr)) * self.w * ch * F32, np_ * nr * self.wo * ch * F32)


@register_template
class DspPool2d(Template):
    """Max / average pooling on the VPU: output columns (NCHW) or channels (NHWC) on the lanes, planes
    (NHWC: images) x row blocks across cores."""

    name = "dsp.pool2d"
    op_families = ("pool",)
    target_family = "dsp"
    version = 1

    def _check_wl(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        m = machine(target)
        g = _Geo(m, wl, {"planes": 1, "rows": 1, "separable": 0, "dbuf": 0})
        planes = tuple(v for v in PLANES if v <= g.P) or (1,)
        rows = tuple(sorted({v for v in ROWS if v < g.ho} | {g.ho}))
        return [Knob("planes", planes, "planes (n x c; NHWC: images) per stage"),
                Knob("rows", rows, "output rows per stage (the input halo is fetched again per block)"),
                Knob("separable", (1, 0) if wl["kernel"] > 1 else (0,),
                     "reduce each input row over the columns first, then the rows (AM scratch)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles so DMA overlaps the VPU"),
                cores_knob(m)] + ([Knob("chans", (g.c,) + tuple(v for v in CHANS if v < g.c),
                                        "NHWC: channels per stage (blocks of the lanes; all: whole rows are one run)")]
                                  if g.nhwc else [])

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        g0 = _Geo(m, wl, {"planes": 1, "rows": 1, "separable": 0, "dbuf": 0})
        cfg: dict[str, Any] = {}
        if g0.nhwc:
            best = self._nhwc_default(wl, target, knobs)
            if best is not None:
                return best
        # whole planes when they fit, enough items that every core gets at least two
        for rows in sorted(knobs["rows"], reverse=True):
            for planes in sorted(knobs["planes"], reverse=True):
                items = cdiv(g0.P, planes) * cdiv(g0.ho, rows)
                if items < min(2 * m.cores, cdiv(g0.P, 1) * cdiv(g0.ho, rows)):
                    continue
                cfg = {"planes": planes, "rows": rows, "separable": knobs["separable"][0], "dbuf": 1,
                       "cores": m.cores}
                if self.check(wl, target, cfg) is None:
                    return cfg
        return {"planes": 1, "rows": 1, "separable": knobs["separable"][0], "dbuf": 1, "cores": m.cores}

    def _nhwc_default(self, wl: Workload, target: Target, knobs: Mapping[str, tuple]) -> dict[str, Any] | None:
        """NHWC: few planes (the images), so the blocks that fit AM with the least estimated time
        of the busiest core's copies (the halo rows a row block fetches again, the runs of a
        channel block and each item's descriptors against the cores they keep busy on the shared
        DDR channel), double buffered when any such block fits."""
        m = machine(target)
        g0 = _Geo(m, wl, {"planes": 1, "rows": 1, "separable": 0, "dbuf": 0})
        # per rows value: sum over the row blocks of the input rows each reads, and the row blocks
        rin = {r: (sum(min(g0.h, g0.ir(min(r, g0.ho - y0))) for y0 in range(0, g0.ho, r)), cdiv(g0.ho, r))
               for r in knobs["rows"]}
        for dbuf in (1, 0):
            best = None
            for sep, chans, planes, rows in itertools.product(knobs["separable"], knobs["chans"],
                                                               sorted(knobs["planes"], reverse=True),
                                                               sorted(knobs["rows"], reverse=True)):
                c = {"planes": planes, "rows": rows, "chans": chans, "separable": sep, "dbuf": dbuf, "cores": m.cores}
                if self.check(wl, target, c) is not None:
                    continue
                g = _Geo(m, wl, c)
                rows_in, nrb = rin[rows]
                items = cdiv(g.P, g.planes) * nrb * cdiv(g.c, g.chans)
                ddr = (g.P * rows_in * g.w + g.P * g.ho * g.wo) * g.c * F32
                runs = g.P * rows_in * (g.w if g.chans < g.c else 1) * cdiv(g.c, g.chans) + \
                    g.P * g.ho * (g.wo if g.Cp != g.chans or g.chans < g.c else 1) * cdiv(g.c, g.chans)
                # the busiest core's items, each two descriptors (start-up and DDR latency) and its
                # bytes at its share of the DDR channel while the other cores stream too
                bw = min(m.dma_bytes_per_cycle, m.ddr_bytes_per_cycle / min(items, m.cores))
                per_item = 2 * (m.dma_startup + m.ddr_latency) + (runs * m.dma_row_cycles + ddr / bw) / items
                est = cdiv(items, m.cores) * per_item
                if best is None or est < best[0]:
                    best = (est, c)
            if best is not None:
                return best[1]
        return None

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        return capacity_why(m, {"AM": g.am_elems(m.lanes) * F32, "SM": g.sm_elems() * F32})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        chans = g.c if g.nhwc else 1  # an NHWC plane is an image of c channels
        ddr_in = sum(g.item_bytes(it)[0] for it in items)
        ddr_out = g.P * g.ho * g.wo * chans * F32
        loads = g.k * (g.ir(g.rows) / g.rows + g.k / g.st) if g.sep else g.k * g.k
        return {"ddr_bytes": float(ddr_in + ddr_out), "halo_ratio": ddr_in / max(g.P * g.h * g.w * chans * F32, 1),
                "stages": float(len(items)), "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems(m.lanes) * F32 / m.cap("AM"), "loads_per_vector": float(loads),
                "lane_use": g.lane_use if g.nhwc else g.wo / g.OW}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`pool_schedule`), lowered by the DSP backend."""
        self._check_wl(wl, target)
        m, g, shares = geo_shares(self, wl, target, config, _Geo)
        return scheduled(wl, target, config, g, shares)


_WL: dict[str, Workload] = {}


def _blocks(wl: Workload):
    """A fresh schedule of the op's compute and its blocks: (schedule, avg, the window reduction,
    the padding block or None (the window then reads x), the last block (avg's divide or the max))."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    avg = wl["mode"] == "avg"
    red = sch.get_sblock("pool2d")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    pad = sch.get_sblock("pool_pad") if "pool_pad" in names else None
    return sch, avg, red, pad, sch.get_sblock("pool2d_avg") if avg else red


def pool_schedule(wl: Workload, planes: int, rows: int, sep: bool, pitch: int, lanes: int):
    """The scheduled s_tir.Schedule; `pitch`: the input tile's row pitch (elements)."""
    sch, avg, red, pad, last = _blocks(wl)
    C = int(wl["c"])
    f4 = lambda b, c, y, x: [b * C + c, y, x]
    if pad is not None:
        sch.transform_layout(pad, ("read", 0), f4)
        sch.transform_layout(pad, ("write", 0), f4)
    else:
        sch.transform_layout(red, ("read", 0), f4)
    sch.transform_layout(red, ("write", 0), f4)
    if avg:
        sch.transform_layout(last, ("write", 0), f4)
        sch.transform_block_layout(last, f4)
    if pad is not None:
        sch.transform_block_layout(pad, f4)
    sch.transform_block_layout(red, lambda b, c, y, x, r, s: [b * C + c, y, x, r, s])
    p, y, x = sch.get_loops(last)[:3]
    po, pi = sch.split(p, [None, planes])
    yo, yi = sch.split(y, [None, rows])
    sch.reorder(po, yo, pi, yi)
    # tiles placed under the row-block loop before it is fused with the plane-block loop: TVM's
    # region analysis of the tiles is exact over the two loops, not over the fused one's // and %
    o, pad = _tiles(sch, red, last, pad, avg, x, yo)
    stage = sch.fuse(po, yo)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 1, pitch, 0)
    sch.storage_align(last, 0, 1, lanes, 0)
    return _annotated(sch, pad, last, o, sep)


def _annotated(sch, pad, last, o, sep: bool):
    """The stage's nests marked for the lowering: the input tile's DMA, the window nest (a vector
    nest, `separable` when each input row is reduced over the S taps first), the output's DMA."""
    sch.annotate(sch.get_loops(pad)[1], OP, DMA)
    vec = sch.get_loops(last)[1]
    sch.annotate(vec, OP, VEC)
    if sep:
        sch.annotate(vec, "opc.dsp.separable", 1)
    sch.annotate(sch.get_loops(o)[1], OP, DMA)
    return sch


def _tiles(sch, red, last, pad, avg: bool, acc_at, at):
    """The AM tiles of a stage, placed at loop `at`: the output tile (cache_write of the last block)
    and the input tile (the padding block in AM, or a cache_read of the input); for avg, the window
    sum in a register at loop `acc_at`. Returns (output copy block, input tile block)."""
    if avg:
        sch.compute_at(red, acc_at)
        sch.set_scope(red, 0, SCOPE_REG)
    o = sch.cache_write(last, 0, SCOPE_AM)
    sch.reverse_compute_at(o, at, preserve_unit_loops=True)
    if pad is not None:
        sch.compute_at(pad, at, preserve_unit_loops=True)
        sch.set_scope(pad, 0, SCOPE_AM)
    else:
        pad = sch.cache_read(red, 0, SCOPE_AM)
        sch.compute_at(pad, at, preserve_unit_loops=True)
    return o, pad


def pool_schedule_nhwc(wl: Workload, planes: int, rows: int, chans: int, sep: bool, lanes: int):
    """NHWC: the scheduled s_tir.Schedule (see the module docstring); `chans`: channels per stage."""
    sch, avg, red, pad, last = _blocks(wl)
    b, y, x, c = sch.get_loops(last)[:4]
    bo, bi = sch.split(b, [None, planes])
    yo, yi = sch.split(y, [None, rows])
    co, ci = sch.split(c, [None, chans])
    sch.reorder(bo, yo, co, bi, yi, x, ci)
    # tiles placed under the channel-block loop before it is fused with the image- and row-block
    # loops (as NCHW: TVM's region analysis is exact over the loops, not over the fused one's // and %)
    o, pad = _tiles(sch, red, last, pad, avg, ci, co)
    stage = sch.fuse(bo, yo, co)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 2, min(chans, int(wl["c"])), 0)  # the input pixels packed (the lowering's `_tight`)
    sch.storage_align(last, 0, 2, lanes, 0)  # each output pixel at a vector
    return _annotated(sch, pad, last, o, sep)


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The pooling schedule (`lowering="vector"`: the backend's window-nest lowering; the
    constants it computes, the divisors of average pooling, are DDR tables the host fills)."""
    m = machine(target)
    if wl.layout == "NHWC":
        knobs = (g.planes, g.rows, g.chans, g.sep, g.L)
        return stream.scheduled(
            "vector", wl, config, m, ("pool", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
            lambda: pool_schedule_nhwc(wl, *knobs).mod, shares, g.key,
            {"layout_change": "none", "lane_use": round(g.lane_use, 4), "lowering": "tir"},
            args={0: "x", -1: "out"}, ddr={"x": (g.n, g.h, g.w, g.c), "out": (g.n, g.ho, g.wo, g.c)},
            tile_tags=True, tables=True)
    knobs = (g.planes, g.rows, g.sep, g.Wr, g.L)
    return stream.scheduled(
        "vector", wl, config, m, ("pool", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: pool_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lane_use": round(g.wo / g.OW, 4), "lowering": "tir"},
        args={0: "x", -1: "out"}, ddr={"x": (g.n, g.c, g.h, g.w), "out": (g.n, g.c, g.ho, g.wo)},
        tile_tags=True, tables=True)

