"""conv2d lowered through TVM: an `s_tir.Schedule` over the catalogue's conv TE compute,
rewritten to implicit GEMM, buffers placed in the target's scopes, every inner block turned
into an AI Core instruction.

    output pixels flattened        transform_layout / transform_block_layout (b, k, y, x) -> (b, k, y*Wo+x)
    implicit GEMM                  reindex the three operands, transform_block_layout of `conv2d` to
                                   (b, M = y*Wo+x, N = k, K = c*R*S + ry*S + rx), pad_einsum to the tiles
    data                           the `pad` block -> local.L1 at the pixel tile, NC1HWC0 via transform_layout
                                   (GM -> L1 DMA of the tile's input rows)
    img2col                        the padded reindex block -> local.L0A under the k step (Load3D: stride,
                                   padding, dilation are its parameters)
    weights                        the padded weight reindex -> local.L1 (FRACTAL_Z), cache_read -> local.L0B
    reduction                      `conv2d` into local.L0C, tensorized as MMAD; init by decompose_reduction
    epilogue                       L0C -> UB copy, bias (fp32) / cast / BN / ReLU reverse_compute_at the
                                   output tile in local.UB; the last block writes GM

MMAD, the reduction init, the L1 -> L0B weight load and the L0C -> UB move go through
`sch.tensorize` with registered tensor intrinsics. The feature-map DMA, the img2col (Load3D),
the weight DMA and the epilogue blocks carry padding predicates and img2col index arithmetic
that TVM's structural tensorize matcher cannot match against a fixed description (and
`blockize` refuses the last pixel tile's unpadding predicate), so their inner loop nest is
replaced (through `ScheduleState.replace`, the primitive tensorize itself uses) by an opaque
block calling the same `T.call_packed("opc.ascend.tir.conv_event", ...)` with the block
coordinates TVM computed for the tile. `tvm.compile(..., "llvm")` builds the loop nest;
one native run records the trace; each core's share of the output tiles is emitted through
`KernelBuilder` and run by the same simulator and pipe scheduler as the TIK-style template.
Padding that pad_einsum adds to K and N is zero on both operands, so the emitted MMAD / weight
DMA / Load3D clip to the real fractal counts; pixel padding is paid (Load3D fills zero rows).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import ConvGeom, VOp
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.workload import Workload

from .common import channel_op, from_5hd, machine, to_5hd
from .conv_geometry import ConvGeometry

_REGISTERED: set[str] = set()
_TRACE: list[tuple] = []  # events, appended while the compiled kernel runs
_TRACES: dict[tuple, list[tuple]] = {}  # (op, padded params, tiles) -> trace: compile once per process
TIR_OPS = ("conv2d", "conv2d_bias_relu", "conv2d_bn_relu", "conv2d_bn")
# its own packed function: matmul_tir registers "opc.ascend.tir.event" into its own trace list
EVENT = "opc.ascend.tir.conv_event"
EPI_TAGS = {"conv2d_bias": "bias", "conv2d_out": "cast", "batch_norm": "bn", "vrelu": "relu"}


def unsupported(wl: Workload) -> str | None:
    """Why the TIR path cannot lower this workload (None when it can)."""
    p = wl.p
    if wl.op not in TIR_OPS or wl.dtype != "float16":
        return f"lowering=tir covers fp16 {', '.join(TIR_OPS)} only"
    if p["groups"] != 1 or p["layout"] != "NCHW":
        return "lowering=tir covers groups=1 NCHW convolution only"
    return None


def tir_buffers(wl: Workload, rows_max: int, cfg: Mapping) -> list[tuple[str, str, int]]:
    """(level, name, bytes) of what `tir_plan` allocates, for the template's capacity check."""
    p = wl.p
    c1, mt, kt, nt = ceil_div(p["c"], 16), cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    slots = 2 if cfg["double_buffer"] else 1
    out = [("L1", f"fmap_L1_{i}", c1 * rows_max * p["w"] * 16 * 2) for i in range(slots)]
    out += [("L1", f"W_L1_{i}", kt * nt * 2) for i in range(slots)]
    out += [("L0A", f"A_L0A_{i}", mt * kt * 2) for i in range(slots)]
    out += [("L0B", f"B_L0B_{i}", kt * nt * 2) for i in range(slots)]
    out += [("L0C", "C_L0C", mt * nt * 4), ("UB", "acc_UB", mt * nt * 4), ("UB", "out_UB", mt * nt * 2)]
    if wl.op == "conv2d_bias_relu":
        out += [("UB", "bias_UB", nt * 2), ("UB", "bias32_UB", nt * 4)]
    if wl.op in ("conv2d_bn_relu", "conv2d_bn"):
        out += [("UB", "scale_UB", nt * 2), ("UB", "shift_UB", nt * 2)]
    return out


