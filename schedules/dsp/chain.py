"""dsp-sim template for element-wise ops: a chain of steps in one kernel, on the VPU.

Any op that declares a `chain` in the catalogue runs here (`chain_of`): relu, add, add_relu,
bias_add, batch_norm, bn_relu, hardswish are fixed chains, ew_chain spells its chain out (the steps:
`opcompiler.ops.steps`: relu, sigmoid, clip:LO:HI, affine:A:B, pow:P (x > 0), hardswish, add / mul
with a full-shape operand, bias / scale / bn with per-channel operands).

The kernel is a TVM schedule of the op's own TE compute (`chain_tir.py`), lowered by the DSP
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
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.steps import operand_kinds
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from .chain_tir import scheduled
from .common import refuse_invalid, require_fp32
from .stream import cdiv, cores_knob, share

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
    version = 2  # v2: lowered from the TVM schedule (chain_tir.py)

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
        items = g.items()
        return {"ddr_bytes": float((2 + g.nfull) * g.total * F32), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config.get("cores", m.cores), len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "steps": float(len(g.steps)),
                "lane_use": (g.hw / g.pitch) if g.mode == "plane" and g.pitch else
                (g.c / g.pitch if g.mode == "pixel" else 1.0)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`chain_tir.py`), lowered by the DSP backend."""
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = g.shares(int(config.get("cores", m.cores)), m.cores)  # cores with equal item keys time alike
        return scheduled(wl, target, config, g, shares)
