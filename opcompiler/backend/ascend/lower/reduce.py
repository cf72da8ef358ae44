"""Lower a scheduled row-reduction kernel (TIR) to the AI Core program: reduce_sum / reduce_max /
softmax over the last axis of an (m, n) tensor, and layer_norm / add_layer_norm over the last axis
of (rows, cols), the TBE way (UB tiles of rows, pragma'd nests).

The template hands over an `s_tir.Schedule` module in which

    * the tile loop (rows of the output, split by the template's row tile) carries
      `opc.ascend.block_dim` and `opc.ascend.double_buffer`, as for every emit_insn kernel;
    * inside it, nests with `pragma_emit_insn` = "dma_copy" (a box GM <-> UB) or "vector_auto"
      (an element-wise nest over the tile's rows: casts, over whole padded rows), and a plain
      loop over the tile's rows (a row loop) whose body holds, per row, `vector_reduce` nests
      (the pragma on the reduction loop: `acc = acc + x[r, k]` or `acc = max(acc, x[r, k])`)
      and `vector_auto` nests over one row (a broadcast of a reduced scalar, sub, exp, div);
    * 2-D UB buffers of the tile have their rows aligned (storage_align) to 16 elements;
    * before the tile loop, UB buffers and nests that run once per core (layer norm: gamma and
      beta GM -> UB, their fp32 casts), before the core's first tile;
    * a tile may hold several row loops (layer norm: three), element-wise nests between them
      over a (rows, 1) tile buffer of per-row values (its statistics: `x * s`, `x + s`, sqrt, 1 / x).

`lower` evaluates every nest's predicate and indices for all tile iterations at once (numpy),
so each instruction's element count and offsets are known per iteration. A `vector_reduce`
nest becomes the fold the TIK kernels use: vcadd / vcmax reduce each 256 B repeat to one
element into a scratch buffer, the partials are folded again (into the scratch's upper half)
until one repeat is left, the last instruction writes the result; the init of the reduction
(the identity) is not emitted (the fold never reads the accumulator). A broadcast of a scalar
is a `dups` (vector_dup of a scalar loaded from UB). Buffers allocated in the row loop are
placed by liveness at the granularity of one row: a (1, 1) buffer in the shared scalar buffer,
a (1, n) buffer in the current row of a tile buffer whose row is free there (the row loop's
output row before it is written, an input row after its last read in the tile: in this row loop,
and by nothing after it), an element-wise result in the row of an operand that dies at it (in
place). Each row costs one loop-control step.

Anything else raises a one-line `OpcFailure` naming the nest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ....errors import OpcFailure
from .builder import KernelBuilder, ceil_div, split_even
from ..program import Program, VOp
from .vector import CORES, PRAGMA, SLOTS, UB_SCOPE, _Lowering, _TiledKernel, _nest_parts, _seq, lower_module
from ..machine import Machine

from ..intrin import REDUCE  # noqa: E402 (the pragma of a row reduction nest)
SCRATCH, SCALAR = "scratch", "scalar"

_CACHE: dict[int, "RowKernel"] = {}
_CACHE_MAX = 256


@dataclass
class _Ref:
    """An operand: physical buffer name and per-iteration first element's offset."""

    buf: str
    off: np.ndarray


@dataclass
class _Step:
    kind: str  # "dma", "vec", "fold", "loop"
    cnt: np.ndarray  # per tile iteration: elements (dma: elements; loop: 1 where the row exists)
    dst: Any = None  # _Ref, or for dma (name, starts (U, d), sizes (U, d))
    srcs: tuple = ()
    op: str = ""
    scalar: float = 0.0  # muls / adds: the immediate


