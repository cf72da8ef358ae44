"""The VPE-vectorized direct convolution (seed 004 Algorithm 3, generalized) and the fully
connected layer (Algorithm 2, as a 1x1 convolution over rows): geometry, config, capacity check,
pass cost. The program itself is lowered from the TVM schedules (`tir_sched.py`; the
reduction-split FC: `ksplit.py`) by the dsp backend's `tir_lower.py` (and `tir_ksplit.py`).

Data stay NHWC / HWIO in DDR (the MiniGo layout); output channels K sit on the 32 vector
lanes (kv vectors per block; K = 2 or 1 leaves lanes idle), input scalars are loaded from SM
and broadcast, weights are vectors in AM. Work items are (image, block of `rows` output
rows); the batch (or the items) is split across the cores. Per item: DMA the input rows
DDR -> SM (zero rows and halo columns give the padding), run the VPU pass, DMA the output
tile AM -> DDR (or AM -> GSM -> DDR). Two orders of the VPU pass:

* `out` (output-stationary): register blocks of `pw` output pixels x `kv` vectors accumulate
  over R*S*C in registers; the fused epilogue (bias, BN, the residual, ReLU) runs on the
  registers. A residual (conv + eltwise fusion) is an output-shaped tensor whose tile is DMAed
  DDR -> AM with the stage's input rows and added after bias / BN, before ReLU.
* `ws` (the paper's Algorithm 3 as written): for each input channel c the R*S x kv weight
  vectors sit in registers and each output pixel's partial sums are read, updated and
  written back in AM; the epilogue is a separate element-wise pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


from opcompiler.backend.dsp.intrin import EPI_REGS, F32, DspMachine, MkCost, mk_ew, mk_out, mk_ws
from opcompiler.backend.dsp.intrin import sum_costs as _sum

from .common import capacity_why


@dataclass(frozen=True, kw_only=True)
class ConvSpec:
    """A direct convolution in NHWC/HWIO terms (a matmul is n=1, h=M, w=1, r=s=1)."""

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: int
    pad: int
    dil: int
    ho: int
    wo: int
    epi: tuple[str, ...]  # subset of ("bias", "bn", "res", "relu"), in order ("res": a residual tensor added)
    layout: str = "NHWC"  # of the op's own tensors; NCHW (and transposed matmul) are relaid by DMA
    kind: str = "conv2d"

    @property
    def taps(self) -> int:
        return self.r * self.s

    @property
    def flops(self) -> int:
        return 2 * self.n * self.ho * self.wo * self.k * self.c * self.taps


@dataclass(frozen=True, kw_only=True)
class DirectConfig:
    """The knobs of the direct-convolution schedule (see the template for their ranges)."""

    pw: int  # output pixels per register block
    kv: int  # vectors of output channels per block (kv * 32 channels)
    rows: int  # output rows per DMA stage
    cols: int  # output columns per DMA stage (the full width unless the input rows overflow SM)
    order: str  # "out" (output-stationary registers) | "ws" (the paper's weight-stationary pass)
    dbuf: int  # 1: two SM/AM tile buffers so DMA overlaps the VPU
    w_path: str  # "gsm": DDR -> GSM once, GSM -> AM per core | "ddr": each core DMAs from DDR
    #              | "host_copies": the host replicates W per core first (the paper's "8 copies of W")
    out_path: str  # "ddr": AM -> DDR | "gsm": AM -> GSM -> DDR (the paper's O_g)
    split: str  # "batch": whole images per core (paper) | "items": (image, row block) items per core

    @staticmethod
    def of(cfg: Mapping[str, Any]) -> "DirectConfig":
        return DirectConfig(**{k: cfg[k] for k in DirectConfig.__dataclass_fields__})


def in_rows(sp: ConvSpec, rows: int) -> int:
    return (rows - 1) * sp.stride + (sp.r - 1) * sp.dil + 1


def in_cols(sp: ConvSpec, cols: int) -> int:
    return (cols - 1) * sp.stride + (sp.s - 1) * sp.dil + 1


def footprint(m: DspMachine, sp: ConvSpec, cf: DirectConfig) -> dict[str, int]:
    """Bytes each level must hold (per core for AM/SM, cluster-wide for GSM), and registers."""
    kbp = cf.kv * m.lanes
    nbuf = 1 + cf.dbuf
    cols = min(cf.cols, sp.wo)
    npar = sum(EPI_REGS[e] for e in sp.epi)
    # the output tile, and the residual's tile of the same shape staged DDR -> AM per stage ("res")
    tiles = 2 if "res" in sp.epi else 1
    am = (sp.taps * sp.c * kbp + npar * kbp + tiles * nbuf * cf.rows * cols * kbp) * F32
    sm = nbuf * in_rows(sp, cf.rows) * in_cols(sp, cols) * sp.c * F32
    gsm = (sp.taps * sp.c * kbp * F32 if cf.w_path == "gsm" else 0) + (
        m.cores * nbuf * cf.rows * cols * kbp * F32 if cf.out_path == "gsm" else 0)
    if cf.order == "out":
        regs = cf.pw * cf.kv + npar * cf.kv + cf.kv + cf.pw
    else:
        regs = sp.taps * cf.kv + (sp.s - 1) * sp.r + cf.kv + sp.r
    return {"AM": am, "SM": sm, "GSM": gsm, "REG": regs}


def check(m: DspMachine, sp: ConvSpec, cf: DirectConfig) -> str | None:
    """Why this config cannot build (capacity), or None."""
    return capacity_why(m, footprint(m, sp, cf))


def pass_cost(m: DspMachine, sp: ConvSpec, cf: DirectConfig, npix: int, width: int | None = None
              ) -> tuple[MkCost, int]:
    """The VPU pass over one tile of `npix` output pixels in rows of `width`: (summed cost, calls)."""
    if cf.order == "out":
        steps = sp.taps * sp.c
        full, tail = divmod(npix, cf.pw)
        parts = [(mk_out(m, cf.pw, cf.kv, steps, sp.epi), full)]
        if tail:
            parts.append((mk_out(m, tail, cf.kv, steps, sp.epi), 1))
        return _sum(parts), full + (1 if tail else 0)
    wo = min(width or sp.wo, npix)
    parts = [(mk_ws(m, npix, cf.kv, sp.r, sp.s, wo, False), 1)]
    if sp.c > 1:
        parts.append((mk_ws(m, npix, cf.kv, sp.r, sp.s, wo, True), sp.c - 1))
    calls = sp.c
    if sp.epi:
        fm = sum(e in ("bias", "bn", "res") for e in sp.epi)
        parts.append((mk_ew(m, npix * cf.kv, 1 + int("res" in sp.epi), fm, int("relu" in sp.epi),
                            sum(EPI_REGS[e] for e in sp.epi)), 1))
        calls += 1
    return _sum(parts), calls
