"""conv2d (and its fused conv+bias+ReLU, conv+BN+ReLU) on the cube through img2col.

    FOR image b (and group), pixel tile m, output-channel tile n   (tiles split over `block_dim` cores)
      input rows of the tile, all C1 blocks: GM (NC1HWC0) -> L1        (MTE2, once per (b, m))
      FOR k step (K fractals in FRACTAL_Z order (c1, ry, rx)):
        weights GM (FRACTAL_Z) -> L1 (MTE2; with w_resident the n tile's whole slice is loaded
        once and the loops run n tile outermost)
        Load3D img2col L1 -> L0A (stride, padding, dilation);
        Load2D L1 -> L0B; MMAD into L0C                                (MTE1, M)
      L0C -> UB, bias (fp32) / cast / BN (fp16) / ReLU in UB, UB -> GM  (V, MTE3)

GM layouts (host-side preprocessing): data NC1HWC0 (C0 = 16 for fp16, 32 for int8; channels
zero-padded, so 3 or 13 input channels pay for a whole C0 block), weights FRACTAL_Z
(C1*R*S, K1, 16, C0), output NC1HWC0 with H*W flattened; per-channel parameters (K1, 16).
Grouped convolution runs each (image, group) pair as its own GEMM over that group's channels
(each group padded to C0: depthwise convolution pays 16x on the cube, as on the chip).

Template v2: every config is a TVM implicit-GEMM s_tir schedule (`schedule`, below), returned as a
`Scheduled` the backend lowers (its `lower.py`, lowering "conv"); the `lowering` knob is
retired, and so is the TIK-style emitter that grouped / depthwise convolution and 1x1 outputs
took until the schedule covered them (int8 conv with BN is not an op: BN takes float dtypes).

The schedule: an `s_tir.Schedule` over the catalogue's conv TE compute,
rewritten to implicit GEMM, buffers placed in the target's scopes, every inner block turned
into an AI Core instruction.

    output pixels flattened        transform_layout / transform_block_layout (b, k, y, x) -> (b, k, y*Wo+x)
    implicit GEMM                  reindex the three operands, transform_block_layout of `conv2d` to
                                   (b, M = y*Wo+x, N = k, K = c*R*S + ry*S + rx), pad_einsum to the tiles
                                   (this tile-independent part is built once per workload and copied)
    loops                          image, pixel tile, n tile (n tile outermost with `w_resident`), k step,
                                   L0 chunk of k, L0 chunk of n (chunks: the direct template's L0 rule)
    data                           the `pad` block -> local.L1 at the pixel tile, NC1HWC0 via transform_layout
                                   (GM -> L1 DMA of the tile's input rows)
    img2col                        the padded reindex block -> local.L0A at the k chunk (Load3D: stride,
                                   padding, dilation are its parameters)
    weights                        the padded weight reindex -> local.L1 (FRACTAL_Z) at the k step (or the
                                   whole K at the n tile when resident), cache_read -> local.L0B at the n chunk
    reduction                      `conv2d` into local.L0C, tensorized as MMAD per chunk; init by
                                   decompose_reduction, tensorized
    epilogue                       L0C -> UB copy, bias (fp32) / cast / BN / ReLU reverse_compute_at the
                                   output tile (in groups of output channels that fit UB) in local.UB;
                                   the last block writes GM

MMAD and the reduction init go through `sch.tensorize` with the backend's tensor intrinsics.
The feature-map DMA, the img2col (Load3D), the weight DMA and Load2D, the L0C -> UB move and
the epilogue blocks carry padding predicates and img2col index arithmetic that TVM's
structural tensorize matcher cannot match against a fixed description (and `blockize` refuses
the last tile's unpadding predicate), so their inner loop nest is replaced (through
`ScheduleState.replace`, the primitive tensorize itself uses) by an opaque block calling the
same `T.call_packed("opc.ascend.tir.event", ...)` with the block coordinates TVM computed for
the instruction. This module only builds the schedule and packs the GM inputs (NHWC inputs are
relaid out on the host): `scheduled` hands the backend a `Scheduled` (lowering "conv"), whose
`lower.py` compiles and traces the module and emits each core's share of the output tiles,
run by the simulator and pipe scheduler. Padding that pad_einsum adds to K, N
and the pixels past H*W is not issued (the MMAD / DMA / Load3D clip to the real fractals).
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.errors import OpcFailure
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.ops.steps import lowerable
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import (
    CUBE_DTYPES,
    CubeTemplate,
    ceil_div,
    core_values,
    cube_chunks,
    epilogue_channels,
    from_5hd,
    machine,
    tile_values,
    tir_epilogue_at,
    to_5hd,
)
from .conv_geometry import ConvGeometry


@register_template
class AscendConv2d(CubeTemplate):
    """img2col convolution in 16-aligned fractals with fused UB epilogues."""

    name = "ascend.conv2d"
    op_families = ("conv2d",)
    version = 2  # v2: one route (TVM s_tir), the `lowering` knob retired

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        g = ConvGeometry(wl, target)
        return [
            Knob("m_tile", tile_values(g.mp1 * 16, 16, 2048), "output pixels per tile (multiple of 16)"),
            Knob("k_tile", tile_values(g.q * g.c0, g.c0, 4096), "reduction depth (C0 x taps) per L1 weight tile"),
            Knob("n_tile", tile_values(g.n1 * 16, 16), "output channels per tile (multiple of 16)"),
            Knob("double_buffer", (1, 0), "ping-pong buffers in L1, L0 and UB"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over"),
            Knob("w_resident", (0, 1), "keep the n tile's whole weight slice in L1, loaded once per n tile"),
        ]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        sp = {k.name: k.values for k in self.space(wl, target)}
        out = []
        for mt in sorted(sp["m_tile"], key=lambda v: abs(v - 256)):
            for nt in sorted(sp["n_tile"], key=lambda v: -v if v <= 256 else v):
                for kt in sorted(sp["k_tile"], key=lambda v: abs(v - 128)):
                    out.append({"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1,
                                "block_dim": target.cores, "w_resident": 0})
        return out

    def tir(self) -> Any:
        return sys.modules[__name__]  # unsupported, tir_buffers (the capacity check), scheduled (apply)

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        g = ConvGeometry(wl, target)
        isz = np.dtype(wl.dtype).itemsize
        mt1, kt1, nt1 = cfg["m_tile"] // 16, cfg["k_tile"] // g.c0, cfg["n_tile"] // 16
        mtiles, ntiles = ceil_div(g.mp1, mt1), ceil_div(g.n1, nt1)
        tiles = g.nb * mtiles * ntiles
        rows = g.max_rows(mt1 * 16)
        fmap = g.nb * mtiles * g.c1 * rows * g.w * g.c0 * isz
        wts = (g.groups * ntiles if cfg["w_resident"] else tiles) * g.q * nt1 * 16 * g.c0 * isz
        out_b = g.nb * g.n1 * g.hw * 16 * 2
        flops = 2 * g.nb * g.mp1 * 16 * g.q * g.c0 * g.n1 * 16
        cores = min(cfg["block_dim"], tiles)
        return {"gm_read_bytes": fmap + wts, "gm_write_bytes": out_b, "arith_intensity": flops / (fmap + wts + out_b),
                "tiles": tiles, "k_steps": ceil_div(g.q, kt1), "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "alignment_waste": 1 - g.c / (g.c1 * g.c0),
                "pixel_waste": 1 - g.hw / (mtiles * mt1 * 16), "halo_rows": rows,
                **self.occupancy(wl, target, cfg), "mmad_flops_per_core": flops / cores}


# the epilogue steps (`opcompiler.ops.steps`) the cube lowering has, in its pipeline's order
# (L0C -> UB, bias in fp32, cast, BN, the residual read in the epilogue ("add"), ReLU, HardSwish), in
# this template's names; a conv2d-family op runs here when its catalogue entry's `epilogue` is made of them
EPI_STEPS = {"bias": "bias", "bn": "bn", "add": "res", "relu": "relu", "hardswish": "hswish"}
INT8_STEPS = ("bias", "relu")  # int8: the int32 bias and ReLU only
# TE block name -> instruction tag; HardSwish's blocks (vadds, clip, vmuls) are inlined into its last, `vmul`
EPI_TAGS = {"conv2d_bias": "bias", "conv2d_out": "cast", "batch_norm": "bn", "vadd": "res", "vrelu": "relu",
            "vmul": "hswish", "conv2d_reindex": "out", "conv2d_reindex_pad": "out"}
DTYPES = CUBE_DTYPES  # C0 (K0), accumulator, element bytes


def unsupported(wl: Workload) -> str | None:
    """Why the TIR path cannot lower this workload (None when it can)."""
    op = get_op(wl.op)
    epi = epilogue(wl)
    if op.family != "conv2d" or epi is None or wl.dtype not in DTYPES or (wl.dtype == "int8" and not set(epi) <= set(INT8_STEPS)):
        return (f"lowering=tir covers conv2d with epilogue steps among {', '.join(EPI_STEPS)} (in that order; "
                f"int8: {', '.join(INT8_STEPS)}); {wl.op} {wl.dtype} has {op.epilogue or 'none'}")
    return None


def epilogue(wl: Workload) -> tuple[str, ...] | None:
    """The op's epilogue in this template's names (bias, bn, res, relu), or None when a step has no lowering."""
    return lowerable(get_op(wl.op).epilogue_steps(wl), EPI_STEPS, ordered=True)


def epilogue_flags(wl: Workload) -> tuple[bool, bool, bool]:
    """(bias, bn, res): which per-channel / residual operands the epilogue reads."""
    epi = epilogue(wl) or ()
    return "bias" in epi, "bn" in epi, "res" in epi


def has_hswish(wl: Workload) -> bool:
    """The epilogue ends in HardSwish (one more UB tile per slot: x kept for its last multiply)."""
    return "hswish" in (epilogue(wl) or ())


chunks = cube_chunks  # (k, n) elements of one L0 chunk of the (mt, kt, nt) tile, or None


def tir_buffers(wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
    """(level, name, bytes) of what the TIR lowering allocates, for the template's capacity check."""
    p = wl.p
    g = ConvGeometry(wl, target)
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    slots = 2 if cfg["double_buffer"] else 1
    isz, cast = DTYPES[wl.dtype][2], wl.dtype == "float16"
    ch = chunks(wl, target, cfg)
    if ch is None:
        return [("L0A", "A_L0A", mt * g.c0 * isz * slots + machine(target).level("L0A").capacity)]
    kc, nc = ch
    bias, bn, res = epilogue_flags(wl)
    cslots = intrin.l0c_slots(machine(target), slots == 2, mt * nt * 4)
    g16 = epilogue_channels(wl, target, cfg)
    out = [("L1", f"fmap_L1_{i}", g.c1 * g.max_rows(mt) * p["w"] * g.c0 * isz) for i in range(slots)]
    if cfg.get("w_resident"):
        out += [("L1", "W_res_L1", g.q * g.c0 * nt * isz)]
    else:
        out += [("L1", f"W_L1_{i}", kt * nt * isz) for i in range(slots)]
    out += [("L0A", f"A_L0A_{i}", mt * kc * isz) for i in range(slots)]
    out += [("L0B", f"B_L0B_{i}", kc * nc * isz) for i in range(slots)]
    out += [("L0C", f"C_L0C_{i}", mt * nt * 4) for i in range(cslots)]
    out += [("UB", f"acc_UB_{i}", mt * g16 * 4) for i in range(slots)]
    out += [("UB", f"out_UB_{i}", mt * g16 * 2) for i in range(slots) if cast]
    pn = g.groups * g.n1 * 16  # every group's per-channel parameters
    if bias:
        out += [("UB", "bias_UB", pn * (2 if cast else 4))] + ([("UB", "bias32_UB", pn * 4)] if cast else [])
    if bn:
        out += [("UB", "scale_UB", pn * 2), ("UB", "shift_UB", pn * 2)]
    if res:  # the residual's tile, read from GM beside each channel group's epilogue
        out += [("UB", f"res_UB_{i}", mt * g16 * 2) for i in range(slots)]
    if has_hswish(wl):  # HardSwish's clip(x + 3, 0, 6) / 6 beside x
        out += [("UB", f"hs_UB_{i}", mt * g16 * 2) for i in range(slots)]
    return out


