"""Matmul lowered through TVM: an `s_tir.Schedule` over the catalogue's TE compute, buffers
placed in the target's scopes, every inner block tensorized into an AI Core instruction.

    matmul (fp32 reduce)  -> computed in local.L0C (cache_write), copied to local.UB
    A, B                  -> cache_read into local.L1, then into local.L0A / local.L0B
    matmul_bias, matmul_out (cast), vrelu
                          -> reverse_compute_at the output tile, in UB; the last block writes GM
    reduction init        -> decompose_reduction: the first MMAD of a tile overwrites L0C

Each tensorized block is a `T.call_packed("opc.ascend.tir.<instr>", ...)` carrying the GM
offsets and strides TVM computed. `tvm.compile(..., "llvm")` builds the loop nest; running it
once records the instruction trace, grouped by output tile; each core's program is its share
of the groups, emitted through `KernelBuilder` and run by the same simulator as the TIK-style
templates (ND -> fractal conversion by Load2D, NZ -> ND on the way from L0C to UB).
This path is `lowering="tir"` of the matmul template (matmul, matmul_bias, matmul_bias_relu in
fp16, tiles dividing the 16-padded shape); the TIK-style path stays the default.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import VOp
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.workload import Workload

from .common import machine, pad_to

_REGISTERED: set[str] = set()
_TRACE: list[list[tuple]] = []  # groups of events, filled while the compiled kernel runs
_TRACES: dict[tuple, list[list[tuple]]] = {}  # (op, padded shape, tiles) -> trace: compile once per process


def _callbacks() -> None:
    import tvm

    if "callbacks" in _REGISTERED:
        return

    def event(*args: Any) -> int:
        ev = tuple(a if isinstance(a, str) else int(a) for a in args)
        if ev[0] == "init":
            _TRACE.append([])  # a new output tile starts with its reduction init
        _TRACE[-1].append(ev)
        return 0

    tvm.register_global_func("opc.ascend.tir.event", event, override=True)
    _REGISTERED.add("callbacks")


def _intrinsics(mt: int, kt: int, nt: int) -> dict[str, str]:
    """Register (once per tile shape) the tensor intrinsics of this schedule; returns their names."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    key = f"{mt}x{kt}x{nt}"
    names = {k: f"opc_ascend_{k}_{key}" for k in ("dma_a", "dma_b", "ld_a", "ld_b", "mmad", "init", "l0c", "out",
                                                  "bias", "cast", "relu_out")}
    if key in _REGISTERED:
        return names

    def copy(rows: int, cols: int, dtype: str, src_scope: str, dst_scope: str, tag: str, with_offset: bool):
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle) -> None:
            S = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=src_scope)
            D = T.match_buffer(b, (rows, cols), dtype, offset_factor=1, scope=dst_scope)
            with T.sblock("root"):
                T.reads(S[0:rows, 0:cols])
                T.writes(D[0:rows, 0:cols])
                for i, j in T.grid(rows, cols):
                    with T.sblock("copy"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        D[vi, vj] = S[vi, vj]

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle) -> None:
            s0 = T.int32()
            S = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=src_scope, strides=[s0, 1])
            D = T.match_buffer(b, (rows, cols), dtype, offset_factor=1, scope=dst_scope)
            with T.sblock("root"):
                T.reads(S[0:rows, 0:cols])
                T.writes(D[0:rows, 0:cols])
                T.evaluate(T.call_packed("opc.ascend.tir.event", tag, S.elem_offset if with_offset else 0, s0))

        return desc, impl

    @T.prim_func(s_tir=True)
    def mm_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (mt, kt), "float16", offset_factor=1, scope="local.L0A")
        B = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads(C[0:mt, 0:nt], A[0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0:mt, 0:nt])
            for i, j, k in T.grid(mt, nt, kt):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", B[vk, vj])

    @T.prim_func(s_tir=True)
    def mm_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (mt, kt), "float16", offset_factor=1, scope="local.L0A")
        B = T.match_buffer(b, (kt, nt), "float16", offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads(C[0:mt, 0:nt], A[0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "mmad", 0, 0))

    @T.prim_func(s_tir=True)
    def init_desc(c: T.handle) -> None:
        C = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.float32(0)

    @T.prim_func(s_tir=True)
    def init_impl(c: T.handle) -> None:
        C = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "init", 0, 0))

    @T.prim_func(s_tir=True)
    def out_desc(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("cast"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = T.Cast("float16", S[vi, vj])

    @T.prim_func(s_tir=True)
    def out_impl(a: T.handle, b: T.handle) -> None:
        s0 = T.int32()
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1, strides=[s0, 1])
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "out", D.elem_offset, s0))

    @T.prim_func(s_tir=True)
    def bias_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        V = T.match_buffer(b, (nt,), "float16", offset_factor=1)
        D = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt], V[0:nt])
            T.writes(D[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("bias"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = S[vi, vj] + T.Cast("float32", V[vj])

    @T.prim_func(s_tir=True)
    def bias_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        V = T.match_buffer(b, (nt,), "float16", offset_factor=1)
        D = T.match_buffer(c, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt], V[0:nt])
            T.writes(D[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "bias", V.elem_offset, 0))

    @T.prim_func(s_tir=True)
    def cast_desc(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1, scope="local.UB")
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("cast"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = T.Cast("float16", S[vi, vj])

    @T.prim_func(s_tir=True)
    def cast_impl(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float32", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1, scope="local.UB")
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "cast", 0, 0))

    @T.prim_func(s_tir=True)
    def relu_desc(a: T.handle, b: T.handle) -> None:
        S = T.match_buffer(a, (mt, nt), "float16", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("relu"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = T.max(S[vi, vj], T.float16(0))

    @T.prim_func(s_tir=True)
    def relu_impl(a: T.handle, b: T.handle) -> None:
        s0 = T.int32()
        S = T.match_buffer(a, (mt, nt), "float16", offset_factor=1, scope="local.UB")
        D = T.match_buffer(b, (mt, nt), "float16", offset_factor=1, strides=[s0, 1])
        with T.sblock("root"):
            T.reads(S[0:mt, 0:nt])
            T.writes(D[0:mt, 0:nt])
            T.evaluate(T.call_packed("opc.ascend.tir.event", "relu_out", D.elem_offset, s0))

    reg = {
        "bias": (bias_desc, bias_impl), "cast": (cast_desc, cast_impl), "relu_out": (relu_desc, relu_impl),
        "dma_a": copy(mt, kt, "float16", "global", "local.L1", "dma_a", True),
        "dma_b": copy(kt, nt, "float16", "global", "local.L1", "dma_b", True),
        "ld_a": copy(mt, kt, "float16", "local.L1", "local.L0A", "ld_a", False),
        "ld_b": copy(kt, nt, "float16", "local.L1", "local.L0B", "ld_b", False),
        "l0c": copy(mt, nt, "float32", "local.L0C", "local.UB", "l0c", False),
        "mmad": (mm_desc, mm_impl), "init": (init_desc, init_impl), "out": (out_desc, out_impl),
    }
    for k, (desc, impl) in reg.items():
        TensorIntrin.register(names[k], desc, impl, override=True)
    _REGISTERED.add(key)
    return names


def trace(wl: Workload, mp: int, kp: int, np_: int, mt: int, kt: int, nt: int) -> list[list[tuple]]:
    """Schedule, tensorize, compile and run the padded matmul once; the instruction trace."""
    import tvm
    from tvm import te

    _callbacks()
    names = _intrinsics(mt, kt, nt)
    padded = Workload.make(wl.op, {**dict(wl.params), "m": mp, "k": kp, "n": np_, "trans_a": 0, "trans_b": 0},
                           wl.dtype)
    ins, out = get_op(wl.op).compute(padded)
    sch = tvm.s_tir.Schedule(te.create_prim_func([*ins, out]))
    mm, cast = sch.get_sblock("matmul"), sch.get_sblock("matmul_out")
    bias = sch.get_sblock("matmul_bias") if wl.op in ("matmul_bias", "matmul_bias_relu") else None
    relu = sch.get_sblock(out.op.name) if wl.op == "matmul_bias_relu" else None
    # the epilogue stays in UB until the last block writes GM
    for blk in (mm, bias, cast if relu is not None else None):
        if blk is not None:
            sch.set_scope(blk, 0, "local.UB")
    i, j, k = sch.get_loops(mm)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1 = sch.split(j, [None, nt])
    k0, k1 = sch.split(k, [None, kt])
    sch.reorder(i0, j0, k0, i1, j1, k1)
    l0c = sch.cache_write(mm, 0, "local.L0C")
    sch.reverse_compute_at(l0c, j0)
    for blk in (bias, cast, relu):  # producers first
        if blk is not None:
            sch.reverse_compute_at(blk, j0)
    a1 = sch.cache_read(mm, 0, "local.L1")
    b1 = sch.cache_read(mm, 1, "local.L1")
    a0 = sch.cache_read(mm, 0, "local.L0A")
    b0 = sch.cache_read(mm, 1, "local.L0B")
    for blk in (a0, b0, a1, b1):  # consumers first: L0 loads, then the DMAs feeding them
        sch.compute_at(blk, k0)
    init = sch.decompose_reduction(mm, k0)
    blocks = [(a1, "dma_a"), (b1, "dma_b"), (a0, "ld_a"), (b0, "ld_b"), (l0c, "l0c"), (init, "init")]
    blocks += [(bias, "bias")] if bias is not None else []
    blocks += [(cast, "cast"), (relu, "relu_out")] if relu is not None else [(cast, "out")]
    for blk, name in blocks:
        sch.tensorize(sch.get_loops(blk)[-2], names[name])
    sch.tensorize(i1, names["mmad"])
    ex = tvm.compile(sch.mod, target="llvm")
    args = [tvm.runtime.tensor(np.zeros([int(s) for s in t.shape], str(t.dtype))) for t in (*ins, out)]
    _TRACE.clear()
    ex(*args)
    return [list(g) for g in _TRACE]


def tir_plan(wl: Workload, target: Target, cfg: Mapping) -> Plan:
    """The matmul template's `lowering="tir"` path (see the module docstring)."""
    m = machine(target)
    M, K, N = wl["m"], wl["k"], wl["n"]
    mp, kp, np_ = ceil_div(M, 16) * 16, ceil_div(K, 16) * 16, ceil_div(N, 16) * 16
    mt, kt, nt = cfg["m_tile"], cfg["k_tile"], cfg["n_tile"]
    key = (wl.op, mp, kp, np_, mt, kt, nt)
    if key not in _TRACES:
        _TRACES[key] = trace(wl, mp, kp, np_, mt, kt, nt)
    groups = _TRACES[key]
    has_bias = wl.op in ("matmul_bias", "matmul_bias_relu")
    active = min(cfg["block_dim"], len(groups))
    slots = 2 if cfg["double_buffer"] else 1

    def program(core: int):
        kb = KernelBuilder(m, core, active)
        A, B = kb.gm("A", (mp, kp), "float16"), kb.gm("B", (kp, np_), "float16")
        C = kb.gm("C", (mp, np_), "float16")
        a1 = [kb.alloc("L1", f"A_L1_{s}", (mt, kt), "float16") for s in range(slots)]
        b1 = [kb.alloc("L1", f"B_L1_{s}", (kt, nt), "float16") for s in range(slots)]
        a0 = [kb.alloc("L0A", f"A_L0A_{s}", (mt // 16, kt // 16, 16, 16), "float16") for s in range(slots)]
        b0 = [kb.alloc("L0B", f"B_L0B_{s}", (kt // 16, nt // 16, 16, 16), "float16") for s in range(slots)]
        c0 = kb.alloc("L0C", "C_L0C", (nt // 16, mt, 16), "float32")
        ub = kb.alloc("UB", "C_UB", (mt, nt), "float32")
        ub16 = kb.alloc("UB", "C_UB16", (mt, nt), "float16")
        if has_bias:
            bias_gm = kb.gm("bias", (np_,), "float16")
            b16 = kb.alloc("UB", "bias_UB", (nt,), "float16")
            b32 = kb.alloc("UB", "bias32_UB", (nt,), "float32")
        lo, hi = split_even(len(groups), active, core)
        n = {"dma_a": 0, "dma_b": 0, "ld_a": 0, "ld_b": 0}
        for group in groups[lo:hi]:
            first = False
            for tag, off, stride in group:
                if tag == "init":
                    first = True
                elif tag in ("dma_a", "dma_b"):
                    buf, src = (a1, A) if tag == "dma_a" else (b1, B)
                    r, c = divmod(off, stride)
                    dst = buf[n[tag] % slots]
                    kb.data_move(dst, (slice(None),), src, (slice(r, r + dst.shape[0]), slice(c, c + dst.shape[1])))
                elif tag == "ld_a":
                    kb.data_move(a0[n["ld_a"] % slots], (slice(None),), a1[n["dma_a"] % slots], (slice(None),),
                                 transform="nd2zz")
                elif tag == "ld_b":
                    kb.data_move(b0[n["ld_b"] % slots], (slice(None),), b1[n["dma_b"] % slots], (slice(None),),
                                 transform="nd2fz")
                elif tag == "mmad":
                    kb.mmad(c0, a0[n["ld_a"] % slots], b0[n["ld_b"] % slots], mt // 16, kt // 16, nt // 16,
                            init=first)
                    first = False
                    for key in n:  # one k step done: the next one uses the other ping-pong slots
                        n[key] += 1
                    kb.loop()
                elif tag == "l0c":
                    kb.data_move(ub, (slice(None),), c0, (slice(None),), transform="nz2nd")
                elif tag == "bias":  # bias row to UB, to fp32, added to every row of the tile
                    kb.data_move(b16, (slice(None),), bias_gm, (slice(off, off + nt),))
                    kb.vec("conv", VOp(b32), (VOp(b16),), nt)
                    for row in range(mt):
                        kb.vec("add", VOp(ub, row * nt), (VOp(ub, row * nt), VOp(b32)), nt)
                elif tag == "cast":
                    kb.vec("conv", VOp(ub16), (VOp(ub),), mt * nt)
                elif tag in ("out", "relu_out"):
                    r, c = divmod(off, stride)
                    if tag == "out":
                        kb.vec("conv", VOp(ub16), (VOp(ub),), mt * nt)
                    else:
                        kb.vec("relu", VOp(ub16), (VOp(ub16),), mt * nt)
                    kb.data_move(C, (slice(r, r + mt), slice(c, c + nt)), ub16, (slice(None),))
                    kb.loop()
        return kb.finish(gm_inputs=("A", "B", "bias"))

    trans_a, trans_b = bool(wl.p.get("trans_a")), bool(wl.p.get("trans_b"))

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        a = inputs[0].T if trans_a else inputs[0]
        b = inputs[1].T if trans_b else inputs[1]
        gm = {"A": np.ascontiguousarray(pad_to(pad_to(a, 0, mp), 1, kp)),
              "B": np.ascontiguousarray(pad_to(pad_to(b, 0, kp), 1, np_))}
        if has_bias:
            gm["bias"] = pad_to(inputs[2].astype("float16"), 0, np_)
        return gm

    return Plan(active_cores=active, make_program=program, pack=pack, out_name="C", out_shape=(mp, np_),
                out_dtype="float16", unpack=lambda c: np.ascontiguousarray(c[:M, :N]), flops=get_op(wl.op).flops(wl),
                unit="cube", info={"lowering": "TVM s_tir schedule, tensorized blocks -> AI Core instructions",
                                   "tir_tiles": len(groups),
                                   "gm_layouts": {"A": "ND (zero-padded to 16; Load2D converts to zZ)",
                                                  "B": "ND (zero-padded; Load2D converts to FRACTAL_Z)",
                                                  "C": "ND (L0C NZ -> ND on the way to UB)"}})
