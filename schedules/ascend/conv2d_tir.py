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

MMAD and the reduction init go through `sch.tensorize` with registered tensor intrinsics. The
data-movement and epilogue blocks carry padding predicates and img2col index arithmetic that
TVM's structural tensorize matcher cannot match against a fixed description, so they are
blockized and their body is replaced (through `ScheduleState.replace`, the primitive tensorize
itself uses) by the same `T.call_packed("opc.ascend.tir.event", ...)` intrinsic carrying the
block's region origins that TVM computed. `tvm.compile(..., "llvm")` builds the loop nest;
one native run records the trace; each core's share of the output tiles is emitted through
`KernelBuilder` and run by the same simulator and pipe scheduler as the TIK-style template.
Padding that pad_einsum adds to K and N is zero on both operands, so the emitted MMAD / weight
DMA / Load3D clip to the real fractal counts; pixel padding is paid (Load3D fills zero rows).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.ascend import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import ConvGeom, VOp
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.workload import Workload

from .common import channel_op, from_5hd, machine, to_5hd

_REGISTERED: set[str] = set()
_TRACE: list[tuple] = []  # events, appended while the compiled kernel runs
_TRACES: dict[tuple, list[tuple]] = {}  # (op, padded params, tiles) -> trace: compile once per process
TIR_OPS = ("conv2d", "conv2d_bias_relu", "conv2d_bn_relu", "conv2d_bn")
EPI_TAGS = {"conv2d_bias": "bias", "conv2d_out": "cast", "batch_norm": "bn", "vrelu": "relu"}


def unsupported(wl: Workload) -> str | None:
    """Why the TIR path cannot lower this workload (None when it can)."""
    p = wl.p
    if wl.op not in TIR_OPS or wl.dtype != "float16":
        return f"lowering=tir covers fp16 {', '.join(TIR_OPS)} only"
    if p["groups"] != 1 or p["layout"] != "NCHW":
        return "lowering=tir covers groups=1 NCHW convolution only"
    return None


def _callbacks() -> None:
    import tvm

    if "callbacks" in _REGISTERED:
        return

    def event(*args: Any) -> int:
        _TRACE.append(tuple(a if isinstance(a, str) else int(a) for a in args))
        return 0

    tvm.register_global_func("opc.ascend.tir.event", event, override=True)
    _REGISTERED.add("callbacks")


