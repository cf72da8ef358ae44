"""Built-in fusion patterns, written in the DSL as a TBE user writes them, and registered as a
user registers one: `@fusion_manager.register(name, ops=...)` (`opcompiler.ops.registry`), when
this module is imported (`opcompiler.ops.fusion` imports it).
"""
from __future__ import annotations

from typing import Sequence

from .. import dsl
from ..dsl import util
from .registry import fusion_manager


@fusion_manager.register("fuse_add_relu", ops=("add", "relu"))
def fuse_add_relu_compute(input_x, input_y, output_z, kernel_name="fuse_add_relu"):
    # shape inference (seed 002)
    shape_x = util.shape_to_list(input_x.shape)
    shape_y = util.shape_to_list(input_y.shape)
    shape_x, shape_y, shape_max = util.produce_shapes(shape_x, shape_y)
    util.check_shape_size(shape_max, util.SHAPE_SIZE_LIMIT)
    input_x = dsl.broadcast(input_x, shape_max)
    input_y = dsl.broadcast(input_y, shape_max)
    # compute: Add, then ReLU
    addres = dsl.vadd(input_x, input_y)
    res = dsl.vrelu(addres)
    return res


@fusion_manager.register("fuse_conv2d_bias_relu", ops=("conv2d", "bias_add", "relu"))
def fuse_conv2d_bias_relu_compute(data, weight, bias, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
                                  kernel_name="fuse_conv2d_bias_relu"):
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout, bias=bias)
    return dsl.vrelu(conv)


@fusion_manager.register("fuse_conv2d_bias", ops=("conv2d", "bias_add"))
def fuse_conv2d_bias_compute(data, weight, bias, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
                             kernel_name="fuse_conv2d_bias"):
    """A Conv node with a bias and nothing after it that fuses (torch.onnx.export's conv with BN
    folded, before a residual add or a pooling): the bias is the conv's epilogue."""
    return dsl.conv2d(data, weight, stride, padding, dilation, groups, layout, bias=bias)


@fusion_manager.register("fuse_conv2d_bias_add", ops=("conv2d", "bias_add", "add"))
def fuse_conv2d_bias_add_compute(data, weight, bias, residual, stride=1, padding=0, dilation=1, groups=1,
                                 layout="NCHW", kernel_name="fuse_conv2d_bias_add"):
    """conv + bias + a residual tensor read in the epilogue (TBE's conv + eltwise fusion)."""
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout, bias=bias)
    return dsl.vadd(conv, residual)


@fusion_manager.register("fuse_conv2d_bias_add_relu", ops=("conv2d", "bias_add", "add", "relu"))
def fuse_conv2d_bias_add_relu_compute(data, weight, bias, residual, stride=1, padding=0, dilation=1, groups=1,
                                      layout="NCHW", kernel_name="fuse_conv2d_bias_add_relu"):
    """ResNet's block end, as torch.onnx.export writes it: conv (BN folded into its bias) + the
    shortcut + ReLU, one kernel; the shortcut is read in the epilogue."""
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout, bias=bias)
    return dsl.vrelu(dsl.vadd(conv, residual))


@fusion_manager.register("fuse_conv2d_bn_add_relu", ops=("conv2d", "batch_norm", "add", "relu"))
def fuse_conv2d_bn_add_relu_compute(data, weight, scale, shift, residual, stride=1, padding=0, dilation=1, groups=1,
                                    layout="NCHW", kernel_name="fuse_conv2d_bn_add_relu"):
    """ResNet's block end with BN not folded: conv + BN + the shortcut + ReLU, one kernel."""
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout)
    return dsl.vrelu(dsl.vadd(dsl.batch_norm(conv, scale, shift, layout), residual))


@fusion_manager.register("fuse_conv2d_bn_relu", ops=("conv2d", "batch_norm", "relu"))
def fuse_conv2d_bn_relu_compute(data, weight, scale, shift, stride=1, padding=0, dilation=1, groups=1,
                                layout="NCHW", kernel_name="fuse_conv2d_bn_relu"):
    conv = dsl.conv2d(data, weight, stride, padding, dilation, groups, layout)
    return dsl.vrelu(dsl.batch_norm(conv, scale, shift, layout))


@fusion_manager.register("fuse_matmul_bias_relu", ops=("matmul", "bias_add", "relu"))
def fuse_matmul_bias_relu_compute(tensor_a, tensor_b, bias, trans_a=False, trans_b=False,
                                  kernel_name="fuse_matmul_bias_relu"):
    return dsl.vrelu(dsl.matmul(tensor_a, tensor_b, trans_a, trans_b, bias=bias))


@fusion_manager.register("fuse_bn_relu", ops=("batch_norm", "relu"))
def fuse_bn_relu_compute(data, scale, shift, layout="NCHW", kernel_name="fuse_bn_relu"):
    return dsl.vrelu(dsl.batch_norm(data, scale, shift, layout))


ELEMWISE_UNARY = {"relu": dsl.vrelu, "abs": dsl.vabs, "exp": dsl.vexp, "log": dsl.vlog, "rec": dsl.vrec}


@fusion_manager.register("fuse_elemwise_chain", ops=("elemwise*",))
def fuse_elemwise_chain_compute(data, chain: Sequence[str], kernel_name="fuse_elemwise_chain"):
    """Apply unary element-wise ops in order, one kernel: e.g. chain=("abs", "exp", "relu")."""
    res = data
    for name in chain:
        res = ELEMWISE_UNARY[name](res)
    return res
