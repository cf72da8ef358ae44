"""Seed 002's fuse_add_relu, written in our DSL nearly line for line, registered and run."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import te

from opcompiler import dsl
from opcompiler.dsl import util
from opcompiler.ops.fusion import fusion_manager


def test_seed002_fuse_add_relu_line_for_line():
    name = "test_fuse_add_relu_seed002"
    fusion_manager.unregister(name)

    @fusion_manager.register(name)  # 算子注册
    def fuse_add_relu_compute(input_x, input_y, output_z, kernel_name="fuse_add_relu"):
        # 形状推导 (shape inference)
        shape_x = util.shape_to_list(input_x.shape)
        shape_y = util.shape_to_list(input_y.shape)

        shape_x, shape_y, shape_max = util.produce_shapes(shape_x, shape_y)
        util.check_shape_size(shape_max, util.SHAPE_SIZE_LIMIT)
        input_x = dsl.broadcast(input_x, shape_max)
        input_y = dsl.broadcast(input_y, shape_max)
        # 计算逻辑：Add
        addres = dsl.vadd(input_x, input_y)
        # 计算逻辑：ReLu
        res = dsl.vrelu(addres)
        return res

    try:
        x = te.placeholder((2, 16, 5, 5), "float16", "input_x")
        y = te.placeholder((16, 1, 1), "float16", "input_y")
        res = fusion_manager.get(name).compute(x, y, None)
        # one compute graph: no reduction, a single kernel over the broadcast shape
        assert [int(s) for s in res.shape] == [2, 16, 5, 5]
        ex = tvm.compile(te.create_prim_func([x, y, res]), target="llvm")
        rng = np.random.default_rng(1)
        a = rng.standard_normal((2, 16, 5, 5)).astype("float16")
        b = rng.standard_normal((16, 1, 1)).astype("float16")
        dev = tvm.cpu()
        out = tvm.runtime.tensor(np.zeros((2, 16, 5, 5), "float16"), dev)
        ex(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
        np.testing.assert_array_equal(out.numpy(), np.maximum(a + b, 0))
    finally:
        fusion_manager.unregister(name)


def test_builtin_patterns_registered():
    names = {p.name for p in fusion_manager.patterns()}
    assert {"fuse_add_relu", "fuse_conv2d_bias_relu", "fuse_conv2d_bn_relu", "fuse_matmul_bias_relu",
            "fuse_bn_relu", "fuse_elemwise_chain"} <= names
    assert fusion_manager.get("fuse_conv2d_bn_relu").ops == ("conv2d", "batch_norm", "relu")


def test_register_twice_raises():
    import pytest
    from opcompiler import OpcError
    with pytest.raises(OpcError, match="already registered"):
        fusion_manager.register("fuse_add_relu")(lambda *a: None)
