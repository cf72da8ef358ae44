"""dsp-sim template for grouped and depthwise convolution (groups > 1), NCHW / OIHW (dispatched
to by `dsp.direct_conv2d`, whose K-on-the-lanes direct convolution needs every output channel to
read every input channel). `apply` is the TVM schedule of the op's own TE compute
(`gconv_schedule`, below), lowered by the DSP backend (its `tir_gconv.py`); the module also
keeps the knobs, the capacity checks, the default and `features()`.

An item is (image, block of `planes` output channels, block of `rows` output rows); items are
split over the cores. A block holds whole groups when a group has at most `planes` output
channels (depthwise: `planes` channels, each its own group), else a slice of one group. Per item
the input planes of the block's groups are DMAed DDR -> AM (rows with the halo; zero padding
columns written by vector stores once per buffer, zero rows when the item needs them), the
weights (and bias / BN parameters) sit in SM: all of them for the whole kernel
(`w_path=resident`) or the block's, fetched per item (`w_path=stage`).

Output columns sit on the 32 lanes. A register block is `rb` output rows x 32 columns of one
output channel: for each input channel of its group (the sequential inner loop, accumulators
carried), every input row the block needs is loaded once per column tap (a vector load with lane
stride `stride`) and multiplied by the tap's weight (an SM scalar broadcast) into the
accumulators of the output rows that use it; larger `rb` reuses each loaded row for more
outputs (R x S weight registers + rb accumulators must fit the register file). The epilogue
(bias, BN scale/shift, ReLU or HardSwish) runs on the accumulators, which are stored to the AM output tile
and DMAed AM -> DDR.

The schedule (`gconv_schedule`): grouped / depthwise convolution (groups > 1, NCHW) as the TVM
schedule the DSP simulator executes.
Built over the op's own TE compute (`pad` -> `conv2d` [-> `conv2d_bias` | `batch_norm`] [-> `vrelu` | HardSwish's
blocks, inlined into its last, `vmul`]),
with the template's knobs as schedule primitives and annotations:

    items (image, channel block, row block)   the output channels split into blocks of `planes`:
                                     whole groups (kk -> (block, group in block, channel in group))
                                     when a group has at most `planes` channels, else slices of one
                                     group (kk -> (group, slice, channel in slice)); the output rows
                                     split by `rows`; the item loops fused into the stage loop
                                     (opc.dsp.stage, opc.dsp.cores: contiguous shares of items)
    the padded input tile            `pad` computed at the stage in local.AM (the block's groups'
                                     input planes, the item's rows with the halo; a DMA nest,
                                     opc.dsp.op = "dma"), rows storage_align'ed to the pitch the
                                     widest vector load reads
    the output tile                  cache_write of the last block into local.AM (rows at a vector
                                     pitch), copied AM -> DDR by a DMA nest
    weights, bias / BN vectors       cache_read into local.SM: at the root for the whole kernel
                                     (`w_path=resident`), at the stage for the block's (`stage`)
    register blocks                  the item's rows split by `rb`, the columns by the lanes;
                                     (group, channel, row block, column vector) is the loop nest
                                     opc.dsp.op = "gconv": the conv reduction computed under it into
                                     local.REG (input channels of the group outermost, then the
                                     block's rows and lanes, then the taps), the epilogue blocks
                                     after it

The backend's convolution lowering (`tir_gconv`) lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opcompiler.backend.dsp.intrin import (
    CORES,
    DMA,
    EPI_BLOCKS,
    EPI_TEMPS,
    F32,
    GCONV,
    OP,
    SCOPE_AM,
    SCOPE_SM,
    STAGE,
    DspMachine,
    machine,
)
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, op_prim_func
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.ops.steps import lowerable
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from . import stream
from .common import epilogue_steps, inline_hswish, reg_blocks, require_fp32
from .stream import cdiv, cores_knob, geo_shares, item_features

# the epilogue steps (`opcompiler.ops.steps`) the grouped convolution lowers, in its order: a
# conv2d-family op runs here when its catalogue entry's `epilogue` is made of them ("hardswish":
# x * (clip(x + 3, 0, 6) / 6) on the accumulators, the clip in one temporary register)
EPI_STEPS = {"bias": "bias", "bn": "bn", "relu": "relu", "hardswish": "hswish"}


def epilogue(wl: Workload) -> tuple[str, ...] | None:
    return lowerable(get_op(wl.op).epilogue_steps(wl), EPI_STEPS, ordered=True)
PARAMS = {"bias": ("bias",), "bn": ("scale", "shift")}
PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 7, 8, 14, 16, 28, 32, 56)
RB = (1, 2, 3, 4, 6, 8)
X_REGS = 4  # input vectors in flight per register block (names rotate)


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w, self.k = p["n"], p["c"], p["h"], p["w"], p["k"]
        self.R, self.S, self.st, self.pad, self.dil, self.groups = p["r"], p["s"], p["stride"], p["pad"], \
            p["dilation"], p["groups"]
        self.cg, self.kg = self.c // self.groups, self.k // self.groups
        self.ho, self.wo = conv_out_hw(wl)
        self.epi = epilogue(wl)
        self.pnames = [nm for e in self.epi for nm in PARAMS.get(e, ())]
        self.taps = self.R * self.S
        self.L = L = m.lanes
        self.nv = cdiv(self.wo, L)
        self.OW = self.nv * L
        self.Wr = max(self.w + 2 * self.pad, (self.OW - 1) * self.st + (self.S - 1) * self.dil + 1)
        planes = max(1, int(cfg["planes"]))
        if self.kg <= planes:  # whole groups per block
            self.gb, self.kpg = max(1, min(planes // self.kg, self.groups)), self.kg
        else:  # a slice of one group
            self.gb, self.kpg = 1, planes
        self.KP, self.CIN = self.gb * self.kpg, self.gb * self.cg
        self.rows = max(1, min(int(cfg["rows"]), self.ho))
        self.rb = max(1, min(int(cfg["rb"]), self.rows))
        self.IR = self.ir(self.rows)
        self.PP, self.OP = self.IR * self.Wr, self.rows * self.OW
        self.nbuf = 1 + int(cfg["dbuf"])
        self.resident = cfg["w_path"] == "resident"
        self.wblk = self.KP * self.cg * self.taps  # weights of one block

    def ir(self, nr: int) -> int:
        return (nr - 1) * self.st + (self.R - 1) * self.dil + 1

    def blocks(self) -> list[tuple[int, int, int]]:
        """(first output channel, groups in the block, output channels per group in the block)."""
        if self.kg <= self.KP:
            return [(g0 * self.kg, min(self.gb, self.groups - g0), self.kg) for g0 in range(0, self.groups, self.gb)]
        return [(g * self.kg + q, 1, min(self.kpg, self.kg - q)) for g in range(self.groups)
                for q in range(0, self.kg, self.kpg)]

    def items(self) -> list[tuple]:
        return [(b, k0, gbn, kpg, y0, min(self.rows, self.ho - y0)) for b in range(self.n)
                for k0, gbn, kpg in self.blocks() for y0 in range(0, self.ho, self.rows)]

    def key(self, it: tuple) -> tuple:
        _, _, gbn, kpg, y0, nr = it
        iy0 = y0 * self.st - self.pad
        lo, hi = max(0, iy0), min(self.h, iy0 + self.ir(nr))
        return (gbn, kpg, nr, lo - iy0, hi - lo)

    def am_elems(self) -> int:
        return self.nbuf * (self.CIN * self.PP + self.L * self.st + self.KP * self.OP)

    def am_alloc(self) -> int:
        """AM elements the lowering allocates: per buffer the input tile (the planes TVM's region of
        the block holds) rounded up to a vector plus a vector of slack, the output tile plus a
        vector of slack."""
        # a block slicing a group (kg % planes != 0) may read two groups' planes: TVM's region
        cin = 2 * self.cg if self.kg > self.KP and self.kg % self.KP else self.CIN
        return self.nbuf * (cdiv(cin * self.PP, self.L) * self.L + self.L + self.KP * self.OP + self.L)

    def sm_elems(self) -> int:
        if self.resident:
            return self.k * self.cg * self.taps + len(self.pnames) * self.k
        wb = self.wblk
        if self.kg > self.KP and self.kg % self.KP:
            # uneven slices of a group (k0 = g*kg + q): TVM's region of a stage's weights is not the
            # slice but about the whole kernel's (ShuffleNet's 1x1, 4 groups of 68, planes 16:
            # 284 channels' rows), so the tile is allocated that large
            wb = (self.k + self.KP) * self.cg * self.taps
        return self.nbuf * (wb + len(self.pnames) * self.KP)

    def regs(self) -> int:
        # the epilogue's temporary registers (HardSwish's clip chain), one for the block's rows
        return self.rb + self.taps + X_REGS + len(self.pnames) + sum(EPI_TEMPS[e] for e in self.epi)


class DspGroupedConv(Template):
    """Grouped / depthwise NCHW convolution on the VPU (dispatched to by `dsp.direct_conv2d`)."""

    name = "dsp.grouped_conv2d"
    op_families = ("conv2d",)
    target_family = "dsp"
    version = 1

    def _check_wl(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)
        if wl.layout != "NCHW":
            raise OpcError("the dsp grouped / depthwise convolution is NCHW (output columns on the lanes)",
                           arg="layout", value=wl.layout, expected="NCHW (or groups=1)")
        epilogue_steps(wl, EPI_STEPS, "grouped-conv")

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        m = machine(target)
        ho, _ = conv_out_hw(wl)
        return [Knob("planes", tuple(v for v in PLANES if v <= wl["k"]) or (1,), "output channels per stage"),
                Knob("rows", tuple(sorted({v for v in ROWS if v < ho} | {ho})), "output rows per stage"),
                Knob("rb", tuple(v for v in RB if v <= ho) or (1,), "output rows per register block"),
                Knob("w_path", ("resident", "stage"), "all weights in SM for the kernel, or the block's per stage"),
                Knob("dbuf", (1, 0), "double-buffer the AM / SM tiles so DMA overlaps the VPU"),
                cores_knob(m)]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        cfg: dict[str, Any] = {}
        for dbuf in (1, 0):
            for rows in sorted(knobs["rows"], reverse=True):
                for planes in sorted(knobs["planes"], reverse=True):
                    for w_path in ("resident", "stage"):
                        cfg = {"planes": planes, "rows": rows, "rb": max(v for v in knobs["rb"] if v <= 4),
                               "w_path": w_path, "dbuf": dbuf, "cores": m.cores}
                        g = _Geo(m, wl, cfg)
                        if len(g.items()) < min(2 * m.cores, wl["n"] * wl["k"] * cdiv(g.ho, rows)):
                            continue
                        if self.check(wl, target, cfg) is None:
                            return cfg
        return {**cfg, "planes": 1, "rows": 1, "rb": 1}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am, sm = max(g.am_elems(), g.am_alloc()) * F32, g.sm_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        if sm > m.cap("SM"):
            return f"SM needs {sm} B (weights, w_path={config['w_path']}) > {m.cap('SM')} B"
        if g.regs() > m.registers:
            return f"register block needs {g.regs()} vector registers > {m.registers}"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        ddr_in = sum(gbn * g.cg * min(g.h, g.ir(nr)) * g.w for _, _, gbn, _, _, nr in items) * F32
        ddr_w = (g.k * g.cg * g.taps) * F32 * (1 if g.resident else len(items) / max(1, len(g.blocks())))
        ddr_out = g.n * g.k * g.ho * g.wo * F32
        rows_loaded = g.ir(g.rb)
        return item_features(m, g, items, config["cores"], float(ddr_in + ddr_w + ddr_out),
                             sm_occupancy=g.sm_elems() * F32 / m.cap("SM"), reg_occupancy=g.regs() / m.registers,
                             loads_per_fma=rows_loaded * g.S / (g.rb * g.taps), lane_use=g.wo / g.OW)

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """This config's TVM schedule (`gconv_schedule`), lowered by the DSP backend."""
        self._check_wl(wl, target)
        m, g, shares = geo_shares(self, wl, target, config, _Geo)
        return scheduled(wl, target, config, g, shares)


