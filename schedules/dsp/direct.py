"""The VPE-vectorized direct convolution (seed 004 Algorithm 3, generalized) and the fully
connected layer (Algorithm 2, as a 1x1 convolution over rows): geometry, config, capacity check,
pass cost, the TVM schedule (`conv_schedule`, `fc_schedule`) and the templates' shared base
(`DirectTemplate`). The program is lowered from the TVM schedules (the reduction-split FC:
`ksplit.py`) by the dsp backend's `tir_lower.py` (and `tir_ksplit.py`).

Data stay NHWC / HWIO in DDR (the MiniGo layout); output channels K sit on the 32 vector
lanes (kv vectors per block; K = 2 or 1 leaves lanes idle), input scalars are loaded from SM
and broadcast, weights are vectors in AM. Work items are (image, block of `rows` output
rows); the batch (or the items) is split across the cores. Per item: DMA the input rows
DDR -> SM (zero rows and halo columns give the padding), run the VPU pass, DMA the output
tile AM -> DDR (or AM -> GSM -> DDR). Two orders of the VPU pass:

* `out` (output-stationary): register blocks of `pw` output pixels x `kv` vectors accumulate
  over R*S*C in registers; the fused epilogue (bias, BN, the residual, ReLU or HardSwish) runs on the
  registers. A residual (conv + eltwise fusion) is an output-shaped tensor whose tile is DMAed
  DDR -> AM with the stage's input rows and added after bias / BN, before ReLU.
* `ws` (the paper's Algorithm 3 as written): for each input channel c the R*S x kv weight
  vectors sit in registers and each output pixel's partial sums are read, updated and
  written back in AM; the epilogue is a separate element-wise pass.

The schedule (`conv_schedule`): the direct convolution as the TVM schedule the simulator executes,
built over the op's own TE compute (conv2d, conv2d_bias_relu, conv2d_bn_relu in NHWC terms) with
the knobs, geometry and capacity check above:

    ko (kv*32 output channels) -> weights and epilogue vectors cache_read into local.AM
      item (image, row block, column block), split across the cores
        pad block (zero padding + input rows) computed here in local.SM
        (conv + eltwise) the residual's tile cached here in local.AM, DMAed beside the input rows
        yi, xo_blk (register blocks of pw pixels within an output row)
          conv2d reduction into local.REG (registers), then the epilogue blocks
          (bias / batch_norm in local.REG, the residual's vadd, ReLU or HardSwish: its blocks inlined
          into its last, `common.inline_hswish`) writing the output tile in local.AM
        output tile local.AM -> DDR (the cache_write block)

Loops carry `opc.dsp.*` annotations that say what each nest is on the chip: `dma` (one
descriptor per execution of the nest), `mk` (each iteration is one micro-kernel call),
`dma_shared` (a copy into GSM whose outer loop is split across the cores, then a barrier),
`stage` (each iteration is one DMA-in / VPU / DMA-out stage, double-buffered when `dbuf`),
`cores` (iterations split across the cores). `scheduled` hands the module to the backend
(`lowering="direct"`), whose Lowerer turns it into the DSP program.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opcompiler.backend.dsp.intrin import (
    CORES, DMA, DMA_SHARED, EPI_BLOCKS, EPI_REGS, EPI_TEMPS, F32, MK, MK_EW, MK_WS, OP, SCOPE_AM, SCOPE_GSM, SCOPE_REG,
    SCOPE_SM, STAGE, DspMachine, MkCost, machine, mk_ew, mk_out, mk_ws,
)
from opcompiler.backend.dsp.intrin import sum_costs as _sum
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, op_prim_func, workload
from opcompiler.target import Target
from opcompiler.template_base import Scheduled, Template
from opcompiler.workload import Workload

from .common import capacity_why, compacted, copy_loop, inline_hswish, matmul_schedule, placement, reg_blocks


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
    epi: tuple[str, ...]  # subset of ("bias", "bn", "res", "relu", "hswish"), in order ("res": a residual tensor added)
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
    temps = sum(EPI_TEMPS[e] for e in sp.epi)  # HardSwish's temporary register
    if cf.order == "out":  # the epilogue's temporaries take the registers the steps' weights and inputs free
        regs = cf.pw * cf.kv + npar * cf.kv + max(cf.kv + cf.pw, temps)
    else:  # (the epilogue pass's registers, temporaries included, are `mk_ew`'s to check: a handful)
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
                            sum(EPI_REGS[e] for e in sp.epi), int("hswish" in sp.epi)), 1))
        calls += 1
    return _sum(parts), calls


def nhwc_workload(wl: Workload) -> Workload:
    """The op in NHWC (an NCHW op is relaid by DMA before / after, as in the direct path)."""
    p = dict(wl.params)
    p["layout"] = "NHWC"
    return workload(wl.op, p, dtype=wl.dtype)


_STAGED: dict[tuple, tuple] = {}  # (workload, staging knobs) -> the schedule up to its register blocks


def conv_schedule(wl: Workload, target: Target, config: Mapping[str, Any]):
    """The scheduled, annotated s_tir.Schedule of one direct-convolution config: a copy of the
    staged schedule every config with its (order, kv, rows, cols, split, out_path) shares
    (`_out_staged` / `_ws_staged`, cached: the splits and compute_at's there are most of the
    scheduling time), then the register-block split (`pw`, order=out) and the weights' path
    (`w_path`)."""
    if get_op(wl.op).family == "matmul":
        return fc_schedule(wl, target, config)
    key = (wl.op, tuple(sorted(wl.params)), wl.dtype, getattr(target, "digest", target.name),
           *(config[k] for k in ("order", "kv", "rows", "cols", "split", "out_path")))
    if key not in _STAGED:
        if len(_STAGED) >= 64:  # each holds a whole schedule state; the oldest goes first
            _STAGED.pop(next(iter(_STAGED)))
        _STAGED[key] = (_ws_staged if config["order"] == "ws" else _out_staged)(wl, target, config)
    base, conv, ko, pixels, epi = _STAGED[key]
    sch = base.copy()  # the copy keeps the random variables (blocks, loops) valid
    if pixels is not None:
        blk, _ = sch.split(pixels, [None, config["pw"]])  # register blocks of pw pixels of the flattened tile
        sch.annotate(blk, OP, MK)
    _weights(sch, conv, ko, config, epi)
    return sch


def _begin(wl: Workload, config: Mapping[str, Any]):
    """A fresh schedule of the op in NHWC: (schedule, the NHWC params, block names, epilogue block
    names, the conv block, the block writing the output, output columns per stage)."""
    import tvm

    base = nhwc_workload(wl)
    sch = tvm.s_tir.Schedule(op_prim_func(base))
    names = inline_hswish(sch, [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))])
    epi = [b for b in names if b in EPI_BLOCKS]
    conv = sch.get_sblock("conv2d")
    last = sch.get_sblock(epi[-1]) if epi else conv
    p = base.p
    wo = (p["w"] + 2 * p["pad"] - p["dilation"] * (p["s"] - 1) - 1) // p["stride"] + 1
    return sch, p, names, epi, conv, last, min(config["cols"], wo)


def _stage_copies(sch, config: Mapping[str, Any], epi: list[str], item, pad, o) -> None:
    """The stage's copies, both orders alike: the output tile's write-back at the stage loop `item`
    (through a GSM staging tile with out_path=gsm, as the paper), the residual's tile, and the DMA
    annotations of the write-back and of the input tile `pad`."""
    sch.reverse_compute_at(o, item)
    depth = 2 if config["split"] == "items" else 3
    _residual(sch, epi, item, depth)
    if config["out_path"] == "gsm":  # the tile AM -> GSM (this core's staging tile) -> DDR, as the paper
        g = sch.cache_write(o, 0, SCOPE_GSM)
        sch.reverse_compute_at(g, item)
        sch.annotate(copy_loop(sch, g, depth), OP, DMA)
    sch.annotate(copy_loop(sch, o, depth), OP, DMA)
    sch.annotate(copy_loop(sch, pad, depth), OP, DMA)


def _out_staged(wl: Workload, target: Target, config: Mapping[str, Any]):
    """order=out up to the register blocks: (schedule, conv block, channel-block loop, the tile's
    flattened pixel loop, epilogue block names)."""
    sch, p, names, epi, conv, last, cols = _begin(wl, config)
    lanes = machine(target).lanes
    ko, _, yi, xi, item, pad, o = _tiles(sch, conv, last, names, config, cols, lanes, ws=False)
    epi_blocks = reg_blocks(sch, conv, "conv2d", epi)  # plain conv: accumulate in registers, then store
    pixels = sch.fuse(yi, xi)  # the tile's pixels, row-major: register blocks may span rows
    for b in epi_blocks:  # per output pixel, right after its reduction (exact regions)
        sch.reverse_compute_at(b, pixels)
    _stage_copies(sch, config, epi, item, pad, o)
    return sch, conv, ko, pixels, epi


def _residual(sch, epi: list[str], item, depth: int) -> None:
    """conv + eltwise: the residual tensor the `vadd` epilogue block reads, cached into a
    local.AM tile at the stage loop (the item's rows x columns x kv*32 channels, double-buffered
    with the stage's other tiles) and copied DDR -> AM by one DMA per stage, beside the input rows."""
    if "vadd" not in epi:
        return
    blk = sch.get_sblock("vadd")
    # the residual is the read that is not the previous epilogue step's result (in registers)
    idx = next(i for i, r in enumerate(sch.get(blk).reads)
               if (r.source if hasattr(r, "source") else r.buffer).scope() != SCOPE_REG)
    r = sch.cache_read(blk, idx, SCOPE_AM)
    sch.compute_at(r, item)
    sch.annotate(copy_loop(sch, r, depth), OP, DMA)


def _tiles(sch, conv, last, names: list[str], config: Mapping[str, Any], cols: int, lanes: int, ws: bool):
    """The staging both conv orders share: output channels split by kv x 32 lanes, (image, row
    block, column block) items (the stage loop, split across the cores), the padded input tile
    of an item in SM, the output tile in AM. `ws` puts the input-channel loop outside the tile's
    pixels. Returns (channel-block loop, input-channel loop, row loop, column loop, item loop, pad
    block, output copy)."""
    n, y, x, kk, ry, rx, rc = sch.get_loops(conv)
    yo, yi = sch.split(y, [None, config["rows"]])
    xo, xi = sch.split(x, [None, cols])
    ko, ki = sch.split(kk, [None, config["kv"] * lanes])
    if ws:
        sch.reorder(ko, n, yo, xo, rc, yi, xi, ki, ry, rx)
    else:
        sch.reorder(ko, n, yo, xo, yi, xi, ki, ry, rx, rc)
    if config["split"] == "batch":
        item = sch.fuse(yo, xo)
        sch.annotate(n, CORES, 1)
    else:
        item = sch.fuse(n, yo, xo)
        sch.annotate(item, CORES, 1)
    sch.annotate(item, STAGE, 1)
    # the padded input tile of this item: zero fill + DMA into SM (region fixed before the
    # register-block split so it is exactly the tile's rows and columns)
    if "pad" in names:
        pad = sch.get_sblock("pad")
        sch.compute_at(pad, item)
        sch.set_scope(pad, 0, SCOPE_SM)
    else:
        pad = sch.cache_read(conv, 0, SCOPE_SM)
        sch.compute_at(pad, item)
    o = sch.cache_write(last, 0, SCOPE_AM)  # the output tile; `o` is its AM -> DDR copy
    return ko, rc, yi, xi, item, pad, o


def _ws_staged(wl: Workload, target: Target, config: Mapping[str, Any]):
    """Seed 004's weight-stationary pass (order=ws), all but the weights' path: per tile, one
    micro-kernel call per input channel (`opc.dsp.op = mk_ws`: the channel's R*S x kv weight
    vectors stay in registers while every pixel of the tile accumulates into its partial sums in
    the AM output tile), then one element-wise call applying the epilogue (`mk_ew`). Staging as
    order=out; there are no register blocks (`pw` plays no part). Returns what `_out_staged` does,
    the pixel loop None."""
    sch, p, names, epi, conv, last, cols = _begin(wl, config)
    ko, rc, yi, xi, item, pad, o = _tiles(sch, conv, last, names, config, cols, machine(target).lanes, ws=True)
    if epi:
        sch.set_scope(conv, 0, SCOPE_AM)  # partial sums across the channel passes
        for b in epi[:-1]:
            sch.set_scope(sch.get_sblock(b), 0, SCOPE_REG)
    sch.fuse(yi, xi)  # the tile's pixels, row-major
    sch.annotate(rc, OP, MK_WS)
    sch.annotate(rc, "opc.dsp.ws_cols", cols)
    sch.annotate(rc, "opc.dsp.ws_r", p["r"])
    sch.annotate(rc, "opc.dsp.ws_s", p["s"])
    if epi:  # one element-wise call over the tile: every epilogue step per pixel
        first = sch.get_sblock(epi[0])
        sch.reverse_compute_at(first, item)
        lp = sch.get_loops(first)
        at = next(i for i, lv in enumerate(lp) if sch.get(lv).same_as(sch.get(item)))
        # the tile's rows and columns (the lanes stay inside); TVM leaves out a loop of one
        # iteration: the lanes' with one output channel (K = 1), the rows' or columns' of a tile
        # one pixel high or wide
        lane = min(p["k"], config["kv"] * machine(target).lanes) > 1
        inner = lp[at + 1:len(lp) - lane]
        pix = (sch.fuse(*inner) if len(inner) > 1 else inner[0] if inner
               else sch.add_unit_loop(lp[-1] if lane else first))
        for b in epi[1:]:
            sch.reverse_compute_at(sch.get_sblock(b), pix)
        sch.annotate(pix, OP, MK_EW)
    _stage_copies(sch, config, epi, item, pad, o)
    return sch, conv, ko, None, epi


def _weights(sch, red, ko, config, epi: list[str]) -> None:
    """Weights into local.AM at the channel-block loop (through local.GSM with w_path=gsm), and
    the epilogue's per-channel vectors (bias; BN scale and shift)."""
    wg = sch.cache_read(red, 1, SCOPE_GSM) if config["w_path"] == "gsm" else None
    w = sch.cache_read(red, 1, SCOPE_AM)
    sch.compute_at(w, ko)
    # one weight element (one reduction row of one output channel: K = N = 1 of a matmul, C*R*S =
    # K = 1 of a conv): TVM leaves no loop of the copy under `ko`; `copy_loop` gives it a unit one
    sch.annotate(copy_loop(sch, w, 1), OP, DMA)
    if wg is not None:  # W_g: each core brings a slice of the rows, then all read it whole
        sch.compute_at(wg, ko)
        inner = sch.get_loops(wg)[1:] or [sch.add_unit_loop(wg)]
        # the innermost loop runs over the lanes of a weight row, unless the block has one output
        # channel (K = 1: TVM drops that unit loop and the rows are all that is left)
        reg = sch.get(red).reads[1]
        one_lane = int((reg.source if hasattr(reg, "source") else reg.buffer).shape[-1]) == 1
        lps = inner if one_lane or len(inner) == 1 else inner[:-1]
        rows = sch.fuse(*lps) if len(lps) > 1 else lps[0]
        sch.annotate(rows, OP, DMA_SHARED)
    for b in epi:
        if b == "vadd":  # the residual is a tile per stage (`_residual`), not a per-channel vector
            continue
        blk_rv = sch.get_sblock(b)
        for i in range(1, len(sch.get(blk_rv).reads)):
            c = sch.cache_read(blk_rv, i, SCOPE_AM)
            sch.compute_at(c, ko)
            lps = sch.get_loops(c)
            # one output feature (K = 1): TVM leaves no loop of the vector's copy; give it a unit one
            sch.annotate(lps[1] if len(lps) > 1 else sch.add_unit_loop(c), OP, DMA)


def fc_schedule(wl: Workload, target: Target, config: Mapping[str, Any]):
    """The fully connected layer (matmul, matmul_bias_relu) as the direct path treats it: row
    blocks of A (items across the cores) staged in local.SM, B's output-feature blocks in
    local.AM, register blocks of pw rows accumulating over K, the output tile in local.AM."""
    if config.get("split") == "k":  # the reduction split is its own schedule (`ksplit.py`)
        raise OpcError("this schedule covers split=items of the fully connected layer", arg="--config",
                       value=dict(config), expected="split=items")
    sch, epi, mm, last = matmul_schedule(wl)
    i, j, k = sch.get_loops(mm)
    io, ii = sch.split(i, [None, config["rows"]])
    jo, ji = sch.split(j, [None, config["kv"] * machine(target).lanes])
    sch.reorder(jo, io, ii, ji, k)
    sch.annotate(io, CORES, 1)
    sch.annotate(io, STAGE, 1)
    a = sch.cache_read(mm, 0, SCOPE_SM)
    sch.compute_at(a, io)
    o = sch.cache_write(last, 0, SCOPE_AM)
    epi_blocks = reg_blocks(sch, mm, "matmul", epi)
    for b in epi_blocks:
        sch.reverse_compute_at(b, ii)
    sch.reverse_compute_at(o, io)
    if config["out_path"] == "gsm":  # the output tile AM -> GSM (this core's staging tile) -> DDR
        g = sch.cache_write(o, 0, SCOPE_GSM)
        sch.reverse_compute_at(g, io)
        sch.annotate(copy_loop(sch, g, 2), OP, DMA)
    sch.annotate(copy_loop(sch, o, 2), OP, DMA)
    sch.annotate(copy_loop(sch, a, 2), OP, DMA)
    blk, _ = sch.split(ii, [None, config["pw"]])
    sch.annotate(blk, OP, MK)
    _weights(sch, mm, jo, config, epi)
    return sch



_FUNCS: dict[tuple, Any] = {}  # schedule key -> the compacted function: schedule once per process


def schedule_key(wl: Workload, target: Target, config: Mapping[str, Any]) -> tuple:
    """What the scheduled module of a config depends on (order=ws has no register blocks: its
    `pw` makes no other module)."""
    return ("direct", wl.op, tuple(sorted(wl.params)), getattr(target, "digest", target.name),
            tuple((k, config[k]) for k in ("pw", "kv", "rows", "cols", "order", "w_path", "out_path", "split")
                  if k != "pw" or config.get("order") != "ws"))


def compacted_func(wl: Workload, target: Target, config: Mapping[str, Any]):
    """The scheduled function of this config with its tiles compacted by TVM (cached per process)."""
    key = schedule_key(wl, target, config)
    if key not in _FUNCS:
        if len(_FUNCS) >= 256:  # a tuning run sees many configs; keep the cache bounded
            _FUNCS.clear()
        _FUNCS[key] = compacted(conv_schedule(wl, target, config))
    return _FUNCS[key]


def tiles_fit(wl: Workload, target: Target, config: Mapping[str, Any]) -> bool:
    """Whether the tiles as TVM compacted them fit SM, AM and GSM when placed as the lowering
    places them (`placement`). TVM compacts a staged tile to the region its loops can touch,
    which with a row split that does not divide the output can exceed the tile `check` counts."""
    m = machine(target)
    return all(need <= m.cap(lv) for lv, need in placement(m, compacted_func(wl, target, config),
                                                           bool(config["dbuf"])).items())


def scheduled(tmpl, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
    """The direct route's scheduled module (`lowering="direct"`) and what lowering it needs: the
    DDR tensors (NCHW relaid to NHWC by the cores before / after), the items' shares of the
    cores, the weights' path."""
    m = machine(target)
    sp = tmpl.spec(wl, target)
    op = get_op(wl.op)
    in_specs = op.inputs(wl)
    names, ddr, pre, post, out_shape = tmpl.tensors(wl, sp)
    args: dict = {0: names["data"], 1: names["weight"], -1: names["out"]}
    if "residual" in names:  # NCHW: the residual relaid to NHWC first
        args["residual"] = names["residual"]
    kbp = config["kv"] * m.lanes
    nk = -(-sp.k // kbp)
    cols = min(config["cols"], sp.wo)
    per_image = -(-sp.ho // config["rows"]) * -(-sp.wo // cols)
    nitems = sp.n * per_image if config["split"] == "items" else sp.n

    def share(c: int) -> tuple[int, int]:
        return c * nitems // m.cores, (c + 1) * nitems // m.cores

    def key(c: int):
        # a core's ops depend (for timing) on where its range starts and its length; the last
        # term mirrors the direct path's grouping (its W slices) so both are timed alike
        a, b = share(c)
        rows_w = sp.taps * sp.c
        return (a % per_image if config["split"] == "items" else 0, b - a,
                (c + 1) * rows_w // m.cores - c * rows_w // m.cores)

    cfg = dict(config)
    return Scheduled(
        "direct", key=schedule_key(wl, target, cfg),
        module=lambda: _as_module(compacted_func(wl, target, cfg)),
        params={"inputs": tuple((n, tuple(s)) for n, s, _ in in_specs), "ddr": ddr, "out_shape": out_shape,
                "args": args, "pre": tuple(pre), "post": tuple(post), "kv": cfg["kv"], "dbuf": bool(cfg["dbuf"]),
                "gsm_reread": nk > 1, "per_image": per_image,
                "replicate": names["weight"] if cfg["w_path"] == "host_copies" else None,
                "group_keys": tuple(key(c) for c in range(m.cores)),
                "cores_used": sum(1 for c in range(m.cores) if share(c)[1] > share(c)[0])},
        flops=op.flops(wl),
        info={"layout_change": "by DMA on the cores (counted): " + ", ".join(f"{r[0]}->{r[1]}" for r in pre + post)
              if pre or post else "none", "lane_use": round(sp.k / (nk * kbp), 4), "lowering": "tir"})


def _as_module(func):
    import tvm

    return tvm.IRModule({"main": func})


class DirectTemplate(Template):
    """Shared by the direct-convolution and fully-connected templates: knobs, checks, lowering."""

    target_family = "dsp"

    def spec(self, wl: Workload, target: Target) -> ConvSpec:
        raise NotImplementedError

    def tensors(self, wl: Workload, sp: ConvSpec) -> tuple[dict, dict, list, list, tuple]:
        """(lowering names, DDR tensors, pre relayouts, post relayouts, output shape); a relayout is
        (source, destination, shape, source strides, leader_only): the destination, contiguous,
        read from the source through the strides by the cores (all, split along axis 0, or core 0)."""
        raise NotImplementedError

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """This config's TVM schedule (`conv_schedule` / `fc_schedule`), lowered by the DSP backend."""
        why = self.check(wl, target, config)
        if why is not None and "host_copies" in why:
            raise OpcError(why, arg="--config", value=dict(config))
        return scheduled(self, wl, target, config)

    def _basis(self, wl: Workload, target: Target, config: Mapping[str, Any],
               fp_of: Callable[[DspMachine, ConvSpec, DirectConfig], dict[str, int]] = footprint) -> tuple:
        """What the features start from: (the machine, the spec, the config, its footprint by
        `fp_of`, the output channels of a k block, the k blocks)."""
        m = machine(target)
        sp = self.spec(wl, target)
        cf = DirectConfig.of(config)
        fp = fp_of(m, sp, cf)
        kbp = cf.kv * m.lanes
        return m, sp, cf, fp, kbp, -(-sp.k // kbp)

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m, sp, cf, fp, kbp, nk = self._basis(wl, target, config)
        cols = min(cf.cols, sp.wo)
        stages = sp.n * -(-sp.ho // cf.rows) * -(-sp.wo // cols) * nk
        cost, calls = pass_cost(m, sp, cf, cf.rows * cols, cols)
        ddr_in = stages * in_rows(sp, cf.rows) * min(in_cols(sp, cols), sp.w) * sp.c * 4
        ddr_w = sp.taps * sp.c * sp.k * 4 * (1 if cf.w_path == "gsm" else m.cores)
        ddr_out = sp.n * sp.ho * sp.wo * sp.k * 4
        if "res" in sp.epi:  # the residual is read once, tile by tile, like the output is written
            ddr_in += ddr_out
        busy_cores = min(m.cores, sp.n if cf.split == "batch" else sp.n * -(-sp.ho // cf.rows))
        return {
            "ddr_bytes": float(ddr_in + ddr_w + ddr_out), "sm_bytes_in": float(ddr_in), "am_bytes": float(fp["AM"]),
            "arith_intensity": sp.flops / max(ddr_in + ddr_w + ddr_out, 1), "am_occupancy": fp["AM"] / m.cap("AM"),
            "sm_occupancy": fp["SM"] / m.cap("SM"), "gsm_occupancy": fp["GSM"] / m.cap("GSM"),
            "reg_occupancy": fp["REG"] / m.registers,
            "fmac_slot_use": cost.fmas / max(cost.cycles * m.fmac_units, 1),
            "lane_use": sp.k / (nk * kbp), "stages": float(stages), "mk_calls_per_stage": float(calls),
            "stage_vpu_cycles": float(cost.cycles), "work_per_core": stages / busy_cores,
            "cores_busy": float(busy_cores),
        }
