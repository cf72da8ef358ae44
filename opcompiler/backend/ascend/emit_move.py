"""Lower a scheduled data-movement kernel (slice, pad, transpose, concat) to the AI Core program.

The modules come from the data-movement schedules: the op's block written into a `local.UB`
tile at the tile loop (`opc.ascend.block_dim`, `opc.ascend.double_buffer`) and copied out, every
nest `pragma_emit_insn = dma_copy`. This is `emit_insn`'s shaped lowering (boxes moved by MTE2 /
MTE3 with bursts counted from the shapes, as TIK's data_move; loops between the tile loop and a
nest are instruction loops, one move per iteration; `if_then_else(cond, x[...], fill)` is a
vector dup of the fill over the tile then the move of the box where `cond` holds), taken for
every module, views of one axis included (`emit_insn.lower` would stream those as flat
tensors). Anything it cannot map is a one-line `OpcFailure` naming the nest.

Tile loops in sequence (concat: per image, a tile loop per input, each `opc.ascend.item_tiles`)
under the loop that carries the cores: their iterations, in walk order, are the kernel's items
(what the cores share, one ping-pong slot each). Each tile loop's body is lowered over all the
items with the outer loop and its own loop evaluated as functions of the item index (clamped
into range), and its moves count zero elements on the other loops' items: an item emits its own
loop's moves only.
"""
from __future__ import annotations

import numpy as np

from opcompiler.errors import OpcFailure

from . import emit_insn
from .emit_insn import CORES, SLOTS, VectorKernel, _seq, _ShapedLowering

from .intrin import ITEM_TILES  # noqa: E402 (a tile loop of a sequence under the cores loop: concat)
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
    vk = _ItemsLowering(emit_insn.lower_module(mod, flatten=False)).run()
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = vk
    return vk


__all__ = ["ITEM_TILES", "lower"]