_PREFIX: dict[tuple, tuple] = {}  # workload -> the tile-independent start of its schedule


def _implicit_gemm(wl: Workload):
    """The tile-independent start of the schedule (cached per workload: every config of the
    template shares it): output pixels flattened, the three operands reindexed to the implicit
    GEMM (b, M = y*Wo+x, N = k, K = c*R*S + ry*S + rx). Returns (schedule, epilogue block names,
    the data / weight index maps, argument specs); each config continues on a copy."""
    key = (wl.op, tuple(sorted(dict(wl.params).items())), wl.dtype)
    if key in _PREFIX:
        return _PREFIX[key]
    import tvm
    from tvm import te
    from tvm.s_tir.schedule.analysis import has_block

    ins, out = get_op(wl.op).compute(wl)
    ho, wo = conv_out_hw(wl)
    r, s = wl["r"], wl["s"]
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    conv = sch.get_sblock("conv2d")
    if has_hswish(wl):  # x + 3, its clip and the 1/6 scale become one expression in the last block
        for name in ("vadds", "broadcast_scalar", "vmin", "broadcast_scalar_1", "vmax", "vmuls"):
            sch.compute_inline(sch.get_sblock(name))

    def flat(b, k, y, x):  # the output pixels as one GEMM axis
        return b, k, y * wo + x

    epi = []
    for name in ("conv2d_bias", "conv2d_out", "batch_norm", "vadd", out.op.name):
        if name in EPI_TAGS and name not in epi and has_block(sch, name):
            blk = sch.get_sblock(name)
            epi.append(name)
            sch.transform_layout(blk, ("write", 0), flat)
            sch.transform_block_layout(blk, flat)
    sch.transform_layout(conv, ("write", 0), flat)
    grouped = wl["groups"] > 1
    roles = ("b", "k", "y", "x", "c", "ry", "rx")
    if grouped:  # the output channel splits into (group, channel in group): one GEMM per (image, group)
        kg = wl["k"] // wl["groups"]
        sch.transform_block_layout(conv, lambda b, k, y, x, c, ry, rx: (b, k // kg, k % kg, y, x, c, ry, rx))
        roles = ("b", "g", "k", "y", "x", "c", "ry", "rx")
    for buf in (("write", 0), ("read", 0), ("read", 1)):
        sch.reindex(conv, buf)
    from tvm.tirx import IndexMap

    # reindex keeps, in its own order, the block axes an operand's indices use and drops those TE
    # simplified away (a 1x1 output has no pixel axes, a 1-wide kernel no tap axes): each map is
    # built from the axes the reindexed buffer really has
    blk, zero = sch.get(conv), tvm.tirx.const(0, "int32")

    def axes(region) -> list[str]:
        return [next(ro for iv, ro in zip(blk.iter_vars, roles) if iv.var.same_as(rg.min)) for rg in region]

    def gemm_map(names: list[str], fn):
        def f(*a):
            v = dict(zip(names, a))
            return fn(lambda ro: v.get(ro, zero))
        return IndexMap.from_func(f, ndim=len(names), index_dtype="int32")

    def kidx(v):  # (c, ry, rx) -> FRACTAL_Z K index
        return v("c") * (r * s) + v("ry") * s + v("rx")

    def lead(v):  # the GEMM's batch axes: the image (and the group)
        return (v("b"), v("g")) if grouped else (v("b"),)

    a_rd, w_rd = [rd for rd in blk.reads if not rd.source.same_as(blk.writes[0].source)]
    a_ax, w_ax, o_ax = axes(a_rd.region), axes(w_rd.region), axes(blk.writes[0].region)
    a_map = gemm_map(a_ax, lambda v: (*lead(v), v("y") * wo + v("x"), kidx(v)))
    w_map = gemm_map(w_ax, lambda v: (*lead(v)[1:], kidx(v), v("k")))
    sch.transform_layout(conv, ("read", 0), a_map)
    sch.transform_layout(conv, ("read", 1), w_map)
    sch.transform_layout(conv, ("write", 0), gemm_map(o_ax, lambda v: (*lead(v), v("y") * wo + v("x"), v("k"))))
    if grouped:  # the first transform made the unit tap axes of a 1-wide kernel spatial: leave them out of K
        sch.transform_block_layout(conv, lambda b, g, k, y, x, c, ry, rx: (
            b, g, y * wo + x, k, c * r * s + (ry * s if r > 1 else 0) + (rx if s > 1 else 0)))
    else:
        sch.transform_block_layout(conv, lambda b, k, y, x, c, ry, rx: (b, y * wo + x, k, c * r * s + ry * s + rx))
    if ho * wo == 1:
        _index_the_pixel(sch, conv, 2 if grouped else 1)
    shapes = [[int(d) for d in t.shape] for t in ins] + [[wl["n"], wl["k"], ho * wo]]  # output pixels flattened
    _PREFIX[key] = (sch, tuple(epi), a_map, w_map, [(sh, str(t.dtype)) for sh, t in zip(shapes, (*ins, out))])
    return _PREFIX[key]


def _index_the_pixel(sch, conv, mpos: int) -> None:
    """A 1x1 output: reindex left the GEMM's pixel index of the output and img2col buffers the
    constant 0 (the pixel axis has extent 1) where pad_einsum needs the block's M axis. Index them
    by it (the same element: M's only value is 0), replacing the block through the schedule
    state (as `intrin.substitute` does)."""
    from tvm import tirx
    from tvm.ir import Range
    from tvm.ir.expr import TensorLoad, TensorRegion
    from tvm.ir.prim import expr as px
    from tvm.s_tir import SBlock

    blk = sch.get(conv)
    mvar = blk.iter_vars[mpos].var  # M, after the image (and group) axes
    a_src = next(rd.source for rd in blk.reads if not rd.source.same_as(blk.writes[0].source))
    pix = (blk.writes[0].source, a_src)  # the output and img2col operands (the weights have no M)

    def idx(src, ind):
        ind = list(ind)
        if any(src.same_as(p) for p in pix) and isinstance(ind[mpos], tirx.IntImm):
            ind[mpos] = mvar
        return ind

    def ex(e):
        if isinstance(e, TensorLoad):
            return tirx.BufferLoad(e.source, idx(e.source, e.indices))
        if isinstance(e, px.Cast):
            return px.Cast(str(e.ty), ex(e.value))
        if isinstance(e, (px.Add, px.Mul)):
            return type(e)(ex(e.a), ex(e.b))
        if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            return e
        raise OpcFailure(f"ascend.conv2d: the 1x1-output rewrite met a {type(e).__name__} in the conv block "
                         f"(the catalogue's conv compute holds loads, casts, adds and multiplies only)")

    def store(st):
        return tirx.BufferStore(st.buffer, ex(st.value), idx(st.buffer, st.indices))

    def region(rd):
        rg = list(rd.region)
        if any(rd.source.same_as(p) for p in pix):
            rg[mpos] = Range.from_min_extent(mvar, 1)
        return TensorRegion(rd.source, rg, rd.ty)

    new = SBlock(list(blk.iter_vars), [region(rd) for rd in blk.reads], [region(rd) for rd in blk.writes],
                 blk.name_hint, store(blk.body), store(blk.init), list(blk.alloc_buffers), list(blk.match_buffers),
                 dict(blk.annotations))
    sch.state.replace(sch.get_sref(conv), new, {blk: new})


def padded_workload(wl: Workload) -> Workload:
    """The workload the schedule is built over: each group's channels padded to whole C0 / 16
    blocks, NCHW (NHWC data is relaid out on the host, the kernel is the same)."""
    c0, G = DTYPES[wl.dtype][0], wl["groups"]
    return Workload.make(wl.op, {**dict(wl.p), "c": G * ceil_div(wl["c"] // G, c0) * c0,
                                 "k": G * ceil_div(wl["k"] // G, 16) * 16, "layout": "NCHW"}, wl.dtype)


def schedule(wl: Workload, mt: int, kt: int, nt: int, kc: int, nc: int, resident: bool, g16: int):
    """The (channel-padded, NCHW) conv's implicit-GEMM s_tir schedule, every inner block tensorized
    or substituted by its instruction; (module, argument specs).

    Loops: (image, pixel tile, n tile) -- n tile outermost when the weight slice is `resident`
    in L1 -- then k step (`kt`: weight DMA), L0 chunk of k (`kc`: Load3D), L0 chunk of n
    (`nc`: Load2D of the weights, MMAD into its columns of the L0C tile); the epilogue passes
    through UB `g16` output channels at a time."""
    from tvm.s_tir.schedule.analysis import has_block

    base, epi_names, a_map, w_map, arg_specs = _implicit_gemm(wl)
    sch = base.copy()
    conv = sch.get_sblock("conv2d")
    epi = [(name, sch.get_sblock(name)) for name in epi_names]
    nlead = 2 if wl["groups"] > 1 else 1  # the GEMM's batch axes: image (and group)
    sch.pad_einsum(conv, [1] * nlead + [mt, nt, kt])

    def producer(blk, idx: int):
        buf = sch.get(blk).reads[idx].source
        return next(pb for pb in sch.get_producers(blk) if sch.get(pb).writes[0].source.same_as(buf))

    # the img2col and weight reads become one block each (reindex inlined into pad_einsum's copy)
    im2col, wpad = producer(conv, 0), producer(conv, 1)
    for blk, imap in ((im2col, a_map), (wpad, w_map)):
        if sch.get(blk).name_hint.endswith("_pad"):
            sch.compute_inline(producer(blk, 0))
        else:  # no padding on this operand: the reindex block itself, iterated in GEMM order
            sch.transform_block_layout(blk, imap)
    # the epilogue reads the GEMM result directly: inline the unpad copy and the (M, N) -> NCHW copy
    copies = [name for name in ("conv2d_reindex_pad", "conv2d_reindex") if has_block(sch, name)]
    if not epi:  # int8 conv2d: the last copy writes the output; it is the (UB -> GM) epilogue
        epi, copies = [(copies[-1], sch.get_sblock(copies[-1]))], copies[:-1]
    for name in copies:  # the first is absent when M and N needed no padding
        sch.compute_inline(sch.get_sblock(name))
    *lead, i, j, k = sch.get_loops(conv)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1, j2 = sch.split(j, [None, nt // nc, nc])
    k0, k1, k2 = sch.split(k, [None, kt // kc, kc])
    if resident:  # n tiles outermost: the slice stays in L1 while the pixel tiles sweep past
        sch.reorder(j0, *lead, i0, k0, k1, j1, i1, j2, k2)
    else:  # pixel tiles outermost: the feature map stays in L1 across n tiles
        sch.reorder(*lead, i0, j0, k0, k1, j1, i1, j2, k2)
    tile = i0 if resident else j0  # the output tile's loop
    l0c = sch.cache_write(conv, 0, intrin.L0C)  # the copy block is the L0C -> UB move
    sch.set_scope(l0c, 0, intrin.UB_SCOPE)
    tir_epilogue_at(sch, l0c, [blk for _, blk in epi], tile, nt, g16)
    for _, blk in epi[:-1]:  # the last epilogue block writes GM
        sch.set_scope(blk, 0, intrin.UB_SCOPE)
    b0 = sch.cache_read(conv, 1, intrin.L0B)
    sch.set_scope(im2col, 0, intrin.L0A)
    sch.set_scope(wpad, 0, intrin.L1)
    sch.compute_at(im2col, k1)  # consumers first
    sch.compute_at(b0, j1)
    # a resident slice: loaded once per n tile, per group (each group has its own weights)
    sch.compute_at(wpad, (lead[-1] if nlead > 1 else j0) if resident else k0)
    # with padding the `pad` block is the GM -> L1 copy; without, a cache_read of the data
    padb = sch.get_sblock("pad") if wl["pad"] else sch.cache_read(im2col, 0, intrin.L1)
    sch.compute_at(padb, i0)
    sch.set_scope(padb, 0, intrin.L1)
    c0 = DTYPES[wl.dtype][0]
    sch.transform_layout(padb, ("write", 0), lambda n, c, h, w: (n, c // c0, h, w, c % c0))
    init = sch.decompose_reduction(conv, k0)
    ij = sch.get_loops(init)[-3:]  # (n chunk, pixel, n in chunk): one (mt, nt) init of the whole tile
    sch.reorder(ij[1], ij[0])
    sch.fuse(ij[0], ij[2])
    _, acc, _ = DTYPES[wl.dtype]
    sch.tensorize(sch.get_loops(init)[-2], intrin.intrin_init(mt, nt, acc, lead=nlead))
    sch.tensorize(sch.get_loops(conv)[-3], intrin.intrin_mmad(mt, kc, nc, wl.dtype, acc, lead=nlead))
    # compute_at leaves out unit loops (a 1x1 output's pixel, a one-row tile): the instruction is
    # every loop under the one its block was placed at
    intrin.substitute(sch, padb, _under(sch, padb, i0), "fmap", lambda inner: [_extent_of(inner, 2)])
    at = len(sch.get_loops(l0c)) - 2  # the epilogue's loop (the tile's, or its channel group's)
    for blk, tag in [(im2col, "load3d"), (b0, "ld_b"), (wpad, "w_res" if resident else "w_l1"), (l0c, "l0c")] + [
            (blk, EPI_TAGS[name]) for name, blk in epi]:
        intrin.substitute(sch, blk, len(sch.get_loops(blk)) - at if tag in EPI_TAGS.values() else 2, tag)
    return sch.mod, arg_specs


def _extent_of(inner, axis: int):
    """The extent of the loop (among an instruction's `inner` loops) that block axis `axis`
    runs along; 1 when compute_at left that unit loop out."""
    import tvm
    from tvm import tirx

    realize = inner[-1].body
    for lp in inner:
        ana = tvm.sym.Analyzer()
        for other in inner:
            ana.bind(other.loop_var, tirx.const(1 if other.same_as(lp) else 0, "int32"))
        moved = ana.simplify(realize.iter_values[axis])
        ana0 = tvm.sym.Analyzer()
        for other in inner:
            ana0.bind(other.loop_var, tirx.const(0, "int32"))
        step = tvm.sym.Analyzer().simplify(moved - ana0.simplify(realize.iter_values[axis]))
        if not (isinstance(step, tirx.IntImm) and step.value == 0):
            return lp.extent
    return tirx.const(1, "int32")


def _under(sch, blk, loop) -> int:
    """How many of the block's loops lie under `loop`."""
    loops = sch.get_loops(blk)
    at = sch.get_sref(loop)
    return len(loops) - 1 - next(i for i, lp in enumerate(loops) if sch.get_sref(lp).same_as(at))


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    """The config's scheduled conv for the backend's "conv" lowering (see the module docstring)."""
    p = wl.p
    G = p["groups"]
    n, c, h, w, k = p["n"], p["c"] // G, p["h"], p["w"], p["k"] // G  # channels per group
    r, s = p["r"], p["s"]
    ho, wo = conv_out_hw(wl)
    hw = ho * wo
    c0, _, _ = DTYPES[wl.dtype]
    out_dt = "float16" if wl.dtype == "float16" else "int32"
    c1, n1 = ceil_div(c, c0), ceil_div(k, 16)
    q_all = c1 * r * s  # K fractals per group (FRACTAL_Z order: c1, ry, rx)
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    ch = chunks(wl, target, cfg)  # None: the capacity dry-run (`buffers`) refuses the config before TVM
    resident = bool(cfg.get("w_resident"))
    # channels pad and pay; NHWC data is relaid out on the host (packing), the kernel is the same
    padded = padded_workload(wl)
    g16 = epilogue_channels(wl, target, cfg)
    bias, bn, res = epilogue_flags(wl)
    nhwc = p["layout"] == "NHWC"

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        x, wt = inputs[0], inputs[1]
        if nhwc:
            x, wt = x.transpose(0, 3, 1, 2), wt.transpose(3, 2, 0, 1)  # -> NCHW, HWIO -> OIHW
        xg = x.reshape(n * G, c, h, w)  # (image, group) pairs, each group's channels padded to C0
        wp = np.zeros((G, n1 * 16, c1 * c0, r, s), wt.dtype)
        wp[:, :k, :c] = wt.reshape(G, k, c, r, s)
        wz = wp.reshape(G, n1, 16, c1, c0, r, s).transpose(0, 3, 5, 6, 1, 2, 4)  # (G, c1, ry, rx, n1, 16, c0)
        gm = {"data": np.ascontiguousarray(to_5hd(xg, "NCHW", c0).reshape(n * G, c1, h, w, c0)),
              "weight": np.ascontiguousarray(wz.reshape(G * q_all, n1, 16, c0))}

        def per_k(v: np.ndarray) -> np.ndarray:
            out = np.zeros((G, n1 * 16), out_dt)
            out[:, :k] = v.reshape(G, k)
            return out.reshape(G * n1, 16)

        if bias:
            gm["bias"] = per_k(inputs[2])
        if bn:
            gm["scale"], gm["shift"] = per_k(inputs[2]), per_k(inputs[3])
        if res:  # the residual in the output's layout: NC1HWC0 per group, H*W flattened
            rs = inputs[-1].transpose(0, 3, 1, 2) if nhwc else inputs[-1]
            rg = np.zeros((n * G, n1 * 16, ho, wo), out_dt)
            rg[:, :k] = rs.reshape(n * G, k, ho, wo)
            gm["res"] = np.ascontiguousarray(to_5hd(rg, "NCHW", 16).reshape(n * G, n1, hw, 16))
        return gm

    def unpack(y: np.ndarray) -> np.ndarray:
        out = from_5hd(y, k, ho, wo, "NCHW").reshape(n, G * k, ho, wo)
        return np.ascontiguousarray(out.transpose(0, 2, 3, 1)) if nhwc else out

    kc, nc = ch or (None, None)
    key = ("ascend.conv2d", padded.op, padded.dtype, tuple(sorted(dict(padded.params).items())), mt, kt, nt, kc, nc,
           resident, g16)
    return Scheduled(
        lowering="conv", key=key, module=lambda: schedule(padded, mt, kt, nt, kc, nc, resident, g16),
        params={"geom": ConvGeometry(wl, target).geom, "n": n, "c1": c1, "n1": n1, "tiles": (mt, kt, nt),
                "chunks": ch, "slots": 2 if cfg["double_buffer"] else 1, "bias": bias, "bn": bn, "res": res,
                "hswish": has_hswish(wl),
                "resident": resident, "group": g16, "dtype": wl.dtype, "conv_groups": G,
                "block_dim": cfg["block_dim"]},
        host=HostLayout(pack=pack, unpack=unpack, out_name="out", out_shape=(n * G, n1, hw, 16), out_dtype=out_dt),
        buffers=tir_buffers(wl, target, cfg), flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": {"data": "NC1HWC0 per group (N*G,C1,H,W,C0), channels zero-padded",
                             "weight": "FRACTAL_Z per group (G*C1*R*S,K1,16,C0)",
                             "out": "NC1HWC0 per group (N*G,K1,Ho*Wo,16)"}})
