"""Lowering of the VPE-vectorized direct convolution (seed 004 Algorithm 3, generalized) and of
the fully connected layer (Algorithm 2, as a 1x1 convolution over rows) to a DSP program.

Data stay NHWC / HWIO in DDR (the MiniGo layout); output channels K sit on the 32 vector
lanes (kv vectors per block; K = 2 or 1 leaves lanes idle), input scalars are loaded from SM
and broadcast, weights are vectors in AM. Work items are (image, block of `rows` output
rows); the batch (or the items) is split across the cores. Per item: DMA the input rows
DDR -> SM (zero rows and halo columns give the padding), run the VPU pass, DMA the output
tile AM -> DDR (or AM -> GSM -> DDR). Two orders of the VPU pass:

* `out` (output-stationary): register blocks of `pw` output pixels x `kv` vectors accumulate
  over R*S*C in registers; the fused epilogue (bias, BN, ReLU) runs on the registers.
* `ws` (the paper's Algorithm 3 as written): for each input channel c the R*S x kv weight
  vectors sit in registers and each output pixel's partial sums are read, updated and
  written back in AM; the epilogue is a separate element-wise pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from opcompiler.backend.dsp.core import EPI_REGS, MkCost, mk_ew, mk_out, mk_ws
from opcompiler.backend.dsp.core import sum_costs as _sum
from opcompiler.backend.dsp.machine import DspMachine
from opcompiler.backend.dsp.program import F32, Allocator, Op, View, dma_op, stage_order


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
    epi: tuple[str, ...]  # subset of ("bias", "bn", "relu"), in order
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
    am = (sp.taps * sp.c * kbp + npar * kbp + nbuf * cf.rows * cols * kbp) * F32
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
    fp = footprint(m, sp, cf)
    for lv in ("AM", "SM", "GSM"):
        if fp[lv] > m.cap(lv):
            return f"{lv} needs {fp[lv]} B > {m.cap(lv)} B"
    if fp["REG"] > m.registers:
        return f"register block needs {fp['REG']} vector registers > {m.registers}"
    return None


def _items(sp: ConvSpec, cf: DirectConfig, cores: int) -> list[list[tuple[int, ...]]]:
    """(image, first output row, rows, first output column, columns) per core, consecutive in
    (image, row block, column block) order."""
    cols = min(cf.cols, sp.wo)
    pat = [(o, min(cf.rows, sp.ho - o), q, min(cols, sp.wo - q)) for o in range(0, sp.ho, cf.rows)
           for q in range(0, sp.wo, cols)]
    if cf.split == "batch":
        per = [range(c * sp.n // cores, (c + 1) * sp.n // cores) for c in range(cores)]
        return [[(n, *t) for n in imgs for t in pat] for imgs in per]
    allb = [(n, *t) for n in range(sp.n) for t in pat]
    return [allb[c * len(allb) // cores:(c + 1) * len(allb) // cores] for c in range(cores)]




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
        fm = sum(e in ("bias", "bn") for e in sp.epi)
        parts.append((mk_ew(m, npix * cf.kv, 1, fm, int("relu" in sp.epi), sum(EPI_REGS[e] for e in sp.epi)), 1))
        calls += 1
    return _sum(parts), calls




class _Lowering:
    """Builds one core's op list. Views address the flat memories in fp32 elements."""

    def __init__(self, m: DspMachine, sp: ConvSpec, cf: DirectConfig, names: dict[str, str], functional: bool):
        self.m, self.sp, self.cf, self.names, self.fn = m, sp, cf, names, functional
        self.kbp = cf.kv * m.lanes
        self.nbuf = 1 + cf.dbuf
        self.pass_cache: dict[int, tuple[MkCost, int]] = {}
        # timing mode: a stage's ops depend on addresses only through values the timing ignores,
        # so stages of the same kind share their (read-only) Op objects
        self.stage_cache: dict[tuple, tuple] = {}

    def core_ops(self, core: int, items: list[tuple[int, int, int]], gsm_w: int, gsm_out: int) -> list[Op]:
        m, sp, cf, kbp = self.m, self.sp, self.cf, self.kbp
        am, smem = Allocator("AM", m.cap("AM"), 128), Allocator("SM", m.cap("SM"), 8)
        w_am = am.alloc("weights W_a", sp.taps * sp.c * kbp)
        par_am = {e: am.alloc(f"{e} vectors", EPI_REGS[e] * kbp) for e in sp.epi if EPI_REGS[e]}
        cols = min(cf.cols, sp.wo)
        out_am = [am.alloc(f"output tile O_a[{b}]", cf.rows * cols * kbp) for b in range(self.nbuf)]
        in_sm = [smem.alloc(f"input tile I_s[{b}]", in_rows(sp, cf.rows) * in_cols(sp, cols) * sp.c)
                 for b in range(self.nbuf)]
        ops: list[Op] = []
        nk = -(-sp.k // kbp)
        halo_done: set[int] = set()
        wname = self.names["weight"]
        if cf.w_path == "host_copies":
            wname = f"{wname}@core{core}"
        for kb in range(nk):
            k0 = kb * kbp
            ke = min(kbp, sp.k - k0)
            # weights of this block of output channels -> AM (via GSM when w_path == "gsm")
            wsrc = View(("DDR", wname), k0, (sp.taps * sp.c, ke), (sp.k, 1))
            wdst = View(("AM",), w_am, (sp.taps * sp.c, ke), (kbp, 1))
            if cf.w_path == "gsm":
                # every core brings its slice of W_g from DDR (parallel DMA), then all read it whole
                rows_w = sp.taps * sp.c
                a, b = core * rows_w // m.cores, (core + 1) * rows_w // m.cores
                if b > a:
                    ops.append(dma_op(m, View(("DDR", wname), a * sp.k + k0, (b - a, ke), (sp.k, 1)),
                                      View(("GSM",), gsm_w + a * kbp, (b - a, ke), (kbp, 1)), (), ("gsm_w",), self.fn,
                                      "W slice DDR->GSM"))
                gview = View(("GSM",), gsm_w, (rows_w, ke), (kbp, 1))
                ops.append(Op("barrier", "sync", label="W in GSM"))
                ops.append(dma_op(m, gview, wdst, (), ("w",), self.fn, "W GSM->AM"))
                if nk > 1:  # W_g is overwritten with the next block only after every core read it
                    ops.append(Op("barrier", "sync", label="W_g read"))
            else:
                ops.append(dma_op(m, wsrc, wdst, (), ("w",), self.fn, "W DDR->AM"))
            for e, off in par_am.items():
                for j, pname in enumerate(self.names[e].split(",")):
                    ops.append(dma_op(m, View(("DDR", pname), k0, (ke,), (1,)),
                                      View(("AM",), off + j * kbp, (ke,), (1,)), (), ("w",), self.fn, f"{e} -> AM"))
            stage = [self._stage(i, it, k0, ke, in_sm, out_am, w_am, par_am, gsm_out, halo_done)
                     for i, it in enumerate(items)]
            # software-pipelined issue order: with two buffers the next tile's DMA-in is issued
            # before this tile's VPU pass, so the DMA engine fetches while the VPU computes
            per_image = -(-sp.ho // cf.rows) * -(-sp.wo // min(cf.cols, sp.wo))
            ops += stage_order(stage, bool(cf.dbuf), self.fn, per_image)
        return ops

    def _stage(self, i, it, k0, ke, in_sm, out_am, w_am, par_am, gsm_out, halo_done):
        if self.fn:
            return self._build_stage(i, it, k0, ke, in_sm, out_am, w_am, par_am, gsm_out, halo_done)
        sp = self.sp
        _, oh0, nr, ow0, nc = it
        slot = i % self.nbuf
        ih0, iw0 = oh0 * sp.stride - sp.pad, ow0 * sp.stride - sp.pad
        key = (slot, slot in halo_done, nr, nc, max(0, -ih0), max(0, ih0 + in_rows(sp, nr) - sp.h),
               max(0, -iw0), max(0, iw0 + in_cols(sp, nc) - sp.w), ke)
        if key not in self.stage_cache:
            self.stage_cache[key] = self._build_stage(i, it, k0, ke, in_sm, out_am, w_am, par_am, gsm_out, halo_done)
        halo_done.add(slot)
        return self.stage_cache[key]

    def _build_stage(self, i, it, k0, ke, in_sm, out_am, w_am, par_am, gsm_out, halo_done):
        m, sp, cf, kbp, fn = self.m, self.sp, self.cf, self.kbp, self.fn
        n, oh0, nr, ow0, nc = it
        slot = i % self.nbuf
        icw = in_cols(sp, min(cf.cols, sp.wo))  # SM tile row width (allocated for full tiles)
        ir, ic = in_rows(sp, nr), in_cols(sp, nc)
        ih0, iw0 = oh0 * sp.stride - sp.pad, ow0 * sp.stride - sp.pad
        lo, hi = max(0, ih0), min(sp.h, ih0 + ir)
        clo, chi = max(0, iw0), min(sp.w, iw0 + ic)
        sm_tag, am_tag = f"sm{slot}", f"amo{slot}"
        base = in_sm[slot]
        ins: list[Op] = []
        zero_views = []

        def region(r0: int, nrows: int, c0: int, ncols: int) -> View:
            return View(("SM",), base + (r0 * icw + c0) * sp.c, (nrows, ncols, sp.c), (icw * sp.c, sp.c, 1))

        # padding: tile rows / columns outside the image are zeros; with a single column tile the
        # side columns of a buffer are never overwritten, so they are zeroed once per buffer
        one_col_tile = min(cf.cols, sp.wo) >= sp.wo
        if not (one_col_tile and slot in halo_done):
            if one_col_tile:
                halo_done.add(slot)
            rows_all = in_rows(sp, cf.rows) if one_col_tile else hi - lo
            r_first = 0 if one_col_tile else lo - ih0
            if clo - iw0 > 0 and rows_all > 0:
                zero_views.append(region(r_first, rows_all, 0, clo - iw0))
            if iw0 + ic - chi > 0 and rows_all > 0:
                zero_views.append(region(r_first, rows_all, chi - iw0, iw0 + ic - chi))
        if lo - ih0 > 0:
            zero_views.append(region(0, lo - ih0, 0, ic))
        if ih0 + ir - hi > 0:
            zero_views.append(region(hi - ih0, ih0 + ir - hi, 0, ic))
        if zero_views:
            nz = sum(v.size for v in zero_views)
            # zeroing SM is scalar stores at the SM port width
            cyc = -(-nz * F32 // (m.sld_per_cycle * 8))
            f = (lambda mem, vs=tuple(zero_views): [mem.view(v).fill(0.0) for v in vs]) if fn else None
            ins.append(Op("fill", "vpu", cycles=cyc, writes=(sm_tag,), fn=f, label="zero padding"))
        if hi > lo and chi > clo:
            src = View(("DDR", self.names["data"]), ((n * sp.h + lo) * sp.w + clo) * sp.c, (hi - lo, (chi - clo) * sp.c),
                       (sp.w * sp.c, 1))
            dst = View(("SM",), base + ((lo - ih0) * icw + (clo - iw0)) * sp.c, (hi - lo, (chi - clo) * sp.c),
                       (icw * sp.c, 1))
            ins.append(dma_op(m, src, dst, (), (sm_tag,), fn, "I DDR->SM"))
        npix = nr * nc
        if (npix, nc) not in self.pass_cache:
            self.pass_cache[(npix, nc)] = pass_cost(m, sp, cf, npix, nc)
        cost, calls = self.pass_cache[(npix, nc)]
        f = self._compute_fn(base, w_am, par_am, out_am[slot], nr, nc, icw) if fn else None
        comp = [Op("vpu", "vpu", cycles=cost.cycles, reads=(sm_tag, "w"), writes=(am_tag,), cost=cost, nruns=calls,
                   fn=f, label=f"VPU pass {cf.order} {npix} px")]
        o_src = View(("AM",), out_am[slot], (nr, nc, ke), (nc * kbp, kbp, 1))
        o_dst = View(("DDR", self.names["out"]), ((n * sp.ho + oh0) * sp.wo + ow0) * sp.k + k0, (nr, nc, ke),
                     (sp.wo * sp.k, sp.k, 1))
        if cf.out_path == "gsm":
            g = View(("GSM",), gsm_out + slot * cf.rows * min(cf.cols, sp.wo) * kbp, (nr, nc, ke), (nc * ke, ke, 1))
            outs = [dma_op(m, o_src, g, (am_tag,), (f"gsmo{slot}",), fn, "O AM->GSM"),
                    dma_op(m, g, o_dst, (f"gsmo{slot}",), ("out",), fn, "O GSM->DDR")]
        else:
            outs = [dma_op(m, o_src, o_dst, (am_tag,), ("out",), fn, "O AM->DDR")]
        return ins, comp, outs

    def _compute_fn(self, sm_off: int, w_off: int, par_am: dict[str, int], out_off: int, nr: int, nc: int,
                    icw: int):
        sp, kbp = self.sp, self.kbp
        ir, ic = in_rows(sp, nr), in_cols(sp, nc)
        x_v = View(("SM",), sm_off, (ir, ic, sp.c), (icw * sp.c, sp.c, 1))
        w_v = View(("AM",), w_off, (sp.r, sp.s, sp.c, kbp), (sp.s * sp.c * kbp, sp.c * kbp, kbp, 1))
        o_v = View(("AM",), out_off, (nr, nc, kbp), (nc * kbp, kbp, 1))
        st, dl = sp.stride, sp.dil
        epi, pw, npix = sp.epi, self.cf.pw, nr * nc
        pix_r, pix_c = np.divmod(np.arange(npix), nc)

        def epilogue(mem, acc: np.ndarray) -> None:
            for e in epi:
                if e == "bias":
                    acc += mem.view(View(("AM",), par_am["bias"], (kbp,), (1,)))
                elif e == "bn":
                    acc *= mem.view(View(("AM",), par_am["bn"], (kbp,), (1,)))
                    acc += mem.view(View(("AM",), par_am["bn"] + kbp, (kbp,), (1,)))
                elif e == "relu":
                    np.maximum(acc, 0, out=acc)

        def run_out(mem) -> int:
            """Register blocks of pw output pixels (the last one the tail), each accumulating over
            R x S x C from the SM tile and the AM weights, epilogue in registers, stored to AM."""
            x, wt, out = mem.view(x_v), mem.view(w_v), mem.view(o_v)
            calls = 0
            with np.errstate(invalid="ignore"):  # idle lanes hold garbage; they are never stored
                for b0 in range(0, npix, pw):
                    rr, cc = pix_r[b0:b0 + pw], pix_c[b0:b0 + pw]
                    acc = np.zeros((len(rr), kbp), np.float32)
                    for r in range(sp.r):
                        for s in range(sp.s):
                            acc += x[rr * st + r * dl, cc * st + s * dl, :] @ wt[r, s]
                    epilogue(mem, acc)
                    out[rr, cc] = acc
                    calls += 1
            return calls

        def run_ws(mem) -> int:
            """The paper's pass: per input channel, every pixel's partial sums are read from AM
            (zero for the first channel), updated with the R x S taps, written back."""
            x, wt, out = mem.view(x_v), mem.view(w_v), mem.view(o_v)
            calls = 0
            with np.errstate(invalid="ignore"):
                for c in range(sp.c):
                    part = np.zeros((npix, kbp), np.float32) if c == 0 else out[pix_r, pix_c]
                    for r in range(sp.r):
                        for s in range(sp.s):
                            part += x[pix_r * st + r * dl, pix_c * st + s * dl, c][:, None] * wt[r, s, c][None, :]
                    out[pix_r, pix_c] = part
                    calls += 1
                if epi:
                    acc = out[pix_r, pix_c]
                    epilogue(mem, acc)
                    out[pix_r, pix_c] = acc
                    calls += 1
            return calls

        return run_out if self.cf.order == "out" else run_ws
