"""The Ascend ISA as a TVM schedule sees it: the one backend module `schedules/ascend` imports
(what TVM's `tir.tensor_intrin` modules are to a TVM target).

* buffer scopes (`L1`, `L0A`, `L0B`, `L0C`, `UB_SCOPE`, `GM`);
* the loop annotations and pragmas the vector lowerings read: `PRAGMA` (`pragma_emit_insn`, with
  the values `DMA_COPY`, `VECTOR_AUTO`, `REDUCE`, `VEC_TRANSPOSE`), `CORES` (the loop the cores
  share), `SLOTS` (ping-pong buffers), `ITEM_TILES` (a tile loop of a sequence under the cores loop);
* the instruction callback `EVENT` and the tensor intrinsics, parameterised by tile shape, scopes
  and dtypes (`intrin_mmad`, `intrin_init`, `intrin_copy`). Each TVMScript description is parsed
  once per process with symbolic extents and `specialize`d per tile shape (parsing costs about
  50 ms a function, specialising well under 1 ms);
* `substitute`: a block whose padding predicates or img2col index arithmetic TVM's structural
  matcher cannot tensorize is replaced by an opaque block calling the same event with the block
  coordinates of the instruction's first element;
* the machine's published figures a template's `check` reads (`figures(target)`: level
  capacities and alignment, the cube's fractal, lanes) and `l0c_slots`, the L0C ping-pong rule
  the cube lowerings allocate by (a template lists the same buffers in its capacity check).

No lowering, builder, program or trace lives here: `lower` (the package) turns a template's `Scheduled`
into the `Plan` the backend runs.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .machine import Machine

L1, L0A, L0B, L0C, UB_SCOPE, GM = "local.L1", "local.L0A", "local.L0B", "local.L0C", "local.UB", "global"
CORES = "opc.ascend.block_dim"  # the loop whose iterations the active cores share
SLOTS = "opc.ascend.double_buffer"  # 1: ping-pong buffers for the nests under that loop
PRAGMA = "pragma_emit_insn"  # a nest that is one instruction, of the kind its value names
DMA_COPY, VECTOR_AUTO = "dma_copy", "vector_auto"
REDUCE = "vector_reduce"  # a row reduction nest (vcadd / vcmax folds)
VEC_TRANSPOSE = "vector_transpose"  # a UB -> UB nest that swaps a tile's last axis with another (vnchwconv)
EVENT = "opc.ascend.tir.event"  # the packed call each tensorized block makes (`lower.trace` reads it)
ITEM_TILES = "opc.ascend.item_tiles"  # a tile loop of a sequence under the cores loop (concat)


def figures(target) -> Machine:
    """The target's published machine figures (levels' capacity and alignment, the cube's
    fractal per dtype, vector lanes) that a template's `check` reads."""
    return Machine.from_target(target)


def l0c_slots(m: Machine, double_buffer: bool, l0c_bytes: int) -> int:
    """Ping-pong slots of an output tile's L0C accumulator (the next tile's MMADs overlap this
    tile's epilogue): two where double buffering is on and two fit, else one (the direct
    template's rule). Templates list the same buffers in their capacity check."""
    return 2 if double_buffer and 2 * l0c_bytes <= m.level("L0C").capacity else 1


_REGISTERED: set[Hashable] = set()
_TEMPLATES: dict[Hashable, tuple[Any, Any]] = {}


# -- tensor intrinsics --------------------------------------------------------------------------
#
# Each `_tpl_*` parses a (desc, impl) pair whose extents are the trailing int32 parameters;
# `_register` specialises them to one tile shape and registers the pair under a name built from
# everything that distinguishes it. `lead` adds a leading unit axis (the conv GEMM's image axis).


