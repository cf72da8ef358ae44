"""Lower a scheduled vector kernel (TIR) to the AI Core program, the TBE `emit_insn` way.

The template hands over an `s_tir.Schedule` module in which

    * one loop carries `opc.ascend.block_dim` (its iterations are shared over that many cores,
      first shares larger) and `opc.ascend.double_buffer` (0/1: ping-pong UB buffers between
      consecutive iterations); everything the kernel does happens inside it;
    * every loop nest inside it carries `pragma_emit_insn`: "dma_copy" (a copy between a GM
      buffer and a `local.UB` buffer: one MTE2 / MTE3 move) or "vector_auto" (the instruction
      is recognised from the statement's expression, as TBE's vector_auto does);
    * buffers that live on chip have scope `local.UB`.

`lower` runs the s_tir lowering (compact buffers to the tile, flatten) and walks the loop
nests: for every nest it evaluates the predicate and the index of every buffer access for all
iterations of the tile loop at once (numpy, not per scalar), so each iteration's element count
and offsets are known; an access that is not one contiguous run per iteration is refused.
A vector nest's expression is decomposed into vector instructions (`max(x, 0)` = vrelu,
`x + y` = vadd, `x * s` = vmuls, `1 / x` = vrec, `exp` / `log`, casts = vconv, ...), with
UB temporaries for inner nodes. UB buffers are then assigned to physical UB buffers by
liveness: a stage's result reuses the buffer of an operand that dies there (elementwise, so
in place is safe), which is how the TIK-style kernels reuse one tile buffer per operand. The
result (`VectorKernel`) is cached by the module's structural hash; `program(core)` emits that
core's instructions through `KernelBuilder`, where capacity and alignment are enforced.

Shaped modules may also hold, before the tile loop, `local.UB` buffers and `dma_copy` nests
that fill them (a prologue: per-channel parameters loaded once per core, resident outside the
ping-pong slots). A vector nest that reads such a buffer as one row for every row of the nest
(`p[plane % C1, c0]` beside `x[plane, pixel, c0]`) is a per-channel instruction
(`KernelBuilder.vec_channel`: block stride 0 for fp16, two half-row instructions for fp32, as
the TIK kernels' `channel_op`), whole repeats of 8 rows; the tile buffers of such a kernel are
then sized to whole repeats of rows, so the chain still runs in place.

Anything the lowering cannot map raises a one-line `OpcFailure` naming the nest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ....errors import OpcFailure
from ....sim.tir_expr import TIR, Compiler, NoRule
from .builder import KernelBuilder, split_even
from ..program import Program, VOp
from ..machine import Machine

from ..intrin import CORES, PRAGMA, SLOTS, UB_SCOPE  # noqa: E402 (the names schedules annotate with)

_CACHE: dict[int, "VectorKernel"] = {}
_CACHE_MAX = 256
Call: Any = None  # tvm.ir.expr.Call / TensorLoad, bound when tvm is imported
TensorLoad: Any = None


@dataclass
class _Access:
    buf: str  # logical buffer name (GM parameter or UB buffer or temporary)
    offset: np.ndarray | None  # per tile-loop iteration: first element's offset (None: temporary, 0)
    stride: int = 0  # shaped nests: elements between consecutive runs (0: one contiguous run)
    box: tuple[np.ndarray, np.ndarray] | None = None  # DMA of a shaped buffer: per iteration, starts, sizes
    contig: bool = True  # shaped nests: one contiguous run per iteration
    bcast: bool = False  # shaped nests: the same run for every run of the nest (a per-channel parameter)


@dataclass
class _Op:
    kind: str  # "dma" or "vec"
    nest: int
    dst: _Access
    srcs: list[_Access]
    op: str = ""  # vector op
    scalar: float = 0.0
    cnt: np.ndarray | None = None  # per iteration elements, when not the nest's count (shaped nests)
    run: int = 0  # shaped nests: elements per run when operands are strided runs (vec_items)
    chan: int = 0  # shaped nests: channels per row when an operand is a broadcast row (vec_channel)


class _TiledKernel:
    """A kernel of `iterations` tile iterations over GM tensors `gm`, shared by up to `cores`
    cores (`VectorKernel`, `reduce.RowKernel`)."""

    @property
    def active_cores(self) -> int:
        return max(1, min(self.cores, self.iterations))

    def _start(self, m: Machine, core: int) -> tuple[KernelBuilder, dict]:
        """Core `core`'s builder and its GM tensors (name -> buffer, in parameter order)."""
        kb = KernelBuilder(m, core, self.active_cores)
        return kb, {name: kb.gm(name, shape, dt) for name, (shape, dt) in self.gm.items()}


@dataclass(eq=False)
class VectorKernel(_TiledKernel):
    """What one scheduled module lowers to: GM tensors, the tile loop, the per-iteration ops
    on logical buffers, their physical UB buffers, and per-nest element counts."""

    gm: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype), in parameter order
    inputs: tuple[str, ...]
    output: str
    iterations: int
    cores: int
    slots: int
    nests: list[str]
    counts: np.ndarray  # (nests, iterations) elements per iteration
    ops: list[_Op]
    phys: list[tuple[str, int, str]]  # physical UB buffers: (name, elements, dtype)
    where: dict[str, int]  # logical UB buffer -> physical index
    info: dict[str, Any] = field(default_factory=dict)
    phys_shapes: list[tuple[int, ...]] | None = None  # shaped kernels: each physical buffer's shape
    resident: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)  # UB buffers outside the tile loop
    pre: list[_Op] = field(default_factory=list)  # ops before the tile loop (once per core, on resident buffers)

    def program(self, m: Machine, core: int) -> Program:
        kb, gm = self._start(m, core)
        res = {name: kb.alloc("UB", name, shp, dt) for name, shp, dt in self.resident}
        shapes = self.phys_shapes or [(n,) for _, n, _ in self.phys]
        slots = [[kb.alloc("UB", f"{name}_{s}", shp, dt) for (name, n, dt), shp in zip(self.phys, shapes)]
                 for s in range(self.slots)]
        lo, hi = split_even(self.iterations, self.active_cores, core)
        if self.pre:  # the prologue: resident buffers loaded once per core
            self._emit(kb, self.pre, lo, lambda a: gm[a.buf] if a.buf in gm else res[a.buf])
        for j, it in enumerate(range(lo, hi)):
            ub = slots[j % self.slots]
            self._emit(kb, self.ops, it, lambda a, ub=ub: gm[a.buf] if a.buf in gm else res[a.buf] if a.buf in res
                       else ub[self.where[a.buf]])
            kb.loop()
        return kb.finish(gm_inputs=self.inputs, lowering="emit_insn")

    def _emit(self, kb: KernelBuilder, ops: list[_Op], it: int, buf) -> None:
        """One tile iteration's instructions (or the prologue's, at the core's first iteration)."""

        def off(a: _Access) -> int:
            return 0 if a.offset is None else int(a.offset[it])

        for o in ops:
            cnt = int(self.counts[o.nest, it] if o.cnt is None else o.cnt[it])
            if cnt == 0:
                continue
            if o.chan:
                kb.vec_channel(o.op, VOp(buf(o.dst), off(o.dst)),
                               tuple(VOp(buf(s), off(s), 0 if s.bcast else 1) for s in o.srcs), cnt // o.chan,
                               o.chan, scalar=o.scalar)
            elif o.kind == "dma" and o.dst.box is not None:
                s, d = o.srcs[0], o.dst
                kb.data_move(buf(d), tuple(slice(int(a), int(a + z)) for a, z in zip(d.box[0][it], d.box[1][it])),
                             buf(s), tuple(slice(int(a), int(a + z)) for a, z in zip(s.box[0][it], s.box[1][it])))
            elif o.run:
                kb.vec_items(o.op, VOp(buf(o.dst), off(o.dst)), tuple(VOp(buf(s), off(s)) for s in o.srcs),
                             cnt // o.run, o.run, tuple(a.stride or o.run for a in (o.dst, *o.srcs)),
                             scalar=o.scalar)
            elif o.kind == "dma":
                s, d = o.srcs[0], o.dst
                kb.data_move(buf(d), (slice(off(d), off(d) + cnt),), buf(s), (slice(off(s), off(s) + cnt),))
            else:
                kb.vec(o.op, VOp(buf(o.dst), off(o.dst)), tuple(VOp(buf(s), off(s)) for s in o.srcs), cnt,
                       scalar=o.scalar)