_WL: dict[str, Workload] = {}


def gconv_schedule(wl: Workload, planes: int, rows: int, rb: int, resident: bool, pitch: int, lanes: int):
    """The scheduled s_tir.Schedule; `pitch`: the input tile's row pitch (elements)."""
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    p = wl.p
    kg = p["k"] // p["groups"]
    names = inline_hswish(sch, [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))])
    epi = [b for b in names if b in EPI_BLOCKS]
    conv = sch.get_sblock("conv2d")
    last = sch.get_sblock(epi[-1]) if epi else conv
    # the input as (image * channel) planes, as pooling does: the padded tile's copy is a
    # (planes, rows, columns) nest whatever the block holds
    C = int(p["c"])
    f4 = lambda b, c, y, x: [b * C + c, y, x]  # noqa: E731
    if "pad" in names:
        pad = sch.get_sblock("pad")
        sch.transform_layout(pad, ("read", 0), f4)
        sch.transform_layout(pad, ("write", 0), f4)
        sch.transform_block_layout(pad, f4)
    else:
        sch.transform_layout(conv, ("read", 0), f4)
    o = sch.cache_write(last, 0, SCOPE_AM)  # the output tile; `o` is its AM -> DDR copy
    n, k, y, x, rc, ry, rx = sch.get_loops(conv)
    if kg <= planes:  # whole groups per block
        kb, kin = sch.split(k, [None, max(1, planes // kg) * kg])
        gi, ci = sch.split(kin, [None, kg])
        items = [n, kb]
    else:  # slices of one group
        g, q = sch.split(k, [None, kg])
        qb, ci = sch.split(q, [None, planes])
        gi = sch.add_unit_loop(ci)
        items = [n, g, qb]
    yo, yi = sch.split(y, [None, rows])
    xv, xl = sch.split(x, [None, lanes])
    sch.reorder(*items, yo, gi, ci, yi, xv, rc, xl, ry, rx)
    # tiles placed at the row-block loop before it is fused and before the register-block split:
    # TVM's region analysis of the tiles is exact over these loops
    if "pad" in names:
        sch.compute_at(pad, yo, preserve_unit_loops=True)
        sch.set_scope(pad, 0, SCOPE_AM)
    else:
        pad = sch.cache_read(conv, 0, SCOPE_AM)
        sch.compute_at(pad, yo, preserve_unit_loops=True)
    for b in epi:
        sch.reverse_compute_at(sch.get_sblock(b), yo)
    sch.reverse_compute_at(o, yo, preserve_unit_loops=True)
    yb, yr = sch.split(yi, [None, rb])
    sch.reorder(yb, xv, rc, yr, xl)
    blocks = reg_blocks(sch, conv, "conv2d", epi)  # plain conv: accumulate in registers, then store
    for b in blocks:
        sch.reverse_compute_at(b, xv)
    # created last to first: TVM puts each new copy at the root's front, so the weights are
    # fetched first, then the parameters in their order (as the stage copies are)
    reads = [("conv2d", 1)] + [(b, i) for b in epi for i in range(1, len(sch.get(sch.get_sblock(b)).reads))]
    wt = [sch.cache_read(sch.get_sblock(b), i, SCOPE_SM) for b, i in reversed(reads)][::-1]
    if not resident:
        for c in wt:
            sch.compute_at(c, yo, preserve_unit_loops=True)
    stage = sch.fuse(*items, yo)
    sch.annotate(stage, STAGE, 1)
    sch.annotate(stage, CORES, 1)
    sch.storage_align(pad, 0, 1, pitch, 0)
    sch.storage_align(blocks[-1], 0, 2, lanes, 0)  # the block storing the AM tile: rows at a vector pitch
    for c in [pad, o] + ([] if resident else wt):
        sch.annotate(sch.get_loops(c)[1], OP, DMA)
    if resident:
        for c in wt:
            sch.annotate(sch.get_loops(c)[0], OP, DMA)
    sch.annotate(gi, OP, GCONV)
    return sch


def scheduled(wl: Workload, target: Target, config: Mapping[str, Any], g, shares: list) -> Scheduled:
    """The grouped convolution's schedule for the backend's register-blocked convolution lowering
    (`lowering="gconv"`)."""
    m = machine(target)
    op = get_op(wl.op)
    planes = g.KP if g.kg <= g.KP else g.kpg
    knobs = (planes, g.rows, g.rb, g.resident, g.Wr, g.L)
    ddr = {nm: tuple(s) for nm, s, _ in op.inputs(wl)}
    ddr["out"] = (g.n, g.k, g.ho, g.wo)
    return stream.scheduled(
        "gconv", wl, config, m, ("gconv", wl.key_str(), getattr(target, "digest", target.name)) + knobs,
        lambda: gconv_schedule(wl, *knobs).mod, shares, g.key,
        {"layout_change": "none", "lane_use": round(g.wo / g.OW, 4), "groups": g.groups, "params": len(g.pnames),
         "lowering": "tir"}, ddr=ddr)