def _tpl_copy(lead: bool, dtype: str, src: str, dst: str, tag: str, offset: str):
    from tvm.script import tirx as T

    if lead:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, rows: T.int32, cols: T.int32) -> None:
            S = T.match_buffer(a, (1, rows, cols), dtype, offset_factor=1, scope=src)
            D = T.match_buffer(b, (1, rows, cols), dtype, offset_factor=1, scope=dst)
            with T.sblock("root"):
                T.reads(S[0, 0:rows, 0:cols])
                T.writes(D[0, 0:rows, 0:cols])
                for i, j in T.grid(rows, cols):
                    with T.sblock("copy"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        D[0, vi, vj] = S[0, vi, vj]

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, rows: T.int32, cols: T.int32) -> None:
            s0, s1, d0, d1 = T.int32(), T.int32(), T.int32(), T.int32()
            S = T.match_buffer(a, (1, rows, cols), dtype, offset_factor=1, scope=src, strides=[s0, s1, 1])
            D = T.match_buffer(b, (1, rows, cols), dtype, offset_factor=1, scope=dst, strides=[d0, d1, 1])
            with T.sblock("root"):
                T.reads(S[0, 0:rows, 0:cols])
                T.writes(D[0, 0:rows, 0:cols])
                T.evaluate(T.call_packed(EVENT, tag, S.elem_offset if offset == "src" else
                                         (D.elem_offset if offset == "dst" else 0),
                                         s1 if offset == "src" else (d1 if offset == "dst" else 0)))
        return desc, impl

    @T.prim_func(s_tir=True)
    def desc2(a: T.handle, b: T.handle, rows: T.int32, cols: T.int32) -> None:
        S = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=src)
        D = T.match_buffer(b, (rows, cols), dtype, offset_factor=1, scope=dst)
        with T.sblock("root"):
            T.reads(S[0:rows, 0:cols])
            T.writes(D[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = S[vi, vj]

    @T.prim_func(s_tir=True)
    def impl2(a: T.handle, b: T.handle, rows: T.int32, cols: T.int32) -> None:
        s0, d0 = T.int32(), T.int32()
        S = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=src, strides=[s0, 1])
        D = T.match_buffer(b, (rows, cols), dtype, offset_factor=1, scope=dst, strides=[d0, 1])
        with T.sblock("root"):
            T.reads(S[0:rows, 0:cols])
            T.writes(D[0:rows, 0:cols])
            T.evaluate(T.call_packed(EVENT, tag, S.elem_offset if offset == "src" else
                                     (D.elem_offset if offset == "dst" else 0),
                                     s0 if offset == "src" else (d0 if offset == "dst" else 0)))
    return desc2, impl2


def _tpl_mmad(lead: int, in_dt: str, acc_dt: str, b_lead: int = -1):
    from tvm.script import tirx as T

    if lead == 1 and b_lead == 1:  # batched GEMM: A, B and C each lead with the batch
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            A = T.match_buffer(a, (1, mt, kt), in_dt, offset_factor=1, scope="local.L0A")
            B = T.match_buffer(b, (1, kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0, 0:kt, 0:nt])
                T.writes(C[0, 0:mt, 0:nt])
                for i, j, k in T.grid(mt, nt, kt):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[0, vi, vj] = C[0, vi, vj] + T.Cast(acc_dt, A[0, vi, vk]) * T.Cast(acc_dt, B[0, vk, vj])

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            sa, sb, sc0, sc1 = T.int32(), T.int32(), T.int32(), T.int32()
            A = T.match_buffer(a, (1, mt, kt), in_dt, offset_factor=1, scope="local.L0A", strides=[sa, sb, 1])
            B = T.match_buffer(b, (1, kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C", strides=[sc0, sc1, 1])
            with T.sblock("root"):
                T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0, 0:kt, 0:nt])
                T.writes(C[0, 0:mt, 0:nt])
                T.evaluate(T.call_packed(EVENT, "mmad", C.elem_offset, sc1))
        return desc, impl

    if lead == 2:  # grouped conv: A, C (image, group, M, .), B (group, K, N)
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            A = T.match_buffer(a, (1, 1, mt, kt), in_dt, offset_factor=1, scope="local.L0A")
            B = T.match_buffer(b, (1, kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, 1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads(C[0, 0, 0:mt, 0:nt], A[0, 0, 0:mt, 0:kt], B[0, 0:kt, 0:nt])
                T.writes(C[0, 0, 0:mt, 0:nt])
                for i, j, k in T.grid(mt, nt, kt):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[0, 0, vi, vj] = C[0, 0, vi, vj] + T.Cast(acc_dt, A[0, 0, vi, vk]) * T.Cast(acc_dt, B[0, vk, vj])

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            sa, sb, sa2, sc0, sc1, sc2 = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
            A = T.match_buffer(a, (1, 1, mt, kt), in_dt, offset_factor=1, scope="local.L0A", strides=[sa, sb, sa2, 1])
            B = T.match_buffer(b, (1, kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, 1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C", strides=[sc0, sc1, sc2, 1])
            with T.sblock("root"):
                T.reads(C[0, 0, 0:mt, 0:nt], A[0, 0, 0:mt, 0:kt], B[0, 0:kt, 0:nt])
                T.writes(C[0, 0, 0:mt, 0:nt])
                T.evaluate(T.call_packed(EVENT, "mmad", C.elem_offset, sc2))
        return desc, impl

    if lead:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            A = T.match_buffer(a, (1, mt, kt), in_dt, offset_factor=1, scope="local.L0A")
            B = T.match_buffer(b, (kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0:kt, 0:nt])
                T.writes(C[0, 0:mt, 0:nt])
                for i, j, k in T.grid(mt, nt, kt):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[0, vi, vj] = C[0, vi, vj] + T.Cast(acc_dt, A[0, vi, vk]) * T.Cast(acc_dt, B[vk, vj])

        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
            sa, sb, sc0, sc1 = T.int32(), T.int32(), T.int32(), T.int32()
            A = T.match_buffer(a, (1, mt, kt), in_dt, offset_factor=1, scope="local.L0A", strides=[sa, sb, 1])
            B = T.match_buffer(b, (kt, nt), in_dt, offset_factor=1, scope="local.L0B")
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C", strides=[sc0, sc1, 1])
            with T.sblock("root"):
                T.reads(C[0, 0:mt, 0:nt], A[0, 0:mt, 0:kt], B[0:kt, 0:nt])
                T.writes(C[0, 0:mt, 0:nt])
                T.evaluate(T.call_packed(EVENT, "mmad", C.elem_offset, sc1))
        return desc, impl

    @T.prim_func(s_tir=True)
    def desc2(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
        A = T.match_buffer(a, (mt, kt), in_dt, offset_factor=1, scope="local.L0A")
        B = T.match_buffer(b, (kt, nt), in_dt, offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads(C[0:mt, 0:nt], A[0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0:mt, 0:nt])
            for i, j, k in T.grid(mt, nt, kt):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast(acc_dt, A[vi, vk]) * T.Cast(acc_dt, B[vk, vj])

    @T.prim_func(s_tir=True)
    def impl2(a: T.handle, b: T.handle, c: T.handle, mt: T.int32, kt: T.int32, nt: T.int32) -> None:
        sc0 = T.int32()
        A = T.match_buffer(a, (mt, kt), in_dt, offset_factor=1, scope="local.L0A")
        B = T.match_buffer(b, (kt, nt), in_dt, offset_factor=1, scope="local.L0B")
        C = T.match_buffer(c, (mt, nt), acc_dt, offset_factor=1, scope="local.L0C", strides=[sc0, 1])
        with T.sblock("root"):
            T.reads(C[0:mt, 0:nt], A[0:mt, 0:kt], B[0:kt, 0:nt])
            T.writes(C[0:mt, 0:nt])
            T.evaluate(T.call_packed(EVENT, "mmad", C.elem_offset, sc0))
    return desc2, impl2


def _tpl_init(lead: int, acc_dt: str):
    from tvm import tirx
    from tvm.script import tirx as T

    zero = tirx.const(0, acc_dt)

    if lead == 2:
        @T.prim_func(s_tir=True)
        def desc(c: T.handle, mt: T.int32, nt: T.int32) -> None:
            C = T.match_buffer(c, (1, 1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0, 0, 0:mt, 0:nt])
                for i, j in T.grid(mt, nt):
                    with T.sblock("init"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        C[0, 0, vi, vj] = zero

        @T.prim_func(s_tir=True)
        def impl(c: T.handle, mt: T.int32, nt: T.int32) -> None:
            C = T.match_buffer(c, (1, 1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0, 0, 0:mt, 0:nt])
                T.evaluate(T.call_packed(EVENT, "init", C.elem_offset, 0))
        return desc, impl

    if lead:
        @T.prim_func(s_tir=True)
        def desc(c: T.handle, mt: T.int32, nt: T.int32) -> None:
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0, 0:mt, 0:nt])
                for i, j in T.grid(mt, nt):
                    with T.sblock("init"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        C[0, vi, vj] = zero

        @T.prim_func(s_tir=True)
        def impl(c: T.handle, mt: T.int32, nt: T.int32) -> None:
            C = T.match_buffer(c, (1, mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
            with T.sblock("root"):
                T.reads()
                T.writes(C[0, 0:mt, 0:nt])
                T.evaluate(T.call_packed(EVENT, "init", C.elem_offset, 0))
        return desc, impl

    @T.prim_func(s_tir=True)
    def desc2(c: T.handle, mt: T.int32, nt: T.int32) -> None:
        C = T.match_buffer(c, (mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mt, 0:nt])
            for i, j in T.grid(mt, nt):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = zero

    @T.prim_func(s_tir=True)
    def impl2(c: T.handle, mt: T.int32, nt: T.int32) -> None:
        C = T.match_buffer(c, (mt, nt), acc_dt, offset_factor=1, scope="local.L0C")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mt, 0:nt])
            T.evaluate(T.call_packed(EVENT, "init", 0, 0))
    return desc2, impl2


_TPL: dict[str, Callable[..., tuple[Any, Any]]] = {"copy": _tpl_copy, "mmad": _tpl_mmad, "init": _tpl_init}


def _register(kind: str, static: tuple, extents: tuple[int, ...]) -> str:
    """Register (once) the intrinsic `kind` with `static` parameters, specialised to `extents`."""
    from tvm.s_tir import TensorIntrin

    name = "opc_ascend_" + "_".join(str(s).replace(".", "") for s in (kind, *static, *extents))
    if name in _REGISTERED:
        return name
    tkey = (kind, *static)
    if tkey not in _TEMPLATES:
        _TEMPLATES[tkey] = _TPL[kind](*static)
    desc, impl = _TEMPLATES[tkey]
    n = len(extents)
    spec = [f.specialize(dict(zip(list(f.params)[-n:], extents))) for f in (desc, impl)]
    TensorIntrin.register(name, *spec, override=True)
    _REGISTERED.add(name)
    return name


def intrin_copy(rows: int, cols: int, dtype: str, src: str, dst: str, tag: str, offset: str = "",
                lead: bool = False) -> str:
    """A (rows, cols) copy between scopes; its event carries the src or dst element offset and
    row stride (`offset` = "src" / "dst"), or zeros."""
    return _register("copy", (lead, dtype, src, dst, tag, offset), (rows, cols))


def intrin_mmad(mt: int, kt: int, nt: int, in_dtype: str = "float16", acc_dtype: str = "float32",
                lead: int = 0, b_lead: int | None = None) -> str:
    """C[L0C] += A[L0A] x B[L0B] over one (mt, kt, nt) chunk; the event carries the chunk's element
    offset in the L0C tile and the tile's row stride (its first output channel). `lead` unit
    axes lead A and C (conv: the image; grouped conv: image and group, B then leads with the
    group); `b_lead`, when given, the unit axes leading B (batch_matmul: 1 with lead 1, each
    operand leads with the batch; 0 when every batch shares B)."""
    if b_lead is None or b_lead == max(0, lead - 1):  # the form `lead` implies
        return _register("mmad", (int(lead), in_dtype, acc_dtype), (mt, kt, nt))
    return _register("mmad", (int(lead), in_dtype, acc_dtype, int(b_lead)), (mt, kt, nt))


def intrin_init(mt: int, nt: int, acc_dtype: str = "float32", lead: int = 0) -> str:
    """The reduction init of an L0C tile (the tile's first MMAD overwrites)."""
    return _register("init", (int(lead), acc_dtype), (mt, nt))


# -- blocks the structural matcher cannot take ---------------------------------------------------


def substitute(sch, blk, n_inner: int, tag: str, extra: Callable[[list], Sequence] | None = None) -> None:
    """Replace the block's inner `n_inner` loops (one instruction's worth of work) with the event
    of `tag`, called with the block coordinates of the tile's first element (plus `extra(inner
    loops)`). blockize cannot take the unpadding predicate of a last partial tile, so the loop
    nest is replaced by an opaque block directly (`ScheduleState.replace`, the primitive
    tensorize itself uses)."""
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
    if extra is not None:
        args += list(extra(inner))
    body = tirx.Evaluate(tirx.call_packed(EVENT, tag, *args))
    new = SBlockRealize([], tirx.const(True, "bool"), SBlock([], [], [], realize.block.name_hint + "_instr", body))
    sch.state.replace(sch.get_sref(loops[-n_inner]), new)


__all__ = ["L1", "L0A", "L0B", "L0C", "UB_SCOPE", "GM", "CORES", "SLOTS", "PRAGMA", "DMA_COPY", "VECTOR_AUTO",
           "REDUCE", "ITEM_TILES", "EVENT", "figures", "l0c_slots", "intrin_copy", "intrin_mmad", "intrin_init",
           "substitute"]
