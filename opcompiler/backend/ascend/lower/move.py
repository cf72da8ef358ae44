"""Lower a scheduled data-movement kernel (slice, pad, transpose, concat) to the AI Core program.

The modules come from the data-movement schedules: the op's block written into a `local.UB`
tile at the tile loop (`opc.ascend.block_dim`, `opc.ascend.double_buffer`) and copied out, every
nest `pragma_emit_insn = dma_copy`. This is the `vector` lowering's shaped form (boxes moved by MTE2 /
MTE3 with bursts counted from the shapes, as TIK's data_move; loops between the tile loop and a
nest are instruction loops, one move per iteration; `if_then_else(cond, x[...], fill)` is a
vector dup of the fill over the tile then the move of the box where `cond` holds), taken for
every module, views of one axis included (`vector.lower` would stream those as flat
tensors). Anything it cannot map is a one-line `OpcFailure` naming the nest.

A `vector_transpose` nest (a transpose that moves the innermost axis: the op's block between
the tile read into UB and its transposed copy, both `local.UB`) is vnchwconv
(`KernelBuilder.transpose`): the nest's source and destination indices pair the buffers' axes
(the source's last axis is a destination axis, the destination's last a source axis, the others
batch axes), per iteration the box it transposes; both buffers are laid out with the rows axis
padded to 16 and the columns axis to whole 32 B blocks (the instruction's 16 x 32 B blocks; the
padding lanes hold whatever UB holds and are never copied out), and each its own buffer (a
transpose never writes in place).

Tile loops in sequence (concat: per image, a tile loop per input, each `opc.ascend.item_tiles`)
under the loop that carries the cores: their iterations, in walk order, are the kernel's items
(what the cores share, one ping-pong slot each). Each tile loop's body is lowered over all the
items with the outer loop and its own loop evaluated as functions of the item index (clamped
into range), and its moves count zero elements on the other loops' items: an item emits its own
loop's moves only.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np

from opcompiler.errors import OpcFailure

from . import vector
from .vector import CORES, SLOTS, VectorKernel, _nest_parts, _Op, _SCtx, _seq, _ShapedLowering

from ..intrin import ITEM_TILES, VEC_TRANSPOSE  # noqa: E402 (concat's tile loops; the transpose nest's pragma)
_CACHE: dict[int, VectorKernel] = {}
_CACHE_MAX = 256


class _ItemEnv(dict):
    """A loop grid where the item loops (outer and tile loops) are functions of the tile axis,
    looked up when the evaluator reads them (before any value the grid itself holds)."""

    def __init__(self, env: dict, items: dict, tile: int):
        super().__init__(env)
        self.items, self.tile = items, tile

    def __getitem__(self, k):
        f = self.items.get(k)
        if f is not None:
            return f(dict.__getitem__(self, self.tile))
        return dict.__getitem__(self, k)


@dataclass
class _Trans(_Op):
    """A vector transpose nest: `pairs` the (source axis, destination axis) that carry the same
    index, the rows first (the source axis that is the destination's last), the columns second
    (the source's last axis), then batch axes; per iteration the box's start and size per pair."""

    pairs: tuple[tuple[int, int], ...] = ()
    lo: np.ndarray | None = None  # (iterations, pairs)
    size: np.ndarray | None = None


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return out[::-1]


class _TransposeKernel(VectorKernel):
    """A kernel with vector transposes: those nests emitted by `KernelBuilder.transpose` on the
    physical (padded) buffers, the rest as any shaped kernel's."""

    def _emit(self, kb, ops, it, buf) -> None:
        for o in ops:
            if not isinstance(o, _Trans):
                super()._emit(kb, [o], it, buf)
                continue
            if int(o.cnt[it]) == 0:
                continue
            src, dst = buf(o.srcs[0]), buf(o.dst)
            ss, ds = _strides(src.shape), _strides(dst.shape)
            lo, size = o.lo[it], o.size[it]
            s0 = sum(int(lo[k]) * ss[s] for k, (s, _) in enumerate(o.pairs))
            d0 = sum(int(lo[k]) * ds[d] for k, (_, d) in enumerate(o.pairs))
            (s_rows, _), (_, d_cols) = o.pairs[:2]
            batch = list(range(2, len(o.pairs)))
            inner = batch.pop() if batch else None  # the innermost batch pair: the builder's batch axis
            bt = (1, 0, 0) if inner is None else (int(size[inner]), ss[o.pairs[inner][0]], ds[o.pairs[inner][1]])
            for idx in itertools.product(*(range(int(size[k])) for k in batch)):
                so = s0 + sum(i * ss[o.pairs[k][0]] for i, k in zip(idx, batch))
                do = d0 + sum(i * ds[o.pairs[k][1]] for i, k in zip(idx, batch))
                kb.transpose(dst, do, ds[d_cols], src, so, ss[s_rows], int(size[0]), int(size[1]), batch=bt)


class _ItemsLowering(_ShapedLowering):
    """The shaped lowering, with tile loops in sequence under the cores loop as one item list."""

    _items: dict = {}

    def _eval(self, e, env, name) -> np.ndarray:
        """The outer loop and the tile loops as functions of the item index (the tile axis)."""
        if self._items:
            env = _ItemEnv(env, self._items, hash(self.tile_var))
        return super()._eval(e, env, name)

    def run(self) -> VectorKernel:
        T = self.T
        top = _seq(self.f.body)
        if not (len(top) == 1 and isinstance(top[0], T.For) and CORES in top[0].annotations
                and any(isinstance(s, T.For) and ITEM_TILES in s.annotations for s in _seq(top[0].body))):
            return super().run()
        from tvm import tirx

        outer = top[0]
        loops = _seq(outer.body)
        for lp in loops:
            if not (isinstance(lp, T.For) and ITEM_TILES in lp.annotations):
                raise OpcFailure(f"emit_insn: the cores loop holds tile loops only, not {type(lp).__name__}")
        if int(outer.min) or any(int(lp.min) for lp in loops):
            raise OpcFailure("emit_insn: item loops start at 0")
        exts = [int(lp.extent) for lp in loops]
        per = sum(exts)
        self.iters = int(outer.extent) * per
        self.tile_var = tirx.Var("item", "int32")
        self._items = {hash(outer.loop_var): lambda u: u // per}
        j = np.arange(self.iters, dtype=np.int64) % per
        base = 0
        per_loop: list[list[int]] = []  # each tile loop's UB buffers (keys of self.ub), in order
        for lp, ext in zip(loops, exts):
            known = set(self.ub)
            self._items[hash(lp.loop_var)] = lambda u, b=base, e=ext: np.clip(u % per - b, 0, e - 1)
            first_op, first_nest = len(self.ops), len(self.nests)
            self._body(lp.body, {})
            own = (j >= base) & (j < base + ext)
            for k in range(first_nest, len(self.nests)):
                self.counts[k] = np.where(own, self.counts[k], 0)
            for o in self.ops[first_op:]:
                o.cnt = np.where(own, self.counts[o.nest] if o.cnt is None else o.cnt, 0)
            base += ext
            per_loop.append([h for h in self.ub if h not in known])
        self._fit()
        self._share(per_loop)
        self._fold_inits()
        phys, where = self._assign()
        params = list(self.gm)
        return VectorKernel(gm=self.gm, inputs=tuple(params[:-1]), output=params[-1], iterations=self.iters,
                            cores=int(outer.annotations[CORES]), slots=2 if int(outer.annotations.get(SLOTS, 0)) else 1,
                            nests=self.nests, counts=np.array(self.counts, dtype=np.int64).reshape(len(self.nests), -1),
                            ops=self.ops, phys=phys, where=where,
                            phys_shapes=[self.shapes.get(name, (n,)) for name, n, _ in phys])


    def _snest(self, pragma: str, stmt, outer: dict) -> None:
        """A `vector_transpose` nest becomes a `_Trans` op; any other nest is the shaped lowering's."""
        if pragma != VEC_TRANSPOSE:
            return super()._snest(pragma, stmt, outer)
        from tvm.ir.expr import TensorLoad

        loops, pred, stmt, name = _nest_parts(self.T, pragma, stmt, len(self.nests))
        ctx = _SCtx(self, loops, pred, name, outer)
        self.nests.append(name)
        self.counts.append(ctx.counts)
        val = stmt.value
        if not isinstance(val, TensorLoad):
            raise OpcFailure(f"emit_insn: {name} is not a copy")
        dname, sname = self._name(stmt.buffer, ctx), self._name(val.source, ctx)
        if dname in self.gm or sname in self.gm or str(val.source.dtype) != str(stmt.buffer.dtype):
            raise OpcFailure(f"emit_insn: {name}: a vector transpose moves UB to UB in one dtype ({sname} -> {dname})")
        ss, ds = self.shape_of(val.source), self.shape_of(stmt.buffer)
        sr = ctx._raw(val.source, val.indices, sname, None)
        dr = ctx._raw(stmt.buffer, stmt.indices, dname, None)

        def same(a: np.ndarray, b: np.ndarray) -> bool:
            sh = np.broadcast_shapes(a.shape, b.shape)
            return np.array_equal(np.broadcast_to(a, sh), np.broadcast_to(b, sh))

        pair: dict[int, int] = {}  # destination axis -> the source axis with the same index
        for d in (k for k, n in enumerate(ds) if n > 1):
            s = next((s for s, n in enumerate(ss) if n > 1 and s not in pair.values() and same(sr[s], dr[d])), None)
            if s is None:
                raise OpcFailure(f"emit_insn: {name}: axis {d} of {dname} is no axis of {sname} (not a transpose)")
            pair[d] = s
        sl, dl = len(ss) - 1, len(ds) - 1
        if len(pair) != sum(n > 1 for n in ss) or dl not in pair or sl not in pair.values() or pair[dl] == sl:
            raise OpcFailure(f"emit_insn: {name}: {sname} -> {dname} does not swap the last axis with another")
        d_cols = next(d for d, s in pair.items() if s == sl)
        pairs = [(pair[dl], dl), (sl, d_cols)] + [(s, d) for d, s in pair.items() if d not in (dl, d_cols)]
        U, m = ctx.U, ctx.mask.reshape(ctx.U, -1)
        whole = ctx.counts == ctx.n_el
        part = np.flatnonzero(~whole)
        lo = np.zeros((U, len(pairs)), np.int64)
        size = np.zeros((U, len(pairs)), np.int64)
        axes = tuple(range(1, len(ctx.shape)))
        for k, (s, _) in enumerate(pairs):
            r = sr[s]
            lo[:, k] = np.broadcast_to(r.min(axis=axes), (U,))
            size[:, k] = np.broadcast_to(r.max(axis=axes), (U,)) - lo[:, k] + 1
            if part.size:
                c = np.broadcast_to(r, ctx.shape)[part].reshape(part.size, -1)
                mp = m[part]
                lo[part, k] = np.where(mp, c, np.iinfo(np.int64).max).min(axis=1)
                size[part, k] = np.where(mp, c, -1).max(axis=1) - lo[part, k] + 1
        size[ctx.counts == 0] = 0
        lo[ctx.counts == 0] = 0
        if not np.array_equal(np.prod(size, axis=1), ctx.counts):
            raise OpcFailure(f"emit_insn: {name}: {sname} -> {dname} is not one box per iteration")
        self.ops.append(_Trans("trans", len(self.nests) - 1, vector._Access(dname, None),
                               [vector._Access(sname, None)], op="vnchwconv", cnt=ctx.counts,
                               pairs=tuple(pairs), lo=lo, size=size))

    def _fit(self) -> None:
        """The shaped lowering's fit, then each transposed buffer padded to vnchwconv's blocks:
        the rows axis to 16, the columns axis to whole 32 B blocks (in both buffers)."""
        super()._fit()
        for o in self.ops:
            if isinstance(o, _Trans):
                (sr, dr), (sc, dc) = o.pairs[:2]
                for name, rows, cols in ((o.srcs[0].buf, sr, sc), (o.dst.buf, dr, dc)):
                    h = next(h for h, v in self.ub.items() if v[0] == name)
                    dt = self.ub[h][2]
                    epb = 32 // np.dtype(dt).itemsize
                    shape = list(self.shapes[name])
                    shape[rows] = -(-shape[rows] // 16) * 16
                    shape[cols] = -(-shape[cols] // epb) * epb
                    self.shapes[name] = tuple(shape)
                    self.ub[h] = (name, int(np.prod(shape)), dt)

    def _assign(self, skip=()):
        """A kernel with a vector transpose keeps every UB buffer its own (vnchwconv never
        writes in place); any other kernel's buffers by liveness."""
        if not any(isinstance(o, _Trans) for o in self.ops):
            return super()._assign(skip)
        phys = [v for v in self.ub.values() if v[0] not in skip]
        return phys, {name: i for i, (name, _, _) in enumerate(phys)}

    def _share(self, per_loop: list[list[int]]) -> None:
        """The j-th UB tile of every tile loop at one shape (the largest, when they differ only in
        their last axis), so the liveness assignment gives them one physical buffer: one tile
        loop runs at a time, as the retired kernels reused their staging buffer."""
        for j in range(max((len(g) for g in per_loop), default=0)):
            col = [g[j] for g in per_loop if j < len(g)]
            shapes = [self.shapes[self.ub[h][0]] for h in col]
            dts = {self.ub[h][2] for h in col}
            if len(dts) != 1 or len({(len(sh), sh[:-1]) for sh in shapes}) != 1:
                continue
            big = max(shapes, key=lambda sh: sh[-1])
            for h in col:
                name, _, dt = self.ub[h]
                self.shapes[name] = big
                self.ub[h] = (name, int(np.prod(big)), dt)


def lower(mod) -> VectorKernel:
    """The `VectorKernel` of a scheduled data-movement module (cached by structural hash)."""
    import tvm_ffi

    key = int(tvm_ffi.structural_hash(mod))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    vk = _ItemsLowering(vector.lower_module(mod, flatten=False)).run()
    if any(isinstance(o, _Trans) for o in vk.ops):
        vk = _TransposeKernel(**{f.name: getattr(vk, f.name) for f in fields(vk)})
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = vk
    return vk


__all__ = ["ITEM_TILES", "lower"]