@dataclass(eq=False)
class RowKernel(_TiledKernel):
    """What one scheduled row kernel lowers to: GM tensors, the tile loop, per-iteration steps on
    physical UB buffers (per ping-pong slot, or shared: the fold scratch, the scalar)."""

    gm: dict[str, tuple[tuple[int, ...], str]]
    inputs: tuple[str, ...]
    output: str
    iterations: int
    cores: int
    slots: int
    steps: list[_Step]
    tile_bufs: list[tuple[str, tuple[int, ...], str]]
    shared: list[tuple[str, tuple[int, ...], str]]
    nests: int = 0
    pre: list[_Step] = field(default_factory=list)  # once per core, before its first tile (layer norm's gamma)
    info: dict[str, Any] = field(default_factory=dict)

    def program(self, m: Machine, core: int) -> Program:
        kb, gm = self._start(m, core)
        shared = {name: kb.alloc("UB", name, shp, dt) for name, shp, dt in self.shared}
        slots = [{name: kb.alloc("UB", f"{name}_{s}", shp, dt) for name, shp, dt in self.tile_bufs}
                 for s in range(self.slots)]
        lo, hi = split_even(self.iterations, self.active_cores, core)
        if hi > lo:
            for st in self.pre:
                _issue(kb, st, lo, lambda name: gm.get(name) or shared[name], shared)
        for j, it in enumerate(range(lo, hi)):
            ub = slots[j % self.slots]

            def buf(name: str, ub=ub):
                return gm.get(name) or shared.get(name) or ub[name]

            for st in self.steps:
                _issue(kb, st, it, buf, shared)
            kb.loop()
        return kb.finish(gm_inputs=self.inputs, lowering="emit_insn (row reductions)")


def _issue(kb: KernelBuilder, st: _Step, it: int, buf, shared: dict) -> None:
    """One step at tile iteration `it` (nothing where it has no element there)."""
    cnt = int(st.cnt[it])
    if cnt == 0:
        return
    if st.kind == "loop":
        kb.loop()
    elif st.kind == "dma":
        (dn, dlo, dsz), (sn, slo, ssz) = st.dst, st.srcs[0]
        kb.data_move(buf(dn), tuple(slice(int(a), int(a + z)) for a, z in zip(dlo[it], dsz[it])),
                     buf(sn), tuple(slice(int(a), int(a + z)) for a, z in zip(slo[it], ssz[it])))
    elif st.kind == "fold":
        fold(kb, st.op, buf(st.srcs[0].buf), int(st.srcs[0].off[it]), cnt, shared[SCRATCH],
             buf(st.dst.buf), int(st.dst.off[it]))
    else:
        kb.vec(st.op, VOp(buf(st.dst.buf), int(st.dst.off[it])),
               tuple(VOp(buf(s.buf), int(s.off[it])) for s in st.srcs), cnt, st.scalar)


