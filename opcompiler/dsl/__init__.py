"""A TBE-style DSL over `tvm.te` tensors (modeled on `te.lang.cce` / `tbe.dsl`).

Every function takes and returns `te.Tensor`s, so a compute written with them is one TE graph
that any schedule template can lower. Names follow TBE so a TBE user feels at home::

    from opcompiler import dsl

    def scale_shift_relu(x, scale, shift):  # relu(x * scale + shift): one TE graph
        return dsl.vrelu(dsl.vadds(dsl.vmuls(x, scale), shift))

The seed's `fuse_add_relu` (`opcompiler/ops/fused.py`) shows the TBE pattern whole: registered
with `fusion_manager.register`, shapes inferred and broadcast with `dsl.util`.
"""
from __future__ import annotations

from .elementwise import (
    broadcast, cast_to, ceil, floor, round, vabs, vadd, vadds, vaxpy, vdiv, vexp, vlog, vlrelu,
    vmadd, vmaddrelu, vmax, vmin, vmla, vmul, vmuls, vrec, vrelu, vsqrt, vsub,
)
from .nn import batch_norm, conv2d, matmul, pool2d
from .reduce import reduce_max, reduce_min, reduce_prod, sum
from . import util

__all__ = [
    "broadcast", "cast_to", "ceil", "floor", "round", "vabs", "vadd", "vadds", "vaxpy", "vdiv", "vexp",
    "vlog", "vlrelu", "vmadd", "vmaddrelu", "vmax", "vmin", "vmla", "vmul", "vmuls", "vrec", "vrelu",
    "vsqrt", "vsub", "batch_norm", "conv2d", "matmul", "pool2d", "reduce_max", "reduce_min", "reduce_prod",
    "sum", "util",
]