# -- the lowering pipeline --------------------------------------------------------------------

def lower_module(mod, flatten: bool = True):
    """The s_tir lowering up to flattened buffers: blocks become loops, UB buffers are compacted
    to what one tile iteration touches and allocated inside the tile loop (`flatten=False`:
    buffers keep their shapes, for kernels whose GM tensors are not flat)."""
    import tvm
    import tvm.s_tir.transform as st
    import tvm.tirx.transform as tt

    seq = tvm.transform.Sequential([st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
                                    st.ConvertBlocksToOpaque(), st.CompactBufferAllocation(), st.LowerOpaqueBlock(),
                                    *([tt.FlattenBuffer()] if flatten else []), tt.StmtSimplify()])
    return seq(mod)


def lower(mod) -> VectorKernel:
    """The `VectorKernel` of a scheduled module (cached by structural hash)."""
    import tvm_ffi

    key = int(tvm_ffi.structural_hash(mod))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    shaped = any(len(b.shape) != 1 for b in mod["main"].params)
    vk = _ShapedLowering(lower_module(mod, flatten=False)).run() if shaped else _Lowering(lower_module(mod)).run()
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = vk
    return vk


class _Ctx:
    """One nest's iteration space: the tile loop x the nest's loops. Element counts and each
    access's first offset per tile iteration, for all iterations at once: in closed form when
    the nest is one loop with an affine predicate and affine indices (the common case), else by
    evaluating the expressions over the whole (iterations x elements) grid with numpy."""

    def __init__(self, low: "_Lowering", loops: list, pred, name: str):
        self.low, self.loops, self.pred, self.name = low, loops, pred, name
        self.ext = [int(lp.extent) for lp in loops]
        self.n_el = int(np.prod(self.ext)) if self.ext else 1
        self.U = low.iters
        self.tile = hash(low.tile_var)
        self.inner = hash(loops[0].loop_var) if len(loops) == 1 else None
        self._grid = None
        self._counts = self._closed_counts() if len(loops) <= 1 else None

    def _closed_counts(self) -> np.ndarray | None:
        T, u = self.low.T, np.arange(self.U, dtype=np.int64)
        if self.pred is None:
            return np.full(self.U, self.n_el, np.int64)
        p = self.pred
        if isinstance(p, (T.GT, T.GE)):  # a > b  is  b < a
            a, b, strict = p.b, p.a, isinstance(p, T.GT)
        elif isinstance(p, (T.LT, T.LE)):
            a, b, strict = p.a, p.b, isinstance(p, T.LT)
        else:
            return None
        la, lb = self.low._lin(a, self.tile, self.inner), self.low._lin(b, self.tile, self.inner)
        if la is None or lb is None:
            return None
        cu, ce, c = la[0] - lb[0], la[1] - lb[1], la[2] - lb[2]  # cu*u + ce*e + c < 0 (or <= 0)
        if ce <= 0:
            return None
        rhs = -c - cu * u  # e < rhs / ce  (or <=)
        n = -(-rhs // ce) if strict else rhs // ce + 1
        return np.clip(n, 0, self.n_el)

    def grid(self):
        """(env, mask, rank, first) over the full (iterations x elements) grid."""
        if self._grid is None:
            env = {self.tile: np.arange(self.U, dtype=np.int64).reshape(-1, 1)}
            inner = np.indices(self.ext, dtype=np.int64).reshape(len(self.ext), -1) if self.ext else \
                np.zeros((0, 1), np.int64)
            for k, lp in enumerate(self.loops):
                env[hash(lp.loop_var)] = inner[k].reshape(1, -1)
            mask = np.ones((self.U, self.n_el), bool) if self.pred is None else \
                np.broadcast_to(self.low._eval(self.pred, env, self.name), (self.U, self.n_el))
            self._grid = (env, mask, np.cumsum(mask, axis=1) - 1, np.argmax(mask, axis=1))
        return self._grid

    def counts(self) -> np.ndarray:
        if self._counts is None:
            self._counts = self.grid()[1].sum(axis=1)
        return self._counts

    def run_start(self, index, bname: str) -> np.ndarray:
        """Per iteration, the offset of the first element an access touches; the elements must be
        one contiguous ascending run."""
        if self._grid is None and self._counts is not None:
            lin = self.low._lin(index, self.tile, self.inner)
            if lin is not None and (lin[1] == 1 or self.n_el == 1):
                return lin[0] * np.arange(self.U, dtype=np.int64) + lin[2]
        env, mask, rank, first = self.grid()
        idx = np.broadcast_to(self.low._eval(index, env, self.name), mask.shape)
        base = idx[np.arange(idx.shape[0]), first]
        if not np.array_equal(idx[mask], (base[:, None] + rank)[mask]):
            raise OpcFailure(f"emit_insn: {self.name}: {bname} is not read/written as one contiguous run "
                             f"per iteration")
        return base.astype(np.int64)


def _dtype(e) -> str:
    return str(getattr(e.ty, "dtype", e.ty))


def _seq(stmt) -> list:
    from tvm import tirx
    if isinstance(stmt, tirx.SeqStmt):
        out = []
        for s in stmt.seq:
            out += _seq(s)
        return out
    return [stmt]


class _IndexExpr(Compiler):
    """The simulator core's TIR evaluator on the nodes a vector nest's indices and predicates use
    (integer arithmetic, TIR's floor division, comparisons, logic, `Cast` keeps the value,
    `likely(x)` is x); any other node (a float, `Div`, a load, `Select`, ...) is not an index
    here and fails as before. `names` records each variable's name by handle (for the error)."""

    NODES: frozenset[type] = frozenset()  # the TVM node classes an index uses (filled on first use)

    def __init__(self):
        super().__init__()
        self.names: dict[int, str] = {}
        if not _IndexExpr.NODES:
            _IndexExpr.NODES = frozenset((TIR.Var, TIR.IntImm, TIR.Cast, TIR.Add, TIR.Sub, TIR.Mul, TIR.FloorDiv,
                                          TIR.FloorMod, TIR.Min, TIR.Max, TIR.LT, TIR.LE, TIR.GT, TIR.GE, TIR.EQ,
                                          TIR.NE, TIR.And, TIR.Or, TIR.Not))

    def src(self, e) -> str:
        kind = type(e)  # the exact node class
        if kind is TIR.Call and e.op.name == "tirx.likely":
            return self.src(e.args[0])
        if kind not in self.NODES:
            raise NoRule(kind.__name__)
        if kind is TIR.Var:
            self.names[e.__chandle__()] = e.name
        return super().src(e)


_INDEX_FNS: dict[tuple[int, str], tuple[Any, Any, dict[int, str]]] = {}  # (expr handle, nest) -> (expr, fn, names)


def _index_fn(e, name: str):
    """`e` compiled once per nest (the expression is kept, so its handle stays its own)."""
    key = (e.__chandle__(), name)
    hit = _INDEX_FNS.get(key)
    if hit is None or not hit[0].same_as(e):
        c = _IndexExpr()
        try:
            fn = c.fn(e)
        except NoRule as x:
            raise OpcFailure(f"emit_insn: {name}: cannot evaluate index expression {x.args[0]}") from None
        if len(_INDEX_FNS) >= 4096:
            _INDEX_FNS.clear()
        hit = _INDEX_FNS[key] = (e, fn, c.names)
    return hit[1], hit[2]


class _Lowering:
    def __init__(self, mod):
        from tvm import tirx
        from tvm.ir.expr import Call as _Call, TensorLoad as _TensorLoad
        global Call, TensorLoad
        Call, TensorLoad = _Call, _TensorLoad
        self.T = tirx
        self.f = mod["main"]
        self.gm: dict[str, tuple[tuple[int, ...], str]] = {}
        self.gm_data: dict[int, str] = {}  # hash of a buffer (parameter or its declared alias) -> GM name
        for b in self.f.params:
            if len(b.shape) != 1:
                raise OpcFailure(f"emit_insn: GM tensor {b.name} has shape {list(b.shape)}; the vector lowering "
                                 f"streams flat tensors (transform_layout them to one axis)")
            self.gm[b.name] = (tuple(int(s) for s in b.shape), str(b.dtype))
            self.gm_data[hash(b)] = b.name
        self.ub: dict[Any, tuple[str, int, str]] = {}  # hash of a UB buffer -> (name, elements, dtype)
        self.ops: list[_Op] = []
        self.nests: list[str] = []
        self.counts: list[np.ndarray] = []
        self.tmp = 0
        self.shapes: dict[str, tuple[int, ...]] = {}  # shaped kernels: logical UB buffer -> shape

    def _alias(self, buf) -> bool:
        """A declared buffer over a parameter's data (what FlattenBuffer leaves): the parameter."""
        d = buf.data
        if isinstance(d, Call) and d.op.name == "tirx.buffer_data" and d.args[0].name in self.gm:
            self.gm_data[hash(buf)] = d.args[0].name
            return True
        return False

    def _add_ub(self, b) -> tuple[str, tuple[int, ...]]:
        """Record UB buffer `b` (its scope checked) under a name no other buffer has; returns the
        name and its shape."""
        if b.scope() != UB_SCOPE:
            raise OpcFailure(f"emit_insn: buffer {b.name} is in scope {b.scope()!r}, not {UB_SCOPE}")
        taken = {v[0] for v in self.ub.values()} | set(self.gm)
        name, k = b.name, 1
        while name in taken:  # two stages may share a tensor name (vmuls twice in a chain)
            name, k = f"{b.name}#{k}", k + 1
        shape = tuple(int(x) for x in b.shape)
        self.ub[hash(b)] = (name, int(np.prod(shape)), str(b.dtype))
        return name, shape

    # -- structure ---------------------------------------------------------------------------

    def run(self) -> VectorKernel:
        T = self.T
        tile = None
        for s in _seq(self.f.body):
            if isinstance(s, T.For) and CORES in s.annotations:
                if tile is not None:
                    raise OpcFailure("emit_insn: two loops carry opc.ascend.block_dim")
                tile = s
            elif isinstance(s, T.DeclBuffer):
                if self._alias(s.buffer):
                    continue
                raise OpcFailure(f"emit_insn: buffer {s.buffer.name} declared outside the tile loop")
            else:
                raise OpcFailure(f"emit_insn: statement outside the tile loop: {type(s).__name__}")
        if tile is None:
            raise OpcFailure("emit_insn: no loop carries opc.ascend.block_dim (the tile loop)")
        if int(tile.min) != 0:
            raise OpcFailure(f"emit_insn: tile loop {tile.loop_var.name} does not start at 0")
        self.iters = int(tile.extent)
        self.tile_var = tile.loop_var
        for s in _seq(tile.body):
            if isinstance(s, T.AllocBuffer):
                self._add_ub(s.buffer)
            elif isinstance(s, T.DeclBuffer) and self._alias(s.buffer):
                continue
            elif isinstance(s, T.AttrStmt) and s.attr_key == PRAGMA:
                self._nest(str(s.value.value if hasattr(s.value, "value") else s.value), s.body)
            elif isinstance(s, T.For):
                raise OpcFailure(f"emit_insn: nest over {s.loop_var.name} has no {PRAGMA} annotation")
            else:
                raise OpcFailure(f"emit_insn: cannot map {type(s).__name__} inside the tile loop")
        phys, where = self._assign()
        params = list(self.gm)
        return VectorKernel(gm=self.gm, inputs=tuple(params[:-1]), output=params[-1], iterations=self.iters,
                            cores=int(tile.annotations[CORES]), slots=2 if int(tile.annotations.get(SLOTS, 0)) else 1,
                            nests=self.nests, counts=np.array(self.counts, dtype=np.int64).reshape(len(self.nests), -1),
                            ops=self.ops, phys=phys, where=where)

    def _nest(self, pragma: str, stmt) -> None:
        loops, pred, stmt, name = _nest_parts(self.T, pragma, stmt, len(self.nests))
        ctx = _Ctx(self, loops, pred, name)
        counts = ctx.counts()
        self.nests.append(name)
        self.counts.append(counts)
        nest = len(self.nests) - 1
        dst = self._access(stmt.buffer, stmt.indices, ctx)
        val = stmt.value
        if pragma == "dma_copy":
            if not isinstance(val, TensorLoad):
                raise OpcFailure(f"emit_insn: {name} is not a copy")
            src = self._access(val.source, val.indices, ctx)
            if (src.buf in self.gm) == (dst.buf in self.gm):
                raise OpcFailure(f"emit_insn: {name} copies {src.buf} -> {dst.buf}; dma_copy moves between GM and UB")
            if str(val.source.dtype) != str(stmt.buffer.dtype):
                raise OpcFailure(f"emit_insn: {name} changes dtype in a DMA")
            self.ops.append(_Op("dma", nest, dst, [src]))
        elif pragma == "vector_auto":
            if dst.buf in self.gm:
                raise OpcFailure(f"emit_insn: {name} computes into GM buffer {dst.buf}; vector ops write UB")
            self._vec(val, dst, nest, ctx)
        else:
            raise OpcFailure(f"emit_insn: {name}: unknown {PRAGMA} {pragma!r} (dma_copy or vector_auto)")

    def _access(self, buffer, indices, ctx: "_Ctx") -> _Access:
        data = hash(buffer)
        if data in self.gm_data:
            bname = self.gm_data[data]
        elif data in self.ub:
            bname = self.ub[data][0]
        else:
            raise OpcFailure(f"emit_insn: {ctx.name} touches {buffer.name}, neither a GM parameter nor a UB buffer")
        if len(indices) != 1:
            raise OpcFailure(f"emit_insn: {ctx.name}: {buffer.name} is not flattened")
        return _Access(bname, ctx.run_start(indices[0], buffer.name))

    # -- expressions -------------------------------------------------------------------------

    def _eval(self, e, env, name) -> np.ndarray:
        """`e` over the loop grid `env` (a loop variable's hash -> its values), by the simulator
        core's one TIR evaluator (`sim/tir_expr`) restricted to index expressions (`_IndexExpr`)."""
        fn, names = _index_fn(e, name)
        try:
            return fn(env, None)
        except KeyError as k:
            var = names.get(k.args[0]) if k.args else None
            if var is None:
                raise
            raise OpcFailure(f"emit_insn: {name}: index uses {var}, not a loop of the nest") from None

    def _const(self, e) -> float | None:
        T = self.T
        if isinstance(e, (T.FloatImm, T.IntImm)):
            return float(e.value)
        if isinstance(e, T.Cast) and isinstance(e.value, (T.FloatImm, T.IntImm)):
            return float(e.value.value)
        return None

    def _temp(self, dtype: str, ctx: "_Ctx") -> _Access:
        self.tmp += 1
        tname = f"tmp{self.tmp}"
        self.ub[("tmp", self.tmp)] = (tname, ctx.n_el, dtype)
        return _Access(tname, None)

    def _operand(self, e, nest, ctx) -> _Access:
        """A tensor operand: a UB load, or an inner node computed into a temporary."""
        if isinstance(e, TensorLoad):
            a = self._access(e.source, e.indices, ctx)
            if a.buf in self.gm:
                raise OpcFailure(f"emit_insn: {ctx.name} reads GM buffer {a.buf} in a vector op (cache_read it "
                                 f"into {UB_SCOPE})")
            return a
        t = self._temp(_dtype(e), ctx)
        self._vec(e, t, nest, ctx)
        return t

    def _vec(self, e, dst: _Access, nest: int, ctx) -> None:
        T = self.T
        name = ctx.name
        c = self._const(e)
        if c is not None:
            self.ops.append(_Op("vec", nest, dst, [], op="dup", scalar=c))
            return
        if isinstance(e, TensorLoad):
            self.ops.append(_Op("vec", nest, dst, [self._operand(e, nest, ctx)], op="copy"))
            return
        if isinstance(e, T.Cast):
            self.ops.append(_Op("vec", nest, dst, [self._operand(e.value, nest, ctx)], op="conv"))
            return
        if isinstance(e, Call):
            unary = {"tirx.exp": "exp", "tirx.log": "ln", "tirx.sqrt": "sqrt", "tirx.fabs": "abs"}
            op = unary.get(e.op.name)
            if op is None:
                raise OpcFailure(f"emit_insn: {name}: no vector instruction for {e.op.name}")
            self.ops.append(_Op("vec", nest, dst, [self._operand(e.args[0], nest, ctx)], op=op))
            return
        kinds = {T.Add: ("add", "adds"), T.Sub: ("sub", None), T.Mul: ("mul", "muls"), T.Div: ("div", None),
                 T.Max: ("max", "maxs"), T.Min: ("min", "mins")}
        if type(e) not in kinds:
            raise OpcFailure(f"emit_insn: {name}: no vector instruction for {type(e).__name__}")
        vv, vs = kinds[type(e)]
        ca, cb = self._const(e.a), self._const(e.b)
        if ca is not None and cb is not None:
            raise OpcFailure(f"emit_insn: {name}: constant expression not folded")
        if isinstance(e, T.Div):
            if ca == 1.0:
                self.ops.append(_Op("vec", nest, dst, [self._operand(e.b, nest, ctx)], op="rec"))
                return
            if cb is not None and cb != 0:
                self.ops.append(_Op("vec", nest, dst, [self._operand(e.a, nest, ctx)], op="muls", scalar=1.0 / cb))
                return
            if ca is not None:
                raise OpcFailure(f"emit_insn: {name}: no vector instruction for {ca} / x")
        if isinstance(e, T.Sub):
            if cb is not None:
                self.ops.append(_Op("vec", nest, dst, [self._operand(e.a, nest, ctx)], op="adds", scalar=-cb))
                return
            if ca is not None:  # c - x = (x * -1) + c
                t = self._temp(_dtype(e), ctx)
                self.ops.append(_Op("vec", nest, t, [self._operand(e.b, nest, ctx)], op="muls", scalar=-1.0))
                self.ops.append(_Op("vec", nest, dst, [t], op="adds", scalar=ca))
                return
        if ca is not None or cb is not None:
            k, x = (ca, e.b) if ca is not None else (cb, e.a)
            if isinstance(e, T.Max) and k == 0.0:
                self.ops.append(_Op("vec", nest, dst, [self._operand(x, nest, ctx)], op="relu"))
            else:
                self.ops.append(_Op("vec", nest, dst, [self._operand(x, nest, ctx)], op=vs, scalar=k))
            return
        a = self._operand(e.a, nest, ctx)
        b = self._operand(e.b, nest, ctx)
        self.ops.append(_Op("vec", nest, dst, [a, b], op=vv))

    def _lin(self, e, tile: int, inner: int | None) -> tuple[int, int, int] | None:
        """(coefficient of the tile loop, of the nest's loop, constant) of an affine index, or None."""
        T = self.T
        if isinstance(e, T.Var):
            h = hash(e)
            return (1, 0, 0) if h == tile else (0, 1, 0) if h == inner else None
        if isinstance(e, T.IntImm):
            return 0, 0, int(e.value)
        if isinstance(e, T.Cast):
            return self._lin(e.value, tile, inner)
        if isinstance(e, (T.Add, T.Sub, T.Mul)):
            a, b = self._lin(e.a, tile, inner), self._lin(e.b, tile, inner)
            if a is None or b is None:
                return None
            if isinstance(e, T.Add):
                return a[0] + b[0], a[1] + b[1], a[2] + b[2]
            if isinstance(e, T.Sub):
                return a[0] - b[0], a[1] - b[1], a[2] - b[2]
            if a[:2] == (0, 0):
                return a[2] * b[0], a[2] * b[1], a[2] * b[2]
            if b[:2] == (0, 0):
                return b[2] * a[0], b[2] * a[1], b[2] * a[2]
        return None

    # -- UB assignment -----------------------------------------------------------------------

    def _assign(self, skip=()) -> tuple[list[tuple[str, int, str]], dict[str, int]]:
        """Logical UB buffers -> physical ones by liveness within one tile iteration; a result
        takes the buffer of an operand that dies at it (in place) when sizes and dtypes agree.
        `skip`: resident buffers (allocated once, outside the ping-pong slots)."""
        info = {name: (n, dt) for name, n, dt in self.ub.values() if name not in skip}
        last: dict[str, int] = {}
        for i, o in enumerate(self.ops):
            for a in [*o.srcs, o.dst]:
                if a.buf in info:
                    last[a.buf] = i
        phys: list[tuple[str, int, str]] = []
        where: dict[str, int] = {}
        free: list[int] = []
        for i, o in enumerate(self.ops):
            for s in o.srcs:
                if s.buf in info and s.buf not in where:
                    raise OpcFailure(f"emit_insn: {self.nests[o.nest]} reads {s.buf} before anything writes it")
            dying = [where[s.buf] for s in o.srcs if s.buf in info and last[s.buf] == i]
            d = o.dst.buf
            if d in info and d not in where:
                n, dt = info[d]
                shp = self.shapes.get(d)
                pick = next((p for p in dying + free if phys[p][1] == n and phys[p][2] == dt
                             and self.shapes.get(phys[p][0]) == shp), None)
                if pick is None:
                    phys.append((d, n, dt))
                    pick = len(phys) - 1
                where[d] = pick
                if pick in free:
                    free.remove(pick)
                if pick in dying:
                    dying.remove(pick)
            free += [p for p in dict.fromkeys(dying) if p not in free and p not in
                     [where[b] for b, li in last.items() if li > i and b in where]]
            if d in info and last.get(d) == i:  # written and never read
                free.append(where[d])
        return phys, where


class _SCtx:
    """One nest of a shaped kernel: the tile loop (axis 0) x the nest's loops, the instruction
    loops around the nest bound to constants. Indices are evaluated with numpy broadcasting over
    (iterations, *extents), so each access is known for every tile iteration at once."""

    def __init__(self, low: "_ShapedLowering", loops: list, pred, name: str, outer: dict):
        self.low, self.name = low, name
        self.ext = [int(lp.extent) for lp in loops]
        self.U = low.iters
        self.shape = (self.U, *self.ext)
        nd = len(self.shape)
        self.env = dict(outer)
        self.env[hash(low.tile_var)] = np.arange(self.U, dtype=np.int64).reshape((self.U,) + (1,) * (nd - 1))
        for k, lp in enumerate(loops):
            sh = [1] * nd
            sh[k + 1] = self.ext[k]
            self.env[hash(lp.loop_var)] = np.arange(self.ext[k], dtype=np.int64).reshape(sh)
        self.n_el = int(np.prod(self.ext)) if self.ext else 1
        self.run = self.ext[-1] if self.ext else 1  # elements per run: the innermost loop
        self.mask = np.ones(self.shape, bool) if pred is None else self.eval(pred).astype(bool)
        self.counts = self.mask.reshape(self.U, -1).sum(axis=1)
        # no predicate holds anything back: the checks below read the index arrays before they
        # are broadcast over the whole nest (a 25M-element BN nest: 21 s -> a few)
        self.full = bool(self.counts.sum() == self.U * self.n_el)

    def eval(self, e) -> np.ndarray:
        return np.broadcast_to(self.low._eval(e, self.env, self.name), self.shape)

    def _raw(self, buffer, indices, bname: str, mask: np.ndarray | None) -> list[np.ndarray]:
        """Each index evaluated (broadcastable to the nest, padded to its rank), checked in bounds
        where `mask` holds (None: the nest's predicate)."""
        shape = self.low.shape_of(buffer)
        if len(indices) != len(shape):
            raise OpcFailure(f"emit_insn: {self.name}: {bname} indexed with {len(indices)} indices, shape {shape}")
        full = mask is None and self.full
        nd = len(self.shape)
        out = []
        for d, (ix, n) in enumerate(zip(indices, shape)):
            r = np.asarray(self.low._eval(ix, self.env, self.name), dtype=np.int64)
            r = r.reshape((1,) * (nd - r.ndim) + r.shape)
            bad = bool(r.min() < 0 or r.max() >= n)  # the bounds of the unbroadcast values, every element
            if bad and not full:  # ... or only where the predicate holds
                v = np.broadcast_to(r, self.shape)
                bad = bool(((v < 0) | (v >= n))[self.mask if mask is None else mask].any())
            if bad:
                raise OpcFailure(f"emit_insn: {self.name}: {bname} axis {d} indexed outside 0..{n - 1}")
            out.append(r)
        return out

    def flat(self, buffer, indices, bname: str, mask: np.ndarray | None = None) -> np.ndarray:
        off = np.zeros((1,) * len(self.shape), np.int64)
        for v, n in zip(self._raw(buffer, indices, bname, mask), self.low.shape_of(buffer)):
            off = off * n + v
        if mask is None and self.full:
            self.low.reach[bname] = max(self.low.reach.get(bname, 0), int(off.max()) + 1)
            return np.broadcast_to(off, self.shape).reshape(self.U, -1)
        off = np.broadcast_to(off, self.shape).reshape(self.U, -1)
        m = (self.mask if mask is None else mask).reshape(self.U, -1)
        cnt = self.counts if mask is None else m.sum(axis=1)
        whole, part = cnt == self.n_el, np.flatnonzero((cnt > 0) & (cnt < self.n_el))
        tops = [int(off.max(axis=1)[whole].max())] if whole.any() else []
        if part.size:
            tops.append(int(off[part][m[part]].max()))
        if tops:
            self.low.reach[bname] = max(self.low.reach.get(bname, 0), max(tops) + 1)
        return off

    def operand(self, bname: str, buffer, indices) -> _Access:
        """A vector operand: one contiguous run per iteration, or runs of the innermost loop's
        extent at a constant stride (the active runs a prefix of the nest's)."""
        off = self.flat(buffer, indices, bname)
        m = self.mask.reshape(self.U, -1)
        # contiguous: each iteration's kept elements at consecutive offsets (checked directly on
        # the iterations the predicate keeps whole, through a running count on the others)
        first = np.argmax(m, axis=1)
        base = off[np.arange(self.U), first]
        whole = self.counts == self.n_el
        contig = bool(np.array_equal(off[whole] - base[whole, None],
                                     np.broadcast_to(np.arange(self.n_el), (int(whole.sum()), self.n_el))))
        part = np.flatnonzero(~whole)
        if contig and part.size:
            mp, op = m[part], off[part]
            contig = bool(np.array_equal(op[mp], (base[part, None] + np.cumsum(mp, axis=1) - 1)[mp]))
        E, items = self.run, self.n_el // max(self.run, 1)
        o3, m3 = off.reshape(self.U, items, E), m.reshape(self.U, items, E)
        stride = 0
        act = m3.any(axis=2)
        if (np.array_equal(o3 - o3[:, :, :1], np.broadcast_to(np.arange(E), o3.shape))
                and np.array_equal(act, m3.all(axis=2))
                and np.array_equal(act, np.arange(items)[None, :] < act.sum(axis=1)[:, None])):
            o0 = o3[:, :, 0]
            sig = int(o0[0, 1] - o0[0, 0]) if items > 1 else E
            if np.array_equal((o0 - o0[:, :1])[act], np.broadcast_to(sig * np.arange(items), o0.shape)[act]):
                stride, base = sig, o0[:, 0]
        resident = bname in self.low.resident_names
        if (not contig and stride == 0 and items > 1 or resident) and E > 1 and np.array_equal(
                o3 - o3[:, :1, :1], np.broadcast_to(np.arange(E), o3.shape)) and np.array_equal(act, m3.all(axis=2)):
            # one row read for every row of the nest (a single-row nest too, when it is a resident parameter)
            return _Access(bname, o3[:, 0, 0].astype(np.int64), contig=items == 1, bcast=True)
        if not contig and stride <= 0:
            raise OpcFailure(f"emit_insn: {self.name}: {bname} is neither one contiguous run nor evenly strided runs "
                             f"of the innermost loop per iteration")
        return _Access(bname, base.astype(np.int64), stride=stride, contig=contig)

    def box(self, bname: str, buffer, indices, mask: np.ndarray) -> _Access:
        """A DMA side: per iteration the box (start, size per axis) the masked elements fill, in
        the nest's order (so both sides of a copy pair up in C order). Iterations the mask keeps
        whole take their bounds from the unbroadcast index values; only the others (a tile
        loop's tail, a padded border) are reduced element by element."""
        U = self.U
        m = mask.reshape(U, -1)
        cnt = self.counts if mask is self.mask else m.sum(axis=1)
        whole = cnt == self.n_el
        part = np.flatnonzero(~whole)
        axes = tuple(range(1, len(self.shape)))
        raw = self._raw(buffer, indices, bname, None if mask is self.mask else mask)
        lo = np.stack([np.broadcast_to(r.min(axis=axes), (U,)) for r in raw], axis=1)
        hi = np.stack([np.broadcast_to(r.max(axis=axes), (U,)) for r in raw], axis=1)
        off = self.flat(buffer, indices, bname, None if mask is self.mask else mask)
        if off.shape[1] > 1 and not bool((off[whole, 1:] > off[whole, :-1]).all()):
            raise OpcFailure(f"emit_insn: {self.name}: {bname} is not one box per iteration in C order")
        if part.size:
            big = np.iinfo(np.int64).max
            mp = m[part]
            for d, r in enumerate(raw):
                c = np.broadcast_to(r, self.shape)[part].reshape(part.size, -1)
                lo[part, d] = np.where(mp, c, big).min(axis=1)
                hi[part, d] = np.where(mp, c, -1).max(axis=1)
            op = off[part]
            run = np.maximum.accumulate(np.where(mp, op, -1), axis=1)
            prev = np.concatenate([np.full((part.size, 1), -1), run[:, :-1]], axis=1)
            if (mp & (op <= prev)).any():
                raise OpcFailure(f"emit_insn: {self.name}: {bname} is not one box per iteration in C order")
        size = np.where(cnt[:, None] > 0, hi - lo + 1, 0)
        lo = np.where(cnt[:, None] > 0, lo, 0)
        if not np.array_equal(np.prod(size, axis=1), cnt):
            raise OpcFailure(f"emit_insn: {self.name}: {bname} is not one box per iteration in C order")
        return _Access(bname, None, box=(lo, size))


class _ShapedLowering(_Lowering):
    """The lowering for kernels whose tensors keep their shapes (NC1HWC0 planes, rows): DMAs
    move boxes (bursts counted from the shapes, as TIK's data_move), vector nests are one
    contiguous run or strided runs (pixels read with a window stride: `vec_items`), loops
    between the tile loop and a pragma'd nest are instruction loops (one instruction group per
    iteration), a dma_copy of `if_then_else(in_image, x[...], fill)` is a vector_dup of the fill
    over the nest then a DMA of the box where the condition holds (padding), and a reduction's
    init (vector_dup of the identity) folds into its first update (a copy)."""

    def __init__(self, mod):
        from tvm import tirx
        from tvm.ir.expr import Call as _Call, TensorLoad as _TensorLoad
        global Call, TensorLoad
        Call, TensorLoad = _Call, _TensorLoad
        self.T = tirx
        self.f = mod["main"]
        self.gm = {}
        self.gm_data = {}
        self.gm_shape: dict[int, tuple[int, ...]] = {}
        for b in self.f.params:
            self.gm[b.name] = (tuple(int(x) for x in b.shape), str(b.dtype))
            self.gm_data[hash(b)] = b.name
        self.ub = {}
        self.ops = []
        self.nests = []
        self.counts = []
        self.tmp = 0
        self.shapes = {}
        self.ub_shape: dict[int, tuple[int, ...]] = {}
        self.reach: dict[str, int] = {}  # buffer -> 1 + the largest flat offset any nest touches
        self.round: dict[str, int] = {}  # buffers a per-channel op touches -> its repeat, in elements
        self.resident: list[tuple[str, tuple[int, ...], str]] = []  # UB buffers before the tile loop
        self.resident_names: set[str] = set()
        self.pre: list[_Op] = []

    def shape_of(self, buffer) -> tuple[int, ...]:
        h = hash(buffer)
        if h in self.gm_data:
            return self.gm[self.gm_data[h]][0]
        return self.ub_shape[h]

    def run(self) -> VectorKernel:
        T = self.T
        tile, before = None, []
        for st in _seq(self.f.body):
            if isinstance(st, T.For) and CORES in st.annotations and tile is None:
                tile = st
            elif tile is None and (isinstance(st, T.AllocBuffer) or (isinstance(st, T.AttrStmt) and st.attr_key == PRAGMA
                                                                     and str(st.value.value if hasattr(st.value, "value")
                                                                             else st.value) == "dma_copy")):
                before.append(st)  # the prologue: resident UB buffers and their loads (per-channel parameters)
            else:
                raise OpcFailure(f"emit_insn: statement outside the tile loop: {type(st).__name__}")
        if tile is None:
            raise OpcFailure("emit_insn: no loop carries opc.ascend.block_dim (the tile loop)")
        self.iters = int(tile.extent)
        self.tile_var = tile.loop_var
        for st in before:
            self._body(st, {})
        resident = {name for name, _, _ in self.ub.values()}
        self.resident_names = resident
        self.pre, self.ops = self.ops, []
        for o in self.pre:
            if o.dst.buf not in resident or o.cnt is None or len(set(o.cnt.tolist())) != 1:
                raise OpcFailure(f"emit_insn: {self.nests[o.nest]}: a prologue copy loads a resident UB buffer "
                                 f"the same for every iteration")
        self._body(tile.body, {})
        self._fit()
        self._fold_inits()
        order = list(dict.fromkeys([o.dst.buf for o in self.pre] + sorted(resident)))  # in load order
        dts = {name: dt for name, _, dt in self.ub.values()}
        self.resident = [(name, self.shapes[name], dts[name]) for name in order]
        phys, where = self._assign(skip=resident)
        params = list(self.gm)
        return VectorKernel(gm=self.gm, inputs=tuple(params[:-1]), output=params[-1], iterations=self.iters,
                            cores=int(tile.annotations[CORES]), slots=2 if int(tile.annotations.get(SLOTS, 0)) else 1,
                            nests=self.nests, counts=np.array(self.counts, dtype=np.int64).reshape(len(self.nests), -1),
                            ops=self.ops, phys=phys, where=where,
                            phys_shapes=[self.shapes.get(name, (n,)) for name, n, _ in phys],
                            resident=self.resident, pre=self.pre)

    def _body(self, stmt, outer: dict) -> None:
        T = self.T
        for st in _seq(stmt):
            if isinstance(st, T.AllocBuffer):
                b = st.buffer
                name, shape = self._add_ub(b)
                self.ub_shape[hash(b)] = shape
                self.shapes[name] = shape
            elif isinstance(st, T.AttrStmt) and st.attr_key == PRAGMA:
                self._snest(str(st.value.value if hasattr(st.value, "value") else st.value), st.body, outer)
            elif isinstance(st, T.For):  # an instruction loop: one instruction group per iteration
                if int(st.min) != 0:
                    raise OpcFailure(f"emit_insn: loop {st.loop_var.name} does not start at 0")
                for v in range(int(st.extent)):
                    self._body(st.body, {**outer, hash(st.loop_var): np.int64(v)})
            else:
                raise OpcFailure(f"emit_insn: cannot map {type(st).__name__} inside the tile loop")

    def _snest(self, pragma: str, stmt, outer: dict) -> None:
        loops, pred, stmt, name = _nest_parts(self.T, pragma, stmt, len(self.nests))
        ctx = _SCtx(self, loops, pred, name, outer)
        self.nests.append(name)
        self.counts.append(ctx.counts)
        nest = len(self.nests) - 1
        dname = self._name(stmt.buffer, ctx)
        val = stmt.value
        if pragma == "dma_copy":
            fill = None
            if isinstance(val, Call) and val.op.name in ("tirx.if_then_else", "prim.if_then_else"):
                cond, val, fill = val.args[0], val.args[1], self._const(val.args[2])
                if fill is None:
                    raise OpcFailure(f"emit_insn: {name}: a padded copy fills with a constant")
            if not isinstance(val, TensorLoad):
                raise OpcFailure(f"emit_insn: {name} is not a copy")
            sname = self._name(val.source, ctx)
            if (sname in self.gm) == (dname in self.gm):
                raise OpcFailure(f"emit_insn: {name} copies {sname} -> {dname}; dma_copy moves between GM and UB")
            if str(val.source.dtype) != str(stmt.buffer.dtype):
                raise OpcFailure(f"emit_insn: {name} changes dtype in a DMA")
            mask = ctx.mask
            if fill is not None:
                if dname in self.gm:
                    raise OpcFailure(f"emit_insn: {name}: a padded copy writes UB")
                inside = ctx.eval(cond).astype(bool)
                outside = (ctx.mask & ~inside).reshape(ctx.U, -1).any(axis=1)
                self.ops.append(_Op("vec", nest, ctx.operand(dname, stmt.buffer, stmt.indices), [], op="dup",
                                    scalar=fill, cnt=np.where(outside, ctx.counts, 0)))
                mask = ctx.mask & inside
            self.ops.append(_Op("dma", nest, ctx.box(dname, stmt.buffer, stmt.indices, mask),
                                [ctx.box(sname, val.source, val.indices, mask)],
                                cnt=mask.reshape(ctx.U, -1).sum(axis=1)))
        elif pragma == "vector_auto":
            if dname in self.gm:
                raise OpcFailure(f"emit_insn: {name} computes into GM buffer {dname}; vector ops write UB")
            first = len(self.ops)
            self._vec(val, ctx.operand(dname, stmt.buffer, stmt.indices), nest, ctx)
            for o in self.ops[first:]:
                accs = [a for a in (o.dst, *o.srcs) if a.offset is not None]
                if any(a.bcast for a in o.srcs):
                    self._channel(o, ctx, name)
                    continue
                if all(a.contig for a in accs):
                    continue
                if any(a.stride <= 0 for a in accs):
                    raise OpcFailure(f"emit_insn: {name}: operands of {o.op} mix a run with strided runs")
                o.run = ctx.run
        else:
            raise OpcFailure(f"emit_insn: {name}: unknown {PRAGMA} {pragma!r} (dma_copy or vector_auto)")

    ROW_REPEAT = 8  # rows of channels one repeat of a per-channel op covers (256 B of fp16, 2 x 256 B of fp32)

    def _channel(self, o: _Op, ctx: "_SCtx", name: str) -> None:
        """A per-channel op: the destination and the other operands one contiguous run of whole
        rows of C0 channels, the broadcast operand one row (the parameter block). Emitted as the
        TIK kernels do (`KernelBuilder.vec_channel`: block stride 0 for fp16, two half-row
        instructions for 4-byte types), whole repeats of 8 rows: the buffers it touches reach
        up to the next multiple of 8 rows."""
        c0 = ctx.run
        if o.op not in ("add", "mul", "sub", "max", "min", "div") or len(o.srcs) != 2 or o.dst.bcast \
                or not all(a.contig or a.bcast for a in (o.dst, *o.srcs)) or any(a.offset is None for a in o.srcs):
            raise OpcFailure(f"emit_insn: {name}: a broadcast row operand needs a binary op on contiguous rows")
        if (c0 * np.dtype(self.ub_dtype(o.dst.buf)).itemsize) % 32:
            raise OpcFailure(f"emit_insn: {name}: a broadcast row of {c0} elements is not whole 32 B blocks")
        o.chan = c0
        rows = -(-ctx.counts // c0)
        for a in (o.dst, *o.srcs):
            if not a.bcast and a.buf not in self.gm:
                span = int((a.offset + -(-rows // self.ROW_REPEAT) * self.ROW_REPEAT * c0).max())
                self.reach[a.buf] = max(self.reach.get(a.buf, 0), span)
                self.round[a.buf] = self.ROW_REPEAT * c0

    def _name(self, buffer, ctx) -> str:
        h = hash(buffer)
        if h in self.gm_data:
            return self.gm_data[h]
        if h in self.ub:
            return self.ub[h][0]
        raise OpcFailure(f"emit_insn: {ctx.name} touches {buffer.name}, neither a GM parameter nor a UB buffer")

    def _access(self, buffer, indices, ctx) -> _Access:
        return ctx.operand(self._name(buffer, ctx), buffer, indices)

    def _fit(self) -> None:
        """UB buffers at the extent the nests reach: compaction keeps the region's bound, which a
        predicate clipping it to the tensor can leave loose; the outermost axis longer than one
        is cut to what is touched (the layout of every element stays as it is)."""
        for h, (name, n, dt) in list(self.ub.items()):
            shape = self.shapes.get(name)
            if shape is None or name not in self.reach or name in self.resident_names:
                continue
            k = next((i for i, x in enumerate(shape) if x > 1), None)
            if k is None:
                continue
            inner = int(np.prod(shape[k + 1:]))
            reach = self.reach[name]
            if self.round:  # per-channel kernels: every tile buffer at whole repeats of rows (in place),
                unit = max(self.round.values())  # also past the tensor's last row (the repeats' tail)
                rows = -(-(-(-reach // unit) * unit) // inner)
            else:
                rows = min(shape[k], -(-reach // inner))
            shape = (*shape[:k], rows, *shape[k + 1:])
            self.shapes[name] = shape
            self.ub[h] = (name, int(np.prod(shape)), dt)

    def _fold_inits(self) -> None:
        """A reduction's init (vector_dup of the combiner's identity) followed by its first update
        on the same region (`acc = acc (max|+) x`) becomes one copy `acc = x`."""
        out, i = [], 0
        while i < len(self.ops):
            o = self.ops[i]
            n = self.ops[i + 1] if i + 1 < len(self.ops) else None
            if (o.kind == "vec" and o.op == "dup" and o.cnt is None and n is not None and n.kind == "vec"
                    and n.op in ("max", "add") and len(n.srcs) == 2 and n.cnt is None
                    and o.dst.buf == n.dst.buf == n.srcs[0].buf and n.srcs[1].buf != o.dst.buf
                    and np.array_equal(o.dst.offset, n.dst.offset) and np.array_equal(o.dst.offset, n.srcs[0].offset)
                    and np.array_equal(self.counts[o.nest], self.counts[n.nest])
                    and o.scalar == self._identity(n.op, self.ub_dtype(o.dst.buf))):
                out.append(_Op("vec", n.nest, n.dst, [n.srcs[1]], op="copy", run=n.run))
                i += 2
                continue
            out.append(o)
            i += 1
        self.ops = out

    def ub_dtype(self, name: str) -> str:
        return next(dt for nm, _, dt in self.ub.values() if nm == name)

    @staticmethod
    def _identity(op: str, dtype: str) -> float:
        return 0.0 if op == "add" else float(np.finfo(dtype).min)


__all__ = ["VectorKernel", "lower", "lower_module", "CORES", "SLOTS", "PRAGMA", "UB_SCOPE"]


def _nest_parts(T, pragma: str, stmt, index: int):
    """A pragma'd nest: (its loops, from 0, outermost first; the predicate of its one store or
    None; the store; a name for messages). Anything else is a one-line OpcFailure."""
    loops = []
    while isinstance(stmt, T.For):
        if int(stmt.min) != 0:
            raise OpcFailure(f"emit_insn: loop {stmt.loop_var.name} does not start at 0")
        loops.append(stmt)
        stmt = stmt.body
    name = f"nest {index} ({'x'.join(str(int(lp.extent)) for lp in loops) or 'scalar'} over "
    pred = None
    if isinstance(stmt, T.IfThenElse):
        if stmt.else_case is not None:
            raise OpcFailure(f"emit_insn: {name}...) has an else branch")
        pred, stmt = stmt.condition, stmt.then_case
    if not isinstance(stmt, T.BufferStore):
        raise OpcFailure(f"emit_insn: {name}...) does not end in one buffer store ({type(stmt).__name__})")
    return loops, pred, stmt, name + f"{stmt.buffer.name}, {pragma})"