def fold(kb: KernelBuilder, op: str, src, soff: int, count: int, scratch, dst, doff: int) -> None:
    """Reduce `count` elements at src[soff:] to dst[doff] with repeated vcadd / vcmax: each
    repeat to one element in the scratch, the partials folded into its upper half, and so on."""
    lanes = kb.m.lanes(max(src.itemsize, scratch.itemsize))
    cur, off = src, soff
    while count > lanes:
        kb.vec(op, VOp(scratch, 0), (VOp(cur, off),), count)
        cur, off, count = scratch, 0, ceil_div(count, lanes)
        if count > lanes:
            kb.vec(op, VOp(scratch, scratch.shape[0] // 2), (VOp(scratch, 0),), count)
            cur, off, count = scratch, scratch.shape[0] // 2, ceil_div(count, lanes)
    kb.vec(op, VOp(dst, doff), (VOp(cur, off),), count)


def lower(mod) -> RowKernel:
    """The `RowKernel` of a scheduled module (cached by structural hash)."""
    import tvm_ffi

    key = int(tvm_ffi.structural_hash(mod))
    hit = _CACHE.get(key)
    if hit is None:
        hit = _RowLowering(lower_module(mod, flatten=False)).run()
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = hit
    return hit


@dataclass
class _Buf:
    name: str
    shape: tuple[int, ...]  # logical
    strides: tuple[int, ...]
    dtype: str
    where: str = ""  # "gm", "tile", "row"


class _RowLowering:
    def __init__(self, mod):
        from tvm import tirx
        from tvm.ir.expr import Call, TensorLoad

        self.T, self.Call, self.TensorLoad = tirx, Call, TensorLoad
        self.ev = _Lowering.__new__(_Lowering)  # its index evaluator (numpy over the grid)
        self.ev.T = tirx
        from . import vector as ei
        ei.Call, ei.TensorLoad = Call, TensorLoad  # what its evaluator matches against
        self.f = mod["main"]
        self.bufs: dict[int, _Buf] = {}
        self.gm: dict[str, tuple[tuple[int, ...], str]] = {}
        for b in self.f.params:
            shape = tuple(int(s) for s in b.shape)
            self.gm[b.name] = (shape, str(b.dtype))
            self.bufs[hash(b)] = _Buf(b.name, shape, _dense(shape), str(b.dtype), "gm")
        self.steps: list[_Step] = []
        self.tile_bufs: list[tuple[str, tuple[int, ...], str]] = []
        self.shared_bufs: list[tuple[str, tuple[int, ...], str]] = []
        self.scratch: tuple[int, str] | None = None
        self.scalar_dt: str | None = None
        self.nests = 0

    # -- structure ---------------------------------------------------------------------------

    def run(self) -> RowKernel:
        T = self.T
        tile = None
        prologue = []  # before the tile loop: UB buffers and nests run once per core
        for s in _seq(self.f.body):
            if isinstance(s, T.For) and CORES in s.annotations and tile is None:
                tile = s
            elif isinstance(s, T.For):
                raise OpcFailure("emit_reduce: no loop carries opc.ascend.block_dim (the tile loop) "
                                 f"around the nest over {s.loop_var.name}")
            elif tile is None and (isinstance(s, T.AllocBuffer) or (isinstance(s, T.AttrStmt)
                                                                     and s.attr_key == PRAGMA)):
                prologue.append(s)
            else:
                raise OpcFailure(f"emit_reduce: statement outside the tile loop: {type(s).__name__}")
        if tile is None:
            raise OpcFailure("emit_reduce: no loop carries opc.ascend.block_dim (the tile loop)")
        self.U = int(tile.extent)
        self.tile = hash(tile.loop_var)
        body = _seq(tile.body)
        names = set(self.gm)
        for s in prologue:
            if isinstance(s, T.AllocBuffer):
                self._alloc(s.buffer, "shared", names)
            else:
                self._nest(_pragma(s), s.body, {})
        pre, self.steps = self.steps, []
        for s in body:
            if isinstance(s, T.AllocBuffer):
                self._alloc(s.buffer, "tile", names)
        # per row loop: the tile buffers read by what follows it (their rows stay live in it)
        after: list[set[str]] = []
        for i, s in enumerate(body):
            if isinstance(s, T.For) and PRAGMA not in s.annotations:
                after.append(set().union(*(self._reads(x) for x in body[i + 1:] if not isinstance(x, T.AllocBuffer))))
        rows = iter(after)
        for s in body:
            if isinstance(s, T.AllocBuffer):
                continue
            if isinstance(s, T.AttrStmt) and s.attr_key == PRAGMA:
                self._nest(_pragma(s), s.body, {})
            elif isinstance(s, T.For):
                self.after_rows = next(rows)
                self._rows(s, names)
            else:
                raise OpcFailure(f"emit_reduce: cannot map {type(s).__name__} inside the tile loop")
        shared = list(self.shared_bufs)
        if self.scratch is not None:
            shared.append((SCRATCH, (self.scratch[0],), self.scratch[1]))
        if self.scalar_dt is not None:
            shared.append((SCALAR, (16,), self.scalar_dt))
        params = list(self.gm)
        return RowKernel(gm=self.gm, inputs=tuple(params[:-1]), output=params[-1], iterations=self.U,
                         cores=int(tile.annotations[CORES]), slots=2 if int(tile.annotations.get(SLOTS, 0)) else 1,
                         steps=self.steps, tile_bufs=self.tile_bufs, shared=shared, nests=self.nests, pre=pre)

    def _alloc(self, b, where: str, names: set) -> None:
        if b.scope() != UB_SCOPE:
            raise OpcFailure(f"emit_reduce: buffer {b.name} is in scope {b.scope()!r}, not {UB_SCOPE}")
        name, k = b.name, 1
        while name in names:
            name, k = f"{b.name}#{k}", k + 1
        names.add(name)
        shape = tuple(int(x) for x in b.shape)
        strides = tuple(int(x) for x in b.strides) if len(b.strides) else _dense(shape)
        self.bufs[hash(b)] = _Buf(name, shape, strides, str(b.dtype), where)
        if where in ("tile", "shared"):  # physical: the rows at their aligned stride
            phys = (shape[0], strides[0]) if len(shape) == 2 else shape
            (self.tile_bufs if where == "tile" else self.shared_bufs).append((name, phys, str(b.dtype)))

    def _reads(self, stmt) -> set[str]:
        out: set[str] = set()

        def visit(e):
            if hash(e.source) in self.bufs:
                out.add(self.bufs[hash(e.source)].name)
        self._walk(stmt, visit)
        return out

    def _walk(self, node, visit) -> None:
        T = self.T
        if isinstance(node, T.SeqStmt):
            for s in node.seq:
                self._walk(s, visit)
        elif isinstance(node, (T.For, T.AttrStmt)):
            self._walk(node.body, visit)
        elif isinstance(node, T.IfThenElse):
            self._walk(node.then_case, visit)
        elif isinstance(node, T.BufferStore):
            self._walk(node.value, visit)
        elif isinstance(node, self.TensorLoad):
            visit(node)
        else:
            for a in ("a", "b", "value"):
                if hasattr(node, a) and not isinstance(getattr(node, a), (int, float)):
                    self._walk(getattr(node, a), visit)
            for a in getattr(node, "args", ()) if isinstance(node, self.Call) else ():
                self._walk(a, visit)

    # -- the row loop ------------------------------------------------------------------------

    def _rows(self, loop, names: set) -> None:
        """The row loop: per row, its nests; row-local buffers placed by liveness (one row)."""
        T = self.T
        if int(loop.min) != 0:
            raise OpcFailure(f"emit_reduce: loop {loop.loop_var.name} does not start at 0")
        body = _seq(loop.body)
        nests = []
        for s in body:
            if isinstance(s, T.AllocBuffer):
                self._alloc(s.buffer, "row", names)
            elif isinstance(s, T.AttrStmt) and s.attr_key == PRAGMA:
                nests.append(s)
            else:
                raise OpcFailure(f"emit_reduce: cannot map {type(s).__name__} in the row loop")
        rv = hash(loop.loop_var)
        for r in range(int(loop.extent)):
            first = len(self.steps)
            for s in nests:
                self._nest(_pragma(s), s.body, {rv: np.int64(r)}, row=(r, loop))
            active = np.zeros(self.U, np.int64)
            for st in self.steps[first:]:
                active |= (st.cnt > 0).astype(np.int64)
            self._place(self.steps[first:], r)
            self.steps.append(_Step("loop", active))

    def _place(self, steps: list[_Step], r: int) -> None:
        """Row-local buffers -> the shared scalar or a row of a tile buffer (see the docstring)."""
        info = {b.name: b for b in self.bufs.values()}
        local = {b.name for b in self.bufs.values() if b.where == "row"}
        uses: dict[str, list[int]] = {}
        for i, st in enumerate(steps):
            for a in (st.dst, *st.srcs):
                uses.setdefault(a.buf, []).append(i)
        tiles2 = [n for n in uses if info[n].where == "tile" and len(info[n].shape) == 2]
        out_rows = [n for n in tiles2 if any(steps[i].dst.buf == n for i in uses[n])]
        holder: dict[str, str | None] = {n: (None if n in out_rows else n) for n in tiles2}  # row slot -> holder
        where: dict[str, tuple[str, int]] = {}  # row-local -> (tile buffer or SCALAR, offset of the row)
        scalar_holder: str | None = None
        # a row's scalars are what its folds produce (the max, the sum); a one-element row of a
        # one-column tile (n = 1) is still a row
        scalars = {st.dst.buf for st in steps if st.kind == "fold"}

        def dies(name: str, i: int) -> bool:
            return uses[name][-1] == i and (info[name].where == "row" or name not in self.after_rows)

        for i, st in enumerate(steps):
            dying = [s.buf for s in st.srcs if dies(s.buf, i)]
            d = st.dst.buf
            if d in local and d not in where:
                b = info[d]
                if d in scalars:
                    if scalar_holder is not None:
                        raise OpcFailure(f"emit_reduce: two row scalars live at once ({scalar_holder}, {d})")
                    if self.scalar_dt not in (None, b.dtype):
                        raise OpcFailure("emit_reduce: row scalars of two dtypes")
                    self.scalar_dt = b.dtype
                    where[d], scalar_holder = (SCALAR, 0), d
                else:
                    fit = [n for n in tiles2 if info[n].dtype == b.dtype and info[n].shape[1] == b.shape[-1]]
                    in_place = [n for n in fit if holder[n] in dying]
                    free = [n for n in fit if holder[n] is None]
                    pick = next((n for n in out_rows if n in in_place), None) or (in_place[0] if in_place else None) \
                        or next((n for n in out_rows if n in free), None) or (free[0] if free else None)
                    if pick is None:
                        raise OpcFailure(f"emit_reduce: no free row of a tile buffer for {d}")
                    where[d] = (pick, r * info[pick].strides[0])
                    holder[pick] = d
            elif d in holder:  # the row loop's output row: written in place over a dying operand or free
                if holder[d] not in (None, d) and holder[d] not in dying:
                    raise OpcFailure(f"emit_reduce: {d}'s row is still held by {holder[d]}")
                holder[d] = d
            for n in holder:
                if holder[n] in dying and holder[n] != d:
                    holder[n] = None
            if scalar_holder in dying:
                scalar_holder = None
        for st in steps:
            for a in (st.dst, *st.srcs):
                if a.buf in where:
                    a.buf, base = where[a.buf]
                    a.off = a.off + base

    # -- nests -------------------------------------------------------------------------------

    def _nest(self, pragma: str, stmt, outer: dict, row=None) -> None:
        T = self.T
        self.nests += 1
        init = None
        if pragma == REDUCE:  # the reduction loop: [if pred:] [if k == 0: init]; update
            loops = []
            while isinstance(stmt, T.For):
                loops.append(stmt)
                stmt = stmt.body
            pred = None
            if isinstance(stmt, T.IfThenElse) and isinstance(stmt.then_case, T.SeqStmt):
                pred, stmt = stmt.condition, stmt.then_case
            parts = _seq(stmt)
            if len(parts) == 2 and isinstance(parts[0], T.IfThenElse):
                init, stmt = parts[0].then_case, parts[1]
            elif len(parts) == 2 and isinstance(parts[0], T.BufferStore) and len(loops) == 1 \
                    and int(loops[0].extent) == 1:  # a reduction of one element: `k == 0` always holds
                init, stmt = parts[0], parts[1]
            elif len(parts) == 1:
                stmt = parts[0]
            if not isinstance(stmt, T.BufferStore) or len(loops) != 1:
                raise OpcFailure(f"emit_reduce: {pragma} nest is not one reduction loop over one update")
            name = f"nest {self.nests} ({stmt.buffer.name}, {pragma})"
        else:
            loops, pred, stmt, name = _nest_parts(T, pragma, stmt, self.nests)
        env = dict(outer)
        ext = [int(lp.extent) for lp in loops]
        nd = len(ext) + 1
        env[self.tile] = np.arange(self.U, dtype=np.int64).reshape((self.U,) + (1,) * (nd - 1))
        for k, lp in enumerate(loops):
            sh = [1] * nd
            sh[k + 1] = ext[k]
            env[hash(lp.loop_var)] = np.arange(ext[k], dtype=np.int64).reshape(sh)
        shape = (self.U, *ext)
        mask = np.ones(shape, bool) if pred is None else np.broadcast_to(self._eval(pred, env, name), shape).astype(bool)
        m2 = mask.reshape(self.U, -1)
        cnt = m2.sum(axis=1)
        dst = self._buf(stmt.buffer, name)
        val = stmt.value
        if pragma == "dma_copy":
            if not isinstance(val, self.TensorLoad):
                raise OpcFailure(f"emit_reduce: {name} is not a copy")
            src = self._buf(val.source, name)
            if (src.where == "gm") == (dst.where == "gm") or src.dtype != dst.dtype:
                raise OpcFailure(f"emit_reduce: {name} is not a same-dtype copy between GM and UB")
            self.steps.append(_Step("dma", cnt, self._box(dst, stmt.indices, env, mask, name),
                                    (self._box(src, val.indices, env, mask, name),)))
            return
        if dst.where == "gm":
            raise OpcFailure(f"emit_reduce: {name} computes into GM buffer {dst.name}")
        if pragma == REDUCE:
            op = self._combiner(stmt, init, name)
            src = self._buf(op[1].source, name)
            self._scratch(src)
            self.steps.append(_Step("fold", cnt, self._ref(dst, stmt.indices, env, mask, name, scalar=True),
                                    (self._ref(src, op[1].indices, env, mask, name),), op=op[0]))
            return
        if pragma != "vector_auto":
            raise OpcFailure(f"emit_reduce: {name}: unknown {PRAGMA} {pragma!r}")
        # element-wise: over whole aligned rows of the tile (casts) or over one row
        rows = len(ext) == 2
        d = self._ref(dst, stmt.indices, env, mask, name, rows=rows)
        op, srcs, imm = self._vop(val, env, mask, name, rows)
        if rows:  # the padding lanes of aligned rows ride along: one run of rows x row stride
            stride = dst.strides[0]
            if any(self._stride(s.buf) != stride for s in srcs):
                raise OpcFailure(f"emit_reduce: {name}: operands with different row strides")
            cnt = m2.reshape(self.U, ext[0], ext[1]).any(axis=2).sum(axis=1) * stride
        elif len(ext) != 1:
            raise OpcFailure(f"emit_reduce: {name}: a vector nest over rows x columns or one row")
        self.steps.append(_Step("vec", cnt, d, tuple(srcs), op=op, scalar=imm))

    def _stride(self, name: str) -> int:
        return next(b.strides[0] for b in self.bufs.values() if b.name == name)

    def _invariant(self, load, env, mask, name) -> bool:
        off = self._flat(self.bufs[hash(load.source)], load.indices, env, mask.shape, name)
        m2 = mask.reshape(self.U, -1)
        o2 = off.reshape(self.U, -1)
        return bool(m2.sum() > 1 and np.all((o2 == o2[:, :1]) | ~m2))

    def _combiner(self, stmt, init, name):
        T = self.T
        v = stmt.value
        kind = {T.Add: "cadd", T.Max: "cmax"}.get(type(v))
        if kind is None or not isinstance(v.a, self.TensorLoad) or not isinstance(v.b, self.TensorLoad) \
                or not v.a.source.same_as(stmt.buffer):
            raise OpcFailure(f"emit_reduce: {name}: a reduction is acc + x or max(acc, x)")
        if init is not None:
            c = init.value
            ident = 0.0 if kind == "cadd" else float(np.finfo(str(stmt.buffer.dtype)).min)
            cv = float(c.value) if isinstance(c, (T.FloatImm, T.IntImm)) else None
            if cv is None or (cv != ident and not (kind == "cmax" and cv <= ident)):
                raise OpcFailure(f"emit_reduce: {name}: the reduction starts from {c}, not its identity")
        if str(v.b.source.dtype) != str(stmt.buffer.dtype):
            raise OpcFailure(f"emit_reduce: {name}: a reduction reads and writes one dtype")
        return kind, v.b

    def _scratch(self, src: _Buf) -> None:
        rs = src.strides[0] if len(src.shape) == 2 else src.shape[-1]
        n = 2 * (ceil_div(rs, 64) + 64)
        if self.scratch is not None and self.scratch[1] != src.dtype:
            raise OpcFailure("emit_reduce: reductions of two dtypes in one kernel")
        self.scratch = (max(n, self.scratch[0] if self.scratch else 0), src.dtype)

    def _vop(self, e, env, mask, name, rows):
        """(vector op, source refs, immediate) of an element-wise nest's value."""
        T = self.T
        if isinstance(e, self.TensorLoad):
            ref = self._load(e, env, mask, name, rows)
            return ("dups" if self._invariant(e, env, mask, name) else "copy"), [ref], 0.0
        if isinstance(e, T.Cast):
            if not isinstance(e.value, self.TensorLoad):
                raise OpcFailure(f"emit_reduce: {name}: a cast of a load")
            return "conv", [self._load(e.value, env, mask, name, rows)], 0.0
        unary = {"tirx.exp": "exp", "tirx.log": "ln", "tirx.sqrt": "sqrt"}
        if isinstance(e, self.Call) and e.op.name in unary and isinstance(e.args[0], self.TensorLoad):
            return unary[e.op.name], [self._load(e.args[0], env, mask, name, rows)], 0.0
        if isinstance(e, T.Div) and isinstance(e.a, (T.FloatImm, T.IntImm)) and float(e.a.value) == 1.0 \
                and isinstance(e.b, self.TensorLoad):
            return "rec", [self._load(e.b, env, mask, name, rows)], 0.0  # layer norm's 1 / sqrt(var + eps)
        kinds = {T.Add: "add", T.Sub: "sub", T.Mul: "mul", T.Div: "div", T.Max: "max", T.Min: "min"}
        if type(e) in kinds and isinstance(e.a, self.TensorLoad) and isinstance(e.b, self.TensorLoad):
            return kinds[type(e)], [self._load(e.a, env, mask, name, rows), self._load(e.b, env, mask, name, rows)], 0.0
        scalar = {T.Mul: "muls", T.Add: "adds"}
        if type(e) in scalar and isinstance(e.a, self.TensorLoad) and isinstance(e.b, (T.FloatImm, T.IntImm)):
            return scalar[type(e)], [self._load(e.a, env, mask, name, rows)], float(e.b.value)  # reduce_mean's 1/n
        raise OpcFailure(f"emit_reduce: {name}: no vector instruction for {type(e).__name__}")

    def _load(self, e, env, mask, name, rows) -> _Ref:
        b = self._buf(e.source, name)
        if b.where == "gm":
            raise OpcFailure(f"emit_reduce: {name} reads GM buffer {b.name} in a vector op (cache_read it)")
        if self._invariant(e, env, mask, name):  # a scalar broadcast over the nest (dups)
            off = self._flat(b, e.indices, env, mask.shape, name).reshape(self.U, -1)
            m2 = mask.reshape(self.U, -1)
            return _Ref(b.name, off[np.arange(self.U), np.argmax(m2, axis=1)].astype(np.int64))
        return self._ref(b, e.indices, env, mask, name, rows=rows)

    # -- accesses ----------------------------------------------------------------------------

    def _eval(self, e, env, name):
        return self.ev._eval(e, env, name)

    def _buf(self, buffer, name) -> _Buf:
        b = self.bufs.get(hash(buffer))
        if b is None:
            raise OpcFailure(f"emit_reduce: {name} touches {buffer.name}, neither a GM parameter nor a UB buffer")
        return b

    def _flat(self, b: _Buf, indices, env, shape, name) -> np.ndarray:
        if len(indices) != len(b.shape):
            raise OpcFailure(f"emit_reduce: {name}: {b.name} indexed with {len(indices)} indices")
        off = np.zeros(shape, np.int64)
        for ix, st in zip(indices, b.strides):
            off = off + np.broadcast_to(self._eval(ix, env, name), shape) * st
        return off

    def _ref(self, b: _Buf, indices, env, mask, name, rows: bool = False, scalar: bool = False) -> _Ref:
        """One contiguous run per iteration (`rows`: whole rows at the buffer's row stride)."""
        off = self._flat(b, indices, env, mask.shape, name).reshape(self.U, -1)
        m2 = mask.reshape(self.U, -1)
        first = np.argmax(m2, axis=1)
        base = off[np.arange(self.U), first]
        if rows:
            ext = mask.shape[1:]
            want = base[:, None] + (np.arange(ext[0])[:, None] * b.strides[0] + np.arange(ext[1])[None, :]).reshape(1, -1)
            ok = np.array_equal(off[m2], np.broadcast_to(want, off.shape)[m2])
        elif scalar:
            ok = True
        else:
            ok = np.array_equal(off[m2], (base[:, None] + np.cumsum(m2, axis=1) - 1)[m2])
        if not ok:
            raise OpcFailure(f"emit_reduce: {name}: {b.name} is not one contiguous run per iteration")
        return _Ref(b.name, base.astype(np.int64))

    def _box(self, b: _Buf, indices, env, mask, name):
        """(buffer, starts, sizes) per iteration of a DMA side: the box the masked elements fill
        (a UB buffer's rows at their aligned stride: the physical shape)."""
        m2 = mask.reshape(self.U, -1)
        cnt = m2.sum(axis=1)
        los, sizes = [], []
        for ix, n in zip(indices, b.shape):
            v = np.broadcast_to(self._eval(ix, env, name), mask.shape).reshape(self.U, -1)
            if ((v < 0) | (v >= n))[m2].any():
                raise OpcFailure(f"emit_reduce: {name}: {b.name} indexed outside its shape")
            lo = np.where(m2, v, np.iinfo(np.int64).max).min(axis=1)
            hi = np.where(m2, v, -1).max(axis=1)
            los.append(np.where(cnt > 0, lo, 0))
            sizes.append(np.where(cnt > 0, hi - lo + 1, 0))
        lo, size = np.stack(los, axis=1), np.stack(sizes, axis=1)
        if not np.array_equal(np.prod(size, axis=1), cnt):
            raise OpcFailure(f"emit_reduce: {name}: {b.name} is not one box per iteration")
        return b.name, lo, size


def _dense(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _pragma(s) -> str:
    return str(s.value.value if hasattr(s.value, "value") else s.value)


__all__ = ["RowKernel", "lower", "fold", "REDUCE"]
