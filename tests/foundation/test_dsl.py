"""Every DSL function against numpy, over dtypes and broadcast cases."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from opcompiler import dsl, OpcError
from opcompiler.dsl import util

RNG = np.random.default_rng(0)


def run(ins: list[te.Tensor], out: te.Tensor, arrays: list[np.ndarray]) -> np.ndarray:
    """Compile the bare compute for llvm (no schedule needed for correctness) and run it."""
    ex = tvm.compile(te.create_prim_func([*ins, out]), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    res = tvm.runtime.tensor(np.zeros([int(s) for s in out.shape], str(out.dtype)), dev)
    ex(*args, res)
    return res.numpy()


def tol(dtype: str) -> dict:
    return {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=1e-6),
            "int32": dict(rtol=0, atol=0)}[dtype]


def data(shape, dtype, positive=False):
    if dtype.startswith("int"):
        return RNG.integers(-20, 20, size=shape).astype(dtype)
    x = RNG.standard_normal(shape)
    return (np.abs(x) + 0.5 if positive else x).astype(dtype)


BINARY = [("vadd", np.add), ("vsub", np.subtract), ("vmul", np.multiply), ("vmin", np.minimum),
          ("vmax", np.maximum)]
SHAPES = [((4, 8), (4, 8)), ((4, 8), (8,)), ((2, 1, 6), (3, 1)), ((1,), (5, 3))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
@pytest.mark.parametrize("name,ref", BINARY)
@pytest.mark.parametrize("sx,sy", SHAPES)
def test_binary_broadcast(name, ref, dtype, sx, sy):
    x, y = te.placeholder(sx, dtype, "x"), te.placeholder(sy, dtype, "y")
    a, b = data(sx, dtype), data(sy, dtype)
    out = run([x, y], getattr(dsl, name)(x, y), [a, b])
    np.testing.assert_allclose(out, ref(a, b), **tol(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_vdiv(dtype):
    x, y = te.placeholder((3, 5), dtype, "x"), te.placeholder((5,), dtype, "y")
    a, b = data((3, 5), dtype), data((5,), dtype, positive=True)
    np.testing.assert_allclose(run([x, y], dsl.vdiv(x, y), [a, b]), a / b, **tol(dtype))


UNARY = [("vabs", np.abs, False), ("vexp", np.exp, False), ("vlog", np.log, True),
         ("vrec", lambda v: 1 / v, True), ("vrelu", lambda v: np.maximum(v, 0), False)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name,ref,positive", UNARY)
def test_unary(name, ref, positive, dtype):
    x = te.placeholder((4, 7), dtype, "x")
    a = data((4, 7), dtype, positive)
    np.testing.assert_allclose(run([x], getattr(dsl, name)(x), [a]), ref(a).astype(dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scalar_ops(dtype):
    x, y = te.placeholder((6,), dtype, "x"), te.placeholder((6,), dtype, "y")
    a, b = data((6,), dtype), data((6,), dtype)
    t = tol(dtype)
    np.testing.assert_allclose(run([x], dsl.vadds(x, 1.5), [a]), a + np.asarray(1.5, dtype), **t)
    np.testing.assert_allclose(run([x], dsl.vmuls(x, -2.0), [a]), a * np.asarray(-2.0, dtype), **t)
    np.testing.assert_allclose(run([x], dsl.vlrelu(x, 0.1), [a]), np.where(a > 0, a, a * np.asarray(0.1, dtype)), **t)
    np.testing.assert_allclose(run([x, y], dsl.vaxpy(x, y, 3.0), [a, b]), 3 * a + b, **t)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ternary(dtype):
    x, y, z = (te.placeholder((3, 4), dtype, n) for n in "xyz")
    a, b, c = (data((3, 4), dtype) for _ in range(3))
    t = tol(dtype)
    np.testing.assert_allclose(run([x, y, z], dsl.vmla(x, y, z), [a, b, c]), a * b + c, **t)
    np.testing.assert_allclose(run([x, y, z], dsl.vmadd(x, y, z), [a, b, c]), a * c + b, **t)
    np.testing.assert_allclose(run([x, y, z], dsl.vmaddrelu(x, y, z), [a, b, c]), np.maximum(a * c + b, 0), **t)


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float16", "float32"), ("float32", "int32"),
                                     ("int8", "float32"), ("float16", "int8")])
def test_cast_to(src, dst):
    x = te.placeholder((10,), src, "x")
    a = (RNG.standard_normal(10) * 5).astype(src) if not src.startswith("int") else data((10,), "int32").astype(src)
    out = run([x], dsl.cast_to(x, dst), [a])
    want = np.trunc(a.astype(np.float64)).astype(dst) if dst.startswith("int") else a.astype(dst)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("name,ref", [("round", np.rint), ("ceil", np.ceil), ("floor", np.floor)])
def test_rounding(name, ref):
    x = te.placeholder((8,), "float32", "x")
    a = np.array([-2.5, -1.5, -0.4, 0.5, 1.5, 2.6, 3.0, -7.9], "float32")
    np.testing.assert_array_equal(run([x], getattr(dsl, name)(x), [a]), ref(a).astype("int32"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("reduce_max", np.max), ("reduce_min", np.min),
                                      ("reduce_prod", np.prod)])
@pytest.mark.parametrize("axis,keepdims", [(1, False), ((0, 2), True), (None, False)])
def test_reductions(name, ref, dtype, axis, keepdims):
    x = te.placeholder((3, 4, 5), dtype, "x")
    a = (RNG.uniform(0.8, 1.2, (3, 4, 5)) if name == "reduce_prod" else RNG.standard_normal((3, 4, 5))).astype(dtype)
    out = run([x], getattr(dsl, name)(x, axis=axis, keepdims=keepdims), [a])
    want = ref(a.astype(np.float32), axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(out.reshape(np.shape(want)), want, rtol=5e-3 if dtype == "float16" else 1e-5,
                               atol=5e-3 if dtype == "float16" else 1e-5)


def test_broadcast_and_util():
    x = te.placeholder((3, 1), "float32", "x")
    a = data((3, 1), "float32")
    np.testing.assert_array_equal(run([x], dsl.broadcast(x, (2, 3, 4)), [a]), np.broadcast_to(a, (2, 3, 4)))
    assert util.produce_shapes([3, 1], [4]) == ([3, 1], [1, 4], [3, 4])
    assert util.shape_to_list(x.shape) == [3, 1]


@pytest.mark.parametrize("dtype,acc", [("float32", np.float32), ("float16", np.float32), ("int8", np.int32)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_matmul(dtype, acc, ta, tb):
    m, k, n = 5, 7, 3
    sa, sb = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    a, b = te.placeholder(sa, dtype, "a"), te.placeholder(sb, dtype, "b")
    bias = te.placeholder((n,), "int32" if dtype == "int8" else dtype, "bias")
    x, y = data(sa, "int32").astype(dtype) if dtype == "int8" else data(sa, dtype), \
        data(sb, "int32").astype(dtype) if dtype == "int8" else data(sb, dtype)
    z = data((n,), "int32") if dtype == "int8" else data((n,), dtype)
    want = (x.T if ta else x).astype(acc) @ (y.T if tb else y).astype(acc) + z.astype(acc)
    out = run([a, b, bias], dsl.matmul(a, b, ta, tb, bias=bias), [x, y, z])
    np.testing.assert_allclose(out, want.astype(out.dtype), rtol=2e-3 if dtype == "float16" else 1e-5, atol=1e-3)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,pad,dil,groups", [(1, 1, 1, 1), (2, 0, 1, 1), (1, 2, 2, 1), (1, 1, 1, 2),
                                                   (1, 1, 1, 4)])
def test_conv2d(layout, stride, pad, dil, groups):
    from opcompiler.ops.reference import conv2d as ref_conv
    n, c, h, w, k, r = 2, 4, 7, 6, 8, 3
    xs = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    ws = (k, c // groups, r, r) if layout == "NCHW" else (r, r, c // groups, k)
    x, wt = te.placeholder(xs, "float32", "x"), te.placeholder(ws, "float32", "w")
    a, b = data(xs, "float32"), data(ws, "float32")
    out = run([x, wt], dsl.conv2d(x, wt, stride, pad, dil, groups, layout), [a, b])
    np.testing.assert_allclose(out, ref_conv(a, b, stride, pad, dil, groups, layout), rtol=1e-5, atol=1e-5)


def test_conv2d_fp16_accumulates_in_fp32():
    x, wt = te.placeholder((1, 64, 4, 4), "float16", "x"), te.placeholder((2, 64, 1, 1), "float16", "w")
    a = np.full((1, 64, 4, 4), 0.1, "float16")
    b = np.full((2, 64, 1, 1), 0.1, "float16")
    out = run([x, wt], dsl.conv2d(x, wt), [a, b])
    exact = 64 * np.float32(np.float16(0.1)) ** 2
    assert out.dtype == np.float16
    assert abs(float(out[0, 0, 0, 0]) - exact) < 1e-3  # fp16 accumulation would drift ~1e-2


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool2d(layout, mode):
    from opcompiler.ops.reference import pool2d as ref_pool
    xs = (1, 3, 7, 8) if layout == "NCHW" else (1, 7, 8, 3)
    x = te.placeholder(xs, "float32", "x")
    a = data(xs, "float32")
    out = run([x], dsl.pool2d(x, 3, 2, 1, mode, layout), [a])
    np.testing.assert_allclose(out, ref_pool(a, 3, 2, 1, mode, layout), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batch_norm(layout):
    xs = (2, 3, 4, 5) if layout == "NCHW" else (2, 4, 5, 3)
    x, s, t = te.placeholder(xs, "float32", "x"), te.placeholder((3,), "float32", "s"), te.placeholder((3,), "float32", "t")
    a, sc, sh = data(xs, "float32"), data((3,), "float32"), data((3,), "float32")
    shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    out = run([x, s, t], dsl.batch_norm(x, s, t, layout), [a, sc, sh])
    np.testing.assert_allclose(out, a * sc.reshape(shape) + sh.reshape(shape), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- bad input: one error type, clear messages

def test_bad_inputs_raise_opc_error():
    f32 = lambda s, n="x": te.placeholder(s, "float32", n)  # noqa: E731
    cases = [
        (lambda: dsl.vadd(f32((3, 4)), f32((5,), "y")), "do not broadcast"),
        (lambda: dsl.conv2d(f32((1, 4, 5, 5)), f32((8, 4, 3)), 1), "4-D"),
        (lambda: dsl.vexp(te.placeholder((3,), "int32", "x")), "unsupported dtype"),
        (lambda: dsl.conv2d(f32((1, 4, 5, 5)), f32((8, 4, 3, 3)), 1, -1), "padding"),
        (lambda: dsl.conv2d(f32((1, 6, 5, 5)), f32((8, 2, 3, 3)), 1, 1, 1, 4), "groups"),
        (lambda: dsl.matmul(f32((3, 4)), f32((5, 6))), "K=4"),
        (lambda: dsl.matmul(te.placeholder((3, 4), "int32", "a"), f32((4, 2))), "unsupported dtype"),
        (lambda: dsl.broadcast(f32((3, 4)), (2, 4)), "broadcast"),
        (lambda: dsl.pool2d(f32((1, 3, 4, 4)), 3, 1, 0, "median"), "max or avg"),
        (lambda: dsl.sum(f32((3, 4)), axis=2), "axis"),
    ]
    for fn, words in cases:
        with pytest.raises(OpcError) as e:
            fn()
        assert words in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
