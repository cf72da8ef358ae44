"""concat's compute written per input, for the simulators' data-movement schedules.

The catalogue's `concat` compute is one block that selects between the inputs; a schedule that
tiles each input's run on its own (as TBE and the FT-M7032 copy kernels do) needs each input as
its own block, copying into its channel range of the output under the image loop they share.
`tests/*/test_tir_move.py` check the two computes agree.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=64)
def concat_per_input(n: int, C: int, C1: int, H: int, W: int, dtype: str):
    """The PrimFunc out[n, C + C1, H, W] = concat(x[n, C, H, W], x1[n, C1, H, W]), one block per input."""
    from tvm.script import tirx as T

    HW = H * W

    @T.prim_func(s_tir=True)
    def concat(x: T.Buffer((n, C, H, W), dtype), x1: T.Buffer((n, C1, H, W), dtype),
               out: T.Buffer((n, C + C1, H, W), dtype)):
        for b in range(n):
            for r in range(C * HW):
                with T.sblock("x"):
                    vb, vr = T.axis.remap("SS", [b, r])
                    out[vb, vr // HW, vr % HW // W, vr % W] = x[vb, vr // HW, vr % HW // W, vr % W]
            for r in range(C1 * HW):
                with T.sblock("x1"):
                    vb, vr = T.axis.remap("SS", [b, r])
                    out[vb, C + vr // HW, vr % HW // W, vr % W] = x1[vb, vr // HW, vr % HW // W, vr % W]
    return concat


__all__ = ["concat_per_input"]
