"""Lower a scheduled data-movement kernel (slice, pad, transpose) to the AI Core program.

The modules come from the data-movement schedules: the op's block written into a `local.UB`
tile at the tile loop (`opc.ascend.block_dim`, `opc.ascend.double_buffer`) and copied out, every
nest `pragma_emit_insn = dma_copy`. This is `emit_insn`'s shaped lowering (boxes moved by MTE2 /
MTE3 with bursts counted from the shapes, as TIK's data_move; loops between the tile loop and a
nest are instruction loops, one move per iteration; `if_then_else(cond, x[...], fill)` is a
vector dup of the fill over the tile then the move of the box where `cond` holds), taken for
every module, views of one axis included (`emit_insn.lower` would stream those as flat
tensors). Anything it cannot map is a one-line `OpcFailure` naming the nest.
"""
from __future__ import annotations

from . import emit_insn
from .emit_insn import VectorKernel, _ShapedLowering

_CACHE: dict[int, VectorKernel] = {}
_CACHE_MAX = 256


def lower(mod) -> VectorKernel:
    """The `VectorKernel` of a scheduled data-movement module (cached by structural hash)."""
    import tvm_ffi

    key = int(tvm_ffi.structural_hash(mod))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    vk = _ShapedLowering(emit_insn.lower_module(mod, flatten=False)).run()
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = vk
    return vk


__all__ = ["lower"]