def _callbacks() -> None:
    import tvm

    if "callbacks" in _REGISTERED:
        return

    def event(*args: Any) -> int:
        _TRACE.append(tuple(a if isinstance(a, str) else int(a) for a in args))
        return 0

    tvm.register_global_func(EVENT, event, override=True)
    _REGISTERED.add("callbacks")


def _intrinsics(mt: int, kt: int, nt: int) -> tuple[str, ...]:
    """Register (once per tile shape) the tensor intrinsics matched by `sch.tensorize`: MMAD,
    L0C init, the L1 -> L0B weight load and the L0C -> UB move; returns their names."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    key = f"{mt}x{kt}x{nt}"
    names = tuple(f"opc_ascend_conv_{k}_{key}" for k in ("mmad", "init", "ld_b", "l0c"))
    if key in _REGISTERED:
        return names

    @T.prim_func(s_tir=True)
    def mm_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (1, mt, kt), "float16", offset_factor=1, scope="local.L0A")
        B = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0, 0:mt, 0:nt])
            for i, j, k in T.grid(mt, nt, kt):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[0, vi, vj] = C[0, vi, vj] + T.Cast("float32", A[0, vi, vk]) * T.Cast("float32", B[vk, vj])

    @T.prim_func(s_tir=True)
    def mm_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa, sb = T.int32(), T.int32()
        A = T.match_buffer(a, (1, mt, kt), "float16", offset_factor=1, scope="local.L0A", strides=[sa, sb, 1])
        B = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0, 0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.conv_event", "mmad", A.elem_offset, sb))

    @T.prim_func(s_tir=True)
    def init_desc(c: T.handle) -> None:
        C = T.match_buffer(c, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0, 0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[0, vi, vj] = T.float32(0)

    @T.prim_func(s_tir=True)
    def init_impl(c: T.handle) -> None:
        C = T.match_buffer(c, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0, 0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.conv_event", "init", C.elem_offset, 0))

    @T.prim_func(s_tir=True)
    def ldb_desc(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (kt, nt), "float16", offset_factor=1, scope="local.L1")
        D = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B")
        with T.sblock("root"):
            T.reads(S[0:kt, 0:nt])
            T.writes(D[0:kt, 0:nt])
            for i, j in T.grid(kt, nt):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = S[vi, vj]

    @T.prim_func(s_tir=True)
    def ldb_impl(a: T.handle, b: T.handle) -> None:
        s0, d0 = T.int32(), T.int32()
        S = T.match_buffer(a, (kt, nt), "float16", offset_factor=1, scope="local.L1", strides=[s0, 1])
        D = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B", strides=[d0, 1])
        with T.sblock("root"):
            T.reads(S[0:kt, 0:nt])
            T.writes(D[0:kt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.conv_event", "ld_b", S.elem_offset, s0))

    @T.prim_func(s_tir=True)
    def l0c_desc(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C")
        D = T.match_buffer(b, (1, mt, nt), "float32", offset_factor=1, scope="local.UB")
        with T.sblock("root"):
            T.reads(S[0, 0:mt, 0:nt])
            T.writes(D[0, 0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[0, vi, vj] = S[0, vi, vj]

    @T.prim_func(s_tir=True)
    def l0c_impl(a: T.handle, b: T.handle) -> None:
        s0, s1, d0, d1 = T.int32(), T.int32(), T.int32(), T.int32()
        S = T.match_buffer(a, (1, mt, nt), "float32", offset_factor=1, scope="local.L0C", strides=[s0, s1, 1])
        D = T.match_buffer(b, (1, mt, nt), "float32", offset_factor=1, scope="local.UB", strides=[d0, d1, 1])
        with T.sblock("root"):
            T.reads(S[0, 0:mt, 0:nt])
            T.writes(D[0, 0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.conv_event", "l0c", D.elem_offset, d1))

    for name, desc, impl in zip(names, (mm_desc, init_desc, ldb_desc, l0c_desc), (mm_impl, init_impl, ldb_impl,
                                                                                   l0c_impl)):
        TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED.add(key)
    return names


def _substitute(sch, blk, n_inner: int, tag: str) -> None:
    """Replace the block's inner `n_inner` loops (one instruction's worth of work) with the
    instruction intrinsic, called with the block coordinates of the tile's first element
    (and, for the feature-map DMA, the number of rows TVM's region analysis gave the tile).
    blockize cannot take the unpadding predicate of the last pixel tile, so the loop nest is
    replaced by an opaque block directly."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import SBlock, SBlockRealize

    loops = sch.get_loops(blk)
    inner = [sch.get(lp) for lp in loops[-n_inner:]]
    realize = inner[-1].body
    ana = tvm.sym.Analyzer()
    for lp in inner:
        ana.bind(lp.loop_var, tirx.const(0, "int32"))
    args = [ana.simplify(v) for v in realize.iter_values]
    if tag == "fmap":
        args.append(inner[1].extent)  # input rows of this pixel tile (padded coordinates)
    body = tirx.Evaluate(tirx.call_packed(EVENT, tag, *args))
    name = realize.block.name_hint + "_instr"
    new = SBlockRealize([], tirx.const(True, "bool"), SBlock([], [], [], name, body))
    sch.state.replace(sch.get_sref(loops[-n_inner]), new)


def trace(wl: Workload, mt: int, kt: int, nt: int) -> list[tuple]:
    """Schedule, lower into instructions, compile and run the (channel-padded) conv once."""
    import tvm
    from tvm import te
    from tvm.s_tir.schedule.analysis import has_block

    _callbacks()
    mm_name, init_name, ldb_name, l0c_name = _intrinsics(mt, kt, nt)
    ins, out = get_op(wl.op).compute(wl)
    ho, wo = conv_out_hw(wl)
    r, s = wl["r"], wl["s"]
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    conv = sch.get_sblock("conv2d")

    def flat(b, k, y, x):  # the output pixels as one GEMM axis
        return b, k, y * wo + x

    epi = []
    for name in ("conv2d_bias", "conv2d_out", "batch_norm", out.op.name):
        if name in EPI_TAGS and name not in [e[0] for e in epi] and has_block(sch, name):
            blk = sch.get_sblock(name)
            epi.append((name, blk))
            sch.transform_layout(blk, ("write", 0), flat)
            sch.transform_block_layout(blk, flat)
    sch.transform_layout(conv, ("write", 0), flat)
    for buf in (("write", 0), ("read", 0), ("read", 1)):
        sch.reindex(conv, buf)
    from tvm.tirx import IndexMap

    def kidx(rest, full: bool):  # (c, ry, rx) -> FRACTAL_Z K index
        taps = [r * s, s, 1]
        # the data reindex drops the ry / rx axes of a 1-wide kernel (TE simplified them out of its index)
        keep = [0, 1, 2] if full else [0] + ([1] if r > 1 else []) + ([2] if s > 1 else [])
        terms = [v * taps[d] if taps[d] > 1 else v for v, d in zip(rest, keep)]
        out = terms[0]
        for t in terms[1:]:
            out = out + t
        return out

    nk = 1 + (r > 1) + (s > 1)
    a_map = IndexMap.from_func(lambda *a: (a[0], a[1] * wo + a[2], kidx(a[3:], False)), ndim=3 + nk,
                               index_dtype="int32")
    w_map = IndexMap.from_func(lambda *a: (kidx(a[1:], True), a[0]), ndim=4, index_dtype="int32")
    sch.transform_layout(conv, ("read", 0), a_map)
    sch.transform_layout(conv, ("read", 1), w_map)
    sch.transform_layout(conv, ("write", 0), lambda b, k, y, x: (b, y * wo + x, k))
    sch.transform_block_layout(conv, lambda b, k, y, x, c, ry, rx: (b, y * wo + x, k, c * r * s + ry * s + rx))
    sch.pad_einsum(conv, [1, mt, nt, kt])

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
    for name in ("conv2d_reindex_pad", "conv2d_reindex"):  # the first is absent when M and N needed no padding
        if has_block(sch, name):
            sch.compute_inline(sch.get_sblock(name))
    b, i, j, k = sch.get_loops(conv)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1 = sch.split(j, [None, nt])
    k0, _ = sch.split(k, [None, kt])
    sch.reorder(b, i0, j0, k0, i1, j1)
    l0c = sch.cache_write(conv, 0, "local.L0C")  # the copy block is the L0C -> UB move
    sch.set_scope(l0c, 0, "local.UB")
    sch.reverse_compute_at(l0c, j0)
    for _, blk in epi:  # producers first
        sch.reverse_compute_at(blk, j0)
    for _, blk in epi[:-1]:  # the last epilogue block writes GM
        sch.set_scope(blk, 0, "local.UB")
    b0 = sch.cache_read(conv, 1, "local.L0B")
    sch.set_scope(im2col, 0, "local.L0A")
    sch.set_scope(wpad, 0, "local.L1")
    for blk in (im2col, b0, wpad):  # consumers first
        sch.compute_at(blk, k0)
    # with padding the `pad` block is the GM -> L1 copy; without, a cache_read of the data
    padb = sch.get_sblock("pad") if wl["pad"] else sch.cache_read(im2col, 0, "local.L1")
    sch.compute_at(padb, i0)
    sch.set_scope(padb, 0, "local.L1")
    sch.transform_layout(padb, ("write", 0), lambda n, c, h, w: (n, c // 16, h, w, c % 16))
    init = sch.decompose_reduction(conv, k0)
    sch.tensorize(sch.get_loops(init)[-2], init_name)
    sch.tensorize(sch.get_loops(conv)[-3], mm_name)
    sch.tensorize(sch.get_loops(b0)[-2], ldb_name)
    sch.tensorize(sch.get_loops(l0c)[-2], l0c_name)
    subs = [(padb, "fmap"), (im2col, "load3d"), (wpad, "w_l1")]
    for blk, tag in subs + [(blk, EPI_TAGS[name]) for name, blk in epi]:
        _substitute(sch, blk, 3 if tag == "fmap" else 2, tag)
    ex = tvm.compile(sch.mod, target="llvm")
    shapes = [[int(d) for d in t.shape] for t in ins] + [[wl["n"], wl["k"], ho * wo]]  # output pixels flattened
    args = [tvm.runtime.tensor(np.zeros(sh, str(t.dtype))) for sh, t in zip(shapes, (*ins, out))]
    _TRACE.clear()
    ex(*args)
    return list(_TRACE)


def tir_plan(wl: Workload, target: Target, cfg: Mapping) -> Plan:
    """The conv2d template's `lowering="tir"` path (see the module docstring)."""
    m = machine(target)
    p = wl.p
    n, c, h, w, k = p["n"], p["c"], p["h"], p["w"], p["k"]
    r, s, pad = p["r"], p["s"], p["pad"]
    ho, wo = conv_out_hw(wl)
    hw = ho * wo
    c1, n1 = ceil_div(c, 16), ceil_div(k, 16)
    q_all = c1 * r * s  # K fractals (FRACTAL_Z order: c1, ry, rx)
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    mt1, kt1, nt1 = mt // 16, kt // 16, nt // 16
    padded = Workload.make(wl.op, {**dict(p), "c": c1 * 16, "k": n1 * 16}, wl.dtype)  # channels pad and pay
    key = (wl.op, tuple(sorted(dict(padded.params).items())), mt, kt, nt)
    if key not in _TRACES:  # a tile that cannot fit fails here, before paying for TVM (same sizes as check())
        dry = KernelBuilder(m)
        for level, name, nbytes in tir_buffers(wl, ConvGeometry(wl, target).max_rows(mt), cfg):
            dry.alloc(level, name, (nbytes // 2,), "float16")
        _TRACES[key] = trace(padded, mt, kt, nt)
    groups: list[tuple[tuple, list[tuple]]] = []  # (feature-map event in effect, events of one output tile)
    fm_ev: tuple = ()
    for ev in _TRACES[key]:
        if ev[0] == "fmap":
            fm_ev = ev
        elif ev[0] == "init":
            groups.append((fm_ev, [ev]))
        else:
            groups[-1][1].append(ev)

    def rows(ev: tuple) -> tuple[int, int]:
        """In-image input rows of a feature-map event (its rows are in padded coordinates)."""
        lo_p, ext = ev[3], ev[5]
        return max(lo_p - pad, 0), min(lo_p + ext - 1 - pad, h - 1)

    rows_max = max(hi - lo + 1 for lo, hi in (rows(g[0]) for g in groups))
    geom = ConvGeom(h=h, w=w, ho=ho, wo=wo, r=r, s=s, stride=p["stride"], dilation=p["dilation"],
                    pad_top=pad, pad_left=pad)
    active = min(cfg["block_dim"], len(groups))
    slots = 2 if cfg["double_buffer"] else 1
    bias, bn = wl.op == "conv2d_bias_relu", wl.op in ("conv2d_bn_relu", "conv2d_bn")

    def program(core: int):
        kb = KernelBuilder(m, core, active)
        X = kb.gm("data", (n, c1, h, w, 16), "float16")
        W = kb.gm("weight", (q_all, n1, 16, 16), "float16")
        Y = kb.gm("out", (n, n1, hw, 16), "float16")
        fm = [kb.alloc("L1", f"fmap_L1_{i}", (c1, rows_max, w, 16), "float16") for i in range(slots)]
        wl1 = [kb.alloc("L1", f"W_L1_{i}", (kt1, nt1, 16, 16), "float16") for i in range(slots)]
        l0a = [kb.alloc("L0A", f"A_L0A_{i}", (mt1, kt1, 16, 16), "float16") for i in range(slots)]
        l0b = [kb.alloc("L0B", f"B_L0B_{i}", (kt1, nt1, 16, 16), "float16") for i in range(slots)]
        c0 = kb.alloc("L0C", "C_L0C", (nt1, mt, 16), "float32")
        acc = kb.alloc("UB", "acc_UB", (nt1, mt, 16), "float32")
        o16 = kb.alloc("UB", "out_UB", (nt1, mt, 16), "float16")
        if bias:
            bias_gm = kb.gm("bias", (n1, 16), "float16")
            b16 = kb.alloc("UB", "bias_UB", (nt1, 16), "float16")
            b32 = kb.alloc("UB", "bias32_UB", (nt1, 16), "float32")
        if bn:
            sc_gm, sh_gm = kb.gm("scale", (n1, 16), "float16"), kb.gm("shift", (n1, 16), "float16")
            sc, sh = kb.alloc("UB", "scale_UB", (nt1, 16), "float16"), kb.alloc("UB", "shift_UB", (nt1, 16), "float16")
        lo_g, hi_g = split_even(len(groups), active, core)
        cnt = {"fmap": 0, "load3d": 0, "w_l1": 0, "ld_b": 0}
        cur_fm, h0, f = None, 0, fm[0]
        for fev, events in groups[lo_g:hi_g]:
            if fev != cur_fm:  # the pixel tile's input rows, all channel blocks: GM -> L1
                lo, hi = rows(fev)
                f = fm[cnt["fmap"] % slots]
                cnt["fmap"] += 1
                kb.data_move(f, (slice(None), slice(0, hi - lo + 1)), X, (fev[1], slice(None), slice(lo, hi + 1)))
                cur_fm, h0 = fev, lo
            first, kn, nn, b, p0, n1s = True, 0, nt1, 0, 0, 0
            for ev in events:
                tag = ev[0]
                if tag == "load3d":
                    b, p0, q0 = ev[1], ev[2], ev[3] // 16
                    kn = min(kt1, q_all - q0)  # pad_einsum's K padding is zero on both sides: not issued
                    if kn > 0:
                        kb.load3d(l0a[cnt["load3d"] % slots], f, geom, h0=h0, c1_0=0, p0=p0, mt=mt, q0=q0, kt1=kn)
                elif tag == "w_l1" and kn > 0:
                    q0, n1s = ev[1] // 16, ev[2] // 16
                    nn = min(nt1, n1 - n1s)
                    kb.data_move(wl1[cnt["w_l1"] % slots], (slice(0, kn), slice(0, nn)), W,
                                 (slice(q0, q0 + kn), slice(n1s, n1s + nn)))
                elif tag == "ld_b" and kn > 0:
                    kb.data_move(l0b[cnt["ld_b"] % slots], (slice(0, kn), slice(0, nn)),
                                 wl1[cnt["w_l1"] % slots], (slice(0, kn), slice(0, nn)))
                elif tag == "mmad" and kn > 0:
                    kb.mmad(c0, l0a[cnt["load3d"] % slots], l0b[cnt["ld_b"] % slots], mt1, kn, nn, init=first)
                    first = False
                    for key_ in cnt:  # one k step done: the next one uses the other ping-pong slots
                        if key_ != "fmap":
                            cnt[key_] += 1
                    kb.loop()
                elif tag == "l0c":  # the tile's (b, p0) came with its Load3Ds, n1s with its weight DMAs
                    kb.data_move(acc, (slice(0, nn), slice(None)), c0, (slice(0, nn), slice(None)))
                if tag in ("bias", "cast", "bn", "relu"):  # epilogue blocks: (image, channel, pixel) of the tile;
                    b, n1s, p0 = ev[1], ev[2] // 16, ev[3]  # the last one's coordinates place the GM write
                if tag == "bias":
                    kb.data_move(b16, (slice(0, nn),), bias_gm, (slice(n1s, n1s + nn),))
                    kb.vec("conv", VOp(b32), (VOp(b16),), nn * 16)
                    for jj in range(nn):
                        channel_op(kb, "add", acc, jj * mt * 16, mt, b32, jj * 16)
                elif tag == "cast":
                    kb.vec("conv", VOp(o16), (VOp(acc),), nn * mt * 16)
                elif tag == "bn":
                    kb.data_move(sc, (slice(0, nn),), sc_gm, (slice(n1s, n1s + nn),))
                    kb.data_move(sh, (slice(0, nn),), sh_gm, (slice(n1s, n1s + nn),))
                    for op, prm in (("mul", sc), ("add", sh)):
                        for jj in range(nn):
                            channel_op(kb, op, o16, jj * mt * 16, mt, prm, jj * 16)
                elif tag == "relu":
                    kb.vec("relu", VOp(o16), (VOp(o16),), nn * mt * 16)
            valid = min(mt, hw - p0)  # the last epilogue block wrote GM: UB -> GM (MTE3)
            kb.data_move(Y, (b, slice(n1s, n1s + nn), slice(p0, p0 + valid)), o16, (slice(0, nn), slice(0, valid)))
            kb.loop()
        return kb.finish(gm_inputs=("data", "weight", "bias", "scale", "shift"))

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        x, wt = inputs[0], inputs[1]
        wp = np.zeros((n1 * 16, c1 * 16, r, s), wt.dtype)
        wp[:k, :c] = wt
        wz = wp.reshape(n1, 16, c1, 16, r, s).transpose(2, 4, 5, 0, 1, 3)  # (c1, ry, rx, n1, 16, c0)
        gm = {"data": np.ascontiguousarray(to_5hd(x, "NCHW", 16).reshape(n, c1, h, w, 16)),
              "weight": np.ascontiguousarray(wz.reshape(q_all, n1, 16, 16))}

        def per_k(v: np.ndarray) -> np.ndarray:
            out = np.zeros(n1 * 16, "float16")
            out[:k] = v
            return out.reshape(n1, 16)

        if bias:
            gm["bias"] = per_k(inputs[2])
        if bn:
            gm["scale"], gm["shift"] = per_k(inputs[2]), per_k(inputs[3])
        return gm

    return Plan(active_cores=active, make_program=program, pack=pack, out_name="out", out_shape=(n, n1, hw, 16),
                out_dtype="float16", unpack=lambda y: from_5hd(y, k, ho, wo, "NCHW"), flops=get_op(wl.op).flops(wl),
                unit="cube", info={"lowering": "TVM s_tir schedule (implicit GEMM), blocks -> AI Core instructions",
                                   "tir_tiles": len(groups),
                                   "gm_layouts": {"data": "NC1HWC0 (channels zero-padded to 16)",
                                                  "weight": "FRACTAL_Z (C1*R*S,K1,16,C0)",
                                                  "out": "NC1HWC0 with H*W flattened"}})
