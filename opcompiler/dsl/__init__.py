"""A TBE-style DSL over `tvm.te` tensors (modeled on `te.lang.cce` / `tbe.dsl`).

Every function takes and returns `te.Tensor`s, so a compute written with them is one TE graph
that any schedule template can lower. Names follow TBE so a TBE user feels at home::

    from opcompiler import dsl
    from opcompiler.dsl import util
    from opcompiler.ops.fusion import fusion_manager

    @fusion_manager.register("fuse_add_relu")
    def fuse_add_relu_compute(input_x, input_y, output_z, kernel_name="fuse_add_relu"):
        shape_x = util.shape_to_list(input_x.shape)
        shape_y = util.shape_to_list(input_y.shape)
        shape_x, shape_y, shape_max = util.produce_shapes(shape_x, shape_y)
        util.check_shape_size(shape_max, util.SHAPE_SIZE_LIMIT)
        input_x = dsl.broadcast(input_x, shape_max)
        input_y = dsl.broadcast(input_y, shape_max)
        addres = dsl.vadd(input_x, input_y)
        res = dsl.vrelu(addres)
        return res
"""
from __future__ import annotations

from .elementwise import (
    broadcast, cast_to, ceil, floor, round, vabs, vadd, vadds, vaxpy, vdiv, vexp, vlog, vlrelu,
    vmadd, vmaddrelu, vmax, vmin, vmla, vmul, vmuls, vrec, vrelu, vsub,
)
from .nn import batch_norm, conv2d, matmul, pool2d
from .reduce import reduce_max, reduce_min, reduce_prod, sum
from . import util

__all__ = [
    "broadcast", "cast_to", "ceil", "floor", "round", "vabs", "vadd", "vadds", "vaxpy", "vdiv", "vexp",
    "vlog", "vlrelu", "vmadd", "vmaddrelu", "vmax", "vmin", "vmla", "vmul", "vmuls", "vrec", "vrelu",
    "vsub", "batch_norm", "conv2d", "matmul", "pool2d", "reduce_max", "reduce_min", "reduce_prod",
    "sum", "util",
]
