"""dsp-sim template for grouped and depthwise convolution (groups > 1), NCHW / OIHW (dispatched
to by `dsp.direct_conv2d`, whose K-on-the-lanes direct convolution needs every output channel to
read every input channel). `apply` is the TVM schedule of the op's own TE compute in
`grouped_tir.py`, lowered by the DSP backend (its `tir_gconv.py`); this module
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
(bias, BN scale/shift, ReLU) runs on the accumulators, which are stored to the AM output tile
and DMAed AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from .common import refuse_invalid
from .stream import cdiv, cores_knob, share

EPI = {"conv2d": (), "conv2d_bias": ("bias",), "conv2d_bias_relu": ("bias", "relu"), "conv2d_bn_relu": ("bn", "relu"),
       "conv2d_bn": ("bn",)}
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
        self.epi = EPI[wl.op]
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
        return self.rb + self.taps + X_REGS + len(self.pnames)


class DspGroupedConv(Template):
    """Grouped / depthwise NCHW convolution on the VPU (dispatched to by `dsp.direct_conv2d`)."""

    name = "dsp.grouped_conv2d"
    op_families = ("conv2d",)
    target_family = "dsp"
    version = 1

    def _check_wl(self, wl: Workload, target: Target) -> None:
        from .common import require_fp32
        require_fp32(wl, target)
        if wl.layout != "NCHW":
            raise OpcError("the dsp grouped / depthwise convolution is NCHW (output columns on the lanes)",
                           arg="layout", value=wl.layout, expected="NCHW (or groups=1)")
        if wl.op not in EPI:
            raise OpcError(f"no dsp grouped-conv lowering for {wl.op}", arg="op", value=wl.op, expected=", ".join(EPI))

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
        return {"ddr_bytes": float(ddr_in + ddr_w + ddr_out), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "sm_occupancy": g.sm_elems() * F32 / m.cap("SM"),
                "reg_occupancy": g.regs() / m.registers, "loads_per_fma": rows_loaded * g.S / (g.rb * g.taps),
                "lane_use": g.wo / g.OW}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """This config's TVM schedule (`grouped_tir.py`), lowered by the DSP backend."""
        from .grouped_tir import scheduled
        self._check_wl(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)
        return scheduled(wl, target, config, g, shares)