def _mmad_intrinsics(mt: int, kt: int, nt: int) -> tuple[str, str]:
    """Register (once per tile shape) the MMAD and L0C-init tensor intrinsics; returns their names."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    key = f"{mt}x{kt}x{nt}"
    names = (f"opc_ascend_conv_mmad_{key}", f"opc_ascend_conv_init_{key}")
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
            T.evaluate(T.call_packed("opc.ascend.tir.event", "mmad", A.elem_offset, sb))

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
            T.evaluate(T.call_packed("opc.ascend.tir.event", "init", C.elem_offset, 0))

    TensorIntrin.register(names[0], mm_desc, mm_impl, override=True)
    TensorIntrin.register(names[1], init_desc, init_impl, override=True)
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
    body = tirx.Evaluate(tirx.call_packed("opc.ascend.tir.event", tag, *args))
    name = realize.block.name_hint + "_instr"
    new = SBlockRealize([], tirx.const(True, "bool"), SBlock([], [], [], name, body))
    sch.state.replace(sch.get_sref(loops[-n_inner]), new)


def trace(wl: Workload, mt: int, kt: int, nt: int) -> list[tuple]:
    """Schedule, lower into instructions, compile and run the (channel-padded) conv once."""
    import tvm
    from tvm import te

    _callbacks()
    mm_name, init_name = _mmad_intrinsics(mt, kt, nt)
    ins, out = get_op(wl.op).compute(wl)
    ho, wo = conv_out_hw(wl)
    r, s = wl["r"], wl["s"]
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    conv = sch.get_sblock("conv2d")
    flat = lambda b, k, y, x: (b, k, y * wo + x)  # noqa: E731 - the output pixels as one GEMM axis
    epi = []
    for name in ("conv2d_bias", "conv2d_out", "batch_norm", out.op.name):
        if name in EPI_TAGS and name not in [e[0] for e in epi]:
            try:
                blk = sch.get_sblock(name)
            except Exception:  # noqa: BLE001 - this op has no such epilogue block
                continue
            epi.append((name, blk))
            sch.transform_layout(blk, ("write", 0), flat)
            sch.transform_block_layout(blk, flat)
    sch.transform_layout(conv, ("write", 0), flat)
    for buf in (("write", 0), ("read", 0), ("read", 1)):
        sch.reindex(conv, buf)
    sch.transform_layout(conv, ("read", 0), lambda b, y, x, c, ry, rx: (b, y * wo + x, c * r * s + ry * s + rx))
    sch.transform_layout(conv, ("read", 1), lambda k, c, ry, rx: (c * r * s + ry * s + rx, k))
    sch.transform_layout(conv, ("write", 0), lambda b, k, y, x: (b, y * wo + x, k))
    sch.transform_block_layout(conv, lambda b, k, y, x, c, ry, rx: (b, y * wo + x, k, c * r * s + ry * s + rx))
    sch.pad_einsum(conv, [1, mt, nt, kt])
    for name in ("pad_reindex_reindex", "weight_reindex_reindex", "conv2d_reindex"):
        sch.compute_inline(sch.get_sblock(name))
    b, i, j, k = sch.get_loops(conv)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1 = sch.split(j, [None, nt])
    k0, _ = sch.split(k, [None, kt])
    sch.reorder(b, i0, j0, k0, i1, j1)
    sch.set_scope(conv, 0, "local.L0C")
    l0c = sch.get_sblock("conv2d_reindex_pad")
    sch.reverse_compute_at(l0c, j0)
    for _, blk in epi:  # producers first
        sch.reverse_compute_at(blk, j0)
    sch.set_scope(l0c, 0, "local.UB")
    for _, blk in epi[:-1]:  # the last epilogue block writes GM
        sch.set_scope(blk, 0, "local.UB")
    im2col, wpad = sch.get_sblock("pad_reindex_pad"), sch.get_sblock("weight_reindex_pad")
    b0 = sch.cache_read(conv, 1, "local.L0B")
    sch.set_scope(im2col, 0, "local.L0A")
    sch.set_scope(wpad, 0, "local.L1")
    for blk in (im2col, b0, wpad):  # consumers first
        sch.compute_at(blk, k0)
    padb = sch.get_sblock("pad")
    sch.compute_at(padb, i0)
    sch.set_scope(padb, 0, "local.L1")
    sch.transform_layout(padb, ("write", 0), lambda n, c, h, w: (n, c // 16, h, w, c % 16))
    init = sch.decompose_reduction(conv, k0)
    sch.tensorize(sch.get_loops(init)[-2], init_name)
    sch.tensorize(sch.get_loops(conv)[-3], mm_name)
    subs = [(padb, "fmap", "w"), (im2col, "load3d", "w"), (wpad, "w_l1", "w"), (b0, "ld_b", "w"),
            (l0c, "l0c", "w")] + [(blk, EPI_TAGS[name], "w") for name, blk in epi]
    for blk, tag, _ in subs:
        _substitute(sch, blk, 3 if tag == "fmap" else 2, tag)
    ex = tvm.compile(sch.mod, target="llvm")
    shapes = [[int(d) for d in t.shape] for t in ins] + [[wl["n"], wl["k"], ho * wo]]  # output pixels flattened
    args = [tvm.runtime.tensor(np.zeros(sh, str(t.dtype))) for sh, t in zip(shapes, (*ins, out))]
    _TRACE.clear()
    ex(*args)
    return list(_TRACE)
