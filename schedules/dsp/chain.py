"""dsp-sim template for element-wise ops: a chain of steps in one kernel, on the VPU.

Any op that declares a `chain` in the catalogue runs here (`chain_of`): relu, add, add_relu,
bias_add, batch_norm, bn_relu, hardswish are fixed chains, ew_chain spells its chain out (the steps:
`opcompiler.ops.steps`: relu, sigmoid, clip:LO:HI, affine:A:B, pow:P (x > 0), hardswish, add / mul
with a full-shape operand, bias / scale / bn with per-channel operands).

The kernel is a TVM schedule of the op's own TE compute (`chain_schedule`, below), lowered by the DSP
backend's vector lowering (`tir_vector`): the stored expression becomes vector instructions
recognised from its nodes (max -> vmax, a*b+c -> vfma, exp / log / 1/x -> the VPU's math-library
sequences, ...). The knobs: the tensor is cut into stages of about `tile` elements, split over
`cores` cores (or whole images per core, `split=batch`), DMAed DDR -> AM (x and each full-shape
operand; `dbuf`: two buffers alternate), computed in place and DMAed back. How elements map to
lanes depends on where per-channel operands vary (`_Geo`):

* no per-channel step: the flat tensor, 32 consecutive elements per vector;
* NCHW with per-channel steps: whole planes (or chunks of one plane when a plane exceeds the
  tile), each plane padded to a multiple of 32 in AM; the plane's parameters are SM scalars
  broadcast to the lanes (`sld`);
* NHWC with per-channel steps: blocks of pixels, each pixel's C channels padded to a multiple of
  32 in AM; the parameters are AM vectors (channels on the lanes).

The schedule (`chain_schedule`): the element-wise chain as the TVM schedule the DSP simulator executes.
Built over the op's own TE compute (relu, add, add_relu, bias_add, batch_norm, bn_relu, ew_chain),
with the template's knobs as schedule primitives and annotations:

    every stage but the last            compute_inline: one block holding the whole expression
                                        (broadcasts of per-channel operands and clip bounds fold in)
    the tensor                          transform_layout / transform_block_layout to the lanes'
                                        view: flat (elements), (image, elements) with split=batch,
                                        (image, channel, plane) for NCHW with per-channel steps,
                                        (pixel, channel) / (image, pixel, channel) for NHWC ones
    stage loop (`tile`)                 split of the flat / plane / pixel axis; annotated
                                        opc.dsp.stage, and opc.dsp.cores (split=items) or the
                                        image loop opc.dsp.cores (split=batch)
    x and full-shape operands           cache_read into local.AM at the stage loop (DMA nests,
                                        opc.dsp.op = "dma"); storage_align puts each plane / pixel
                                        at a vector boundary (the AM pitch)
    per-channel operands                cache_read into local.SM (NCHW planes: scalars broadcast
                                        to the lanes) or local.AM (NHWC pixels: channels on the
                                        lanes), once per core
    the expression                      computed in local.AM (cache_write), its nest annotated
                                        opc.dsp.op = "vec"; the result copied back (a DMA nest)

`dbuf` (two slots of every stage buffer) and `cores` (how many cores share the stage / image
loop) are read by the lowering. The backend's vector lowering (`tir_vector`) lowers the function;
nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import CORES, DMA, F32, OP, SCOPE_AM, SCOPE_SM, STAGE, VEC, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.steps import operand_kinds
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from . import stream
from .common import copy_loop, refuse_invalid, require_fp32
from .stream import cdiv, cores_knob, item_features, share

TILES = (1024, 2048, 4096, 8192, 16384, 32768)


def chain_of(wl: Workload) -> list[tuple[str, tuple[float, ...]]]:
    """The op as a step chain, as the catalogue declares it (`OpDef.chain`: ew_chain spells it
    out, bn_relu is bn;relu, add_relu with a per-channel y is bias;relu, ...)."""
    steps = get_op(wl.op).steps(wl)
    if steps is None:
        raise OpcError(f"no dsp element-wise chain for {wl.op}", arg="op", value=wl.op,
                       expected="an op with a chain in the catalogue (ew_chain, relu, bn_relu, ...)")
    return steps


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.hw = self.h * self.w
        self.total = self.n * self.c * self.hw
        self.steps = chain_of(wl)
        self.batch = cfg.get("split", "items") == "batch"
        kinds = operand_kinds(self.steps)
        self.nfull, self.nchan = kinds.count("full"), kinds.count("chan")
        self.L = L = m.lanes
        self.mode = "flat" if not self.nchan else ("plane" if wl.layout == "NCHW" else "pixel")
        self.tile = int(cfg["tile"])
        self.nbuf = 1 + int(cfg["dbuf"])
        if self.mode == "flat":
            self.unit, self.pitch, self.per = 1, 1, max(L, self.tile // L * L)
            self.buf = self.per
        elif self.mode == "plane":
            hwp = cdiv(self.hw, L) * L
            if hwp <= self.tile:
                self.per, self.chunk, self.pitch = max(1, self.tile // hwp), self.hw, hwp  # planes per stage
            else:
                self.per, self.chunk, self.pitch = 1, max(L, self.tile // L * L), 0  # one chunk of a plane
            self.buf = self.per * (self.pitch or self.chunk)
        else:
            self.pitch = cdiv(self.c, L) * L
            self.per = max(1, self.tile // self.pitch)  # pixels per stage
            self.buf = self.per * self.pitch

    def items(self) -> list[tuple]:
        if self.mode == "flat" and self.batch:  # whole images per core: stages never cross an image
            img = self.c * self.hw
            return [(e0, min(self.per, (b + 1) * img - e0)) for b in range(self.n)
                    for e0 in range(b * img, (b + 1) * img, self.per)]
        if self.mode == "flat":
            return [(e0, min(self.per, self.total - e0)) for e0 in range(0, self.total, self.per)]
        if self.mode == "plane":
            if self.pitch:
                return [(b, c0, min(self.per, self.c - c0), 0, self.hw) for b in range(self.n)
                        for c0 in range(0, self.c, self.per)]
            return [(b, c, 1, s0, min(self.chunk, self.hw - s0)) for b in range(self.n) for c in range(self.c)
                    for s0 in range(0, self.hw, self.chunk)]
        npix = self.n * self.hw
        if self.batch:
            return [(p0, min(self.per, (b + 1) * self.hw - p0)) for b in range(self.n)
                    for p0 in range(b * self.hw, (b + 1) * self.hw, self.per)]
        return [(p0, min(self.per, npix - p0)) for p0 in range(0, npix, self.per)]

    def image(self, it: tuple) -> int:
        if self.mode == "plane":
            return it[0]
        return it[0] // (self.c * self.hw) if self.mode == "flat" else it[0] // self.hw

    def shares(self, cores: int, total_cores: int) -> list[list]:
        """Items per core: contiguous balanced shares, or whole images per core (split=batch)."""
        items = self.items()
        if not self.batch:
            return share(items, cores, total_cores)
        k = max(1, min(cores, total_cores))
        out: list[list] = [[] for _ in range(total_cores)]
        for it in items:
            b = self.image(it)
            out[next(c for c in range(k) if b < (c + 1) * self.n // k)].append(it)
        return out

    def key(self, it: tuple) -> tuple:
        return it[1:2] if self.mode != "plane" else (it[2], it[4])

    def am_elems(self) -> int:
        par = self.nchan * self.pitch if self.mode == "pixel" else 0
        return self.nbuf * (1 + self.nfull) * (self.buf + self.L) + par

    def sm_elems(self) -> int:
        return self.nchan * self.c if self.mode == "plane" else 0


class DspChain(Template):
    """ew_chain and the single-step element-wise ops on the VPU (dispatched to by `dsp.elemwise`)."""

    name = "dsp.ew_chain"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 2  # v2: lowered from the TVM schedule (`chain_schedule`)

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        chain_of(wl)
        return [Knob("tile", TILES, "elements per DMA stage (rounded to whole planes / pixels with per-channel steps)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target)),
                Knob("split", ("items", "batch"), "stages across cores, or whole images per core (seed 004 §2.1.3)")]

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Seed 004 §2.1.3: images across the cores, one image per stage (the largest tile that
        fits it), no double buffering."""
        if wl.op == "ew_chain":
            raise OpcError("no paper schedule for ew_chain (seed 004 has none)", arg="--config", value="paper",
                           expected="default, best or a JSON object of knobs")
        m = machine(target)
        img = wl["c"] * wl["h"] * wl["w"]
        cfg = {"tile": TILES[0], "dbuf": 0, "cores": m.cores, "split": "batch"}
        for tile in sorted((t for t in TILES if t <= max(img, TILES[0])), reverse=True):
            cfg["tile"] = tile
            if self.check(wl, target, cfg) is None:
                break
        return cfg

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        g = _Geo(m, wl, {"tile": TILES[0], "dbuf": 0})
        cfg: dict[str, Any] = {}
        for tile in sorted(TILES, reverse=True):
            cfg = {"tile": tile, "dbuf": 1, "cores": m.cores, "split": "items"}
            # at least two stages per core when the tensor allows it
            if g.total // tile < 2 * m.cores and tile > TILES[0]:
                continue
            if self.check(wl, target, cfg) is None:
                return cfg
        return cfg

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am, sm = g.am_elems() * F32, g.sm_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        if sm > m.cap("SM"):
            return f"SM needs {sm} B (per-channel operands) > {m.cap('SM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        return item_features(m, g, g.items(), config.get("cores", m.cores), float((2 + g.nfull) * g.total * F32),
                             steps=float(len(g.steps)),
                             lane_use=(g.hw / g.pitch) if g.mode == "plane" and g.pitch else
                             (g.c / g.pitch if g.mode == "pixel" else 1.0))

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`chain_schedule`), lowered by the DSP backend."""
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = g.shares(int(config.get("cores", m.cores)), m.cores)  # cores with equal item keys time alike
        return scheduled(wl, target, config, g, shares)


_WL: dict[str, Workload] = {}


def chain_schedule(wl: Workload, mode: str, batch: bool, per: int, chunk: int, lanes: int):
    """The scheduled s_tir.Schedule. `mode`: flat | plane | pixel (`_Geo`); `per`:
    elements (flat), planes (plane with whole planes), pixels (pixel) per stage; `chunk`: the
    elements of a plane per stage when a plane exceeds the tile (0: whole planes)."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    root = sch.get_sblock("root")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    for nm in names[:-1]:
        sch.compute_inline(sch.get_sblock(nm))
    blk = sch.get_sblock(names[-1])
    func = sch.mod["main"]
    shape = tuple(int(s) for s in func.params[-1].shape)
    if len(shape) != 4:
        raise OpcError(f"the dsp chain schedule takes rank-4 tensors, not {list(shape)}", arg="op", value=wl.op)
    _, d1, d2, d3 = shape
    if mode == "flat":
        fmap = (lambda a, b, c, d: [a, (b * d2 + c) * d3 + d]) if batch else \
            (lambda a, b, c, d: [((a * d1 + b) * d2 + c) * d3 + d])
    elif mode == "plane":  # NCHW
        fmap = lambda a, b, c, d: [a, b, c * d3 + d]  # noqa: E731
    else:  # NHWC, channels last
        fmap = (lambda a, b, c, d: [a, b * d2 + c, d]) if batch else \
            (lambda a, b, c, d: [(a * d1 + b) * d2 + c, d])
    chan_ax = 3 if mode == "pixel" else 1
    for i, r in enumerate(sch.get(blk).reads):
        rs = tuple(int(s) for s in r.source.shape)
        if rs == shape:
            sch.transform_layout(blk, ("read", i), fmap)
        elif len(rs) == 4:  # a per-channel operand seen as (1, C, 1, 1) / (1, 1, 1, C)
            sch.transform_layout(blk, ("read", i), lambda *ix: [ix[chan_ax]])
    sch.transform_layout(blk, ("write", 0), fmap)
    sch.transform_block_layout(blk, fmap)
    loops = sch.get_loops(blk)
    cores_loop = None
    if mode == "flat":
        if batch:
            b, e = loops
            stage, inner = sch.split(e, [None, min(per, d1 * d2 * d3)])
            cores_loop = b
        else:
            stage, inner = sch.split(loops[0], [None, per])
    elif mode == "plane":
        b, c, s = loops
        if chunk:
            so, inner = sch.split(s, [None, chunk])
            stage = sch.fuse(c, so) if batch else sch.fuse(b, c, so)
        else:
            co, inner = sch.split(c, [None, per])
            stage = co if batch else sch.fuse(b, co)
        cores_loop = b if batch else None
    else:
        if batch:
            b, p, c = loops
            cores_loop = b
        else:
            p, c = loops
        stage, inner = sch.split(p, [None, per])
    sch.annotate(stage, STAGE, 1)
    sch.annotate(cores_loop if cores_loop is not None else stage, CORES, 1)
    depth = 2 if cores_loop is not None else 1  # loops down to the stage's own nests
    aligned = mode != "flat" and not chunk  # rows (planes, pixels) start at a vector
    o = sch.cache_write(blk, 0, SCOPE_AM)
    sch.reverse_compute_at(o, stage)
    reads = list(sch.get(blk).reads)
    staged, params = [], []
    for i, r in enumerate(reads):
        if tuple(int(s) for s in r.source.shape) == tuple(int(s) for s in sch.get(blk).writes[0].source.shape) \
                or len(r.source.shape) > 1:
            staged.append(i)
        else:
            params.append(i)
    # cache_read inserts before the consumer: the last one read comes first, so go backwards
    for i in reversed(staged):
        rd = sch.cache_read(blk, i, SCOPE_AM)
        sch.compute_at(rd, stage)
        if aligned:
            sch.storage_align(rd, 0, len(sch.get(rd).writes[0].source.shape) - 2, lanes, 0)
        sch.annotate(copy_loop(sch, rd, depth), OP, DMA)
    for i in reversed(params):
        rd = sch.cache_read(blk, i, SCOPE_SM if mode == "plane" else SCOPE_AM)
        sch.annotate(copy_loop(sch, rd, 0), OP, DMA)
    if aligned:
        sch.storage_align(blk, 0, len(sch.get(blk).writes[0].source.shape) - 2, lanes, 0)
    sch.annotate(copy_loop(sch, blk, depth), OP, VEC)  # (a one-element stage: a unit loop)
    sch.annotate(copy_loop(sch, o, depth), OP, DMA)
    return sch



def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The chain's schedule for the backend's vector lowering (`lowering="vector"`); dbuf and cores
    do not change the module. The cores with work are the ones the stage loop's split gives some."""
    m = machine(target)
    chunk = g.chunk if g.mode == "plane" and not g.pitch else 0
    knobs = (g.mode, g.batch, g.per, chunk, g.L)
    return stream.scheduled(
        "vector", wl, config, m, ("chain", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: chain_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lanes": g.mode, "lowering": "tir"}, cores_used="split")

