"""Element-wise computes (TBE `vadd`, `vrelu`, ...). Binary ops broadcast by numpy rules."""
from __future__ import annotations

from typing import Callable, Sequence

from tvm import te, tirx

from ..errors import OpcError
from .util import DTYPES, check_dtype, produce_shapes, shape_to_list

ARITH = ("float16", "float32", "int32")
FLOAT = ("float16", "float32")


def _check(x: te.Tensor, name: str, allowed: Sequence[str]) -> None:
    if not isinstance(x, te.Tensor):
        raise OpcError(f"expected a te.Tensor, got {type(x).__name__}", arg=name)
    check_dtype(str(x.dtype), allowed, arg=f"{name}.dtype")


def broadcast(x: te.Tensor | float | int, shape: Sequence[int], dtype: str | None = None) -> te.Tensor:
    """Broadcast a tensor (or scalar) to `shape` by numpy rules."""
    shape = [int(s) for s in shape]
    if not isinstance(x, te.Tensor):
        dt = dtype or "float32"
        check_dtype(dt, DTYPES)
        return te.compute(shape, lambda *i: tirx.const(x, dt), name="broadcast_scalar", tag="elemwise|broadcast")
    src = shape_to_list(x.shape)
    if len(src) > len(shape):
        raise OpcError(f"cannot broadcast rank {len(src)} to rank {len(shape)}", arg="shape", value=shape,
                       expected=f"a shape of rank >= {len(src)}")
    _, _, out = produce_shapes(src, shape)
    if out != shape:
        raise OpcError(f"tensor of shape {src} does not broadcast to {shape}", arg="shape", value=shape,
                       expected="each source axis equal to the target axis or 1")
    if src == shape:
        return x
    lead = len(shape) - len(src)

    def f(*idx):
        return x(*[0 if src[j] == 1 else idx[lead + j] for j in range(len(src))])

    return te.compute(shape, f, name="broadcast", tag="elemwise|broadcast")


def _binary(name: str, fn: Callable, allowed: Sequence[str] = ARITH) -> Callable[[te.Tensor, te.Tensor], te.Tensor]:
    def op(lhs: te.Tensor, rhs: te.Tensor) -> te.Tensor:
        _check(lhs, "lhs", allowed)
        _check(rhs, "rhs", allowed)
        if str(lhs.dtype) != str(rhs.dtype):
            raise OpcError(f"{name}: operands differ in dtype ({lhs.dtype} vs {rhs.dtype})",
                           expected="cast_to one of them first")
        _, _, out = produce_shapes(shape_to_list(lhs.shape), shape_to_list(rhs.shape))
        a, b = broadcast(lhs, out), broadcast(rhs, out)
        return te.compute(out, lambda *i: fn(a(*i), b(*i)), name=name, tag=f"elemwise|{name}")

    op.__name__ = name
    op.__doc__ = f"Element-wise {name} with numpy broadcasting."
    return op


vadd = _binary("vadd", lambda a, b: a + b)
vsub = _binary("vsub", lambda a, b: a - b)
vmul = _binary("vmul", lambda a, b: a * b)
vdiv = _binary("vdiv", lambda a, b: a / b, FLOAT)
vmin = _binary("vmin", tirx.min)
vmax = _binary("vmax", tirx.max)


def _unary(name: str, fn: Callable, allowed: Sequence[str] = ARITH) -> Callable[[te.Tensor], te.Tensor]:
    def op(x: te.Tensor) -> te.Tensor:
        _check(x, "raw_tensor", allowed)
        return te.compute(x.shape, lambda *i: fn(x(*i), x.dtype), name=name, tag=f"elemwise|{name}")

    op.__name__ = name
    op.__doc__ = f"Element-wise {name}."
    return op


vabs = _unary("vabs", lambda v, dt: tirx.abs(v))
vexp = _unary("vexp", lambda v, dt: tirx.exp(v), FLOAT)
vlog = _unary("vlog", lambda v, dt: tirx.log(v), FLOAT)
vrec = _unary("vrec", lambda v, dt: tirx.const(1, dt) / v, FLOAT)
vsqrt = _unary("vsqrt", lambda v, dt: tirx.sqrt(v), FLOAT)
vrelu = _unary("vrelu", lambda v, dt: tirx.max(v, tirx.const(0, dt)))


def _scalar(x: te.Tensor, s: float | int) -> tirx.PrimExpr:
    if not isinstance(s, (int, float)):
        raise OpcError(f"expected a Python number, got {type(s).__name__}", arg="scalar")
    return tirx.const(s, x.dtype)


def vadds(raw_tensor: te.Tensor, scalar: float | int) -> te.Tensor:
    """x + scalar."""
    _check(raw_tensor, "raw_tensor", ARITH)
    s = _scalar(raw_tensor, scalar)
    return te.compute(raw_tensor.shape, lambda *i: raw_tensor(*i) + s, name="vadds", tag="elemwise|vadds")


def vmuls(raw_tensor: te.Tensor, scalar: float | int) -> te.Tensor:
    """x * scalar."""
    _check(raw_tensor, "raw_tensor", ARITH)
    s = _scalar(raw_tensor, scalar)
    return te.compute(raw_tensor.shape, lambda *i: raw_tensor(*i) * s, name="vmuls", tag="elemwise|vmuls")


def vlrelu(raw_tensor: te.Tensor, alpha: float = 0.01) -> te.Tensor:
    """Leaky ReLU: x if x > 0 else alpha * x."""
    _check(raw_tensor, "raw_tensor", FLOAT)
    a = _scalar(raw_tensor, alpha)
    zero = tirx.const(0, raw_tensor.dtype)
    return te.compute(raw_tensor.shape,
                      lambda *i: tirx.Select(raw_tensor(*i) > zero, raw_tensor(*i), raw_tensor(*i) * a),
                      name="vlrelu", tag="elemwise|vlrelu")


def vaxpy(lhs: te.Tensor, rhs: te.Tensor, scalar: float | int) -> te.Tensor:
    """scalar * lhs + rhs."""
    return vadd(vmuls(lhs, scalar), rhs)


def _ternary(name: str, fn: Callable, relu: bool = False) -> Callable:
    def op(x: te.Tensor, y: te.Tensor, z: te.Tensor) -> te.Tensor:
        for n, t in (("x", x), ("y", y), ("z", z)):
            _check(t, n, ARITH)
        if not str(x.dtype) == str(y.dtype) == str(z.dtype):
            raise OpcError(f"{name}: operands differ in dtype ({x.dtype}, {y.dtype}, {z.dtype})",
                           expected="one dtype for all three")
        _, _, s = produce_shapes(shape_to_list(x.shape), shape_to_list(y.shape))
        _, _, out = produce_shapes(s, shape_to_list(z.shape))
        a, b, c = broadcast(x, out), broadcast(y, out), broadcast(z, out)

        def f(*i):
            v = fn(a(*i), b(*i), c(*i))
            return tirx.max(v, tirx.const(0, x.dtype)) if relu else v

        return te.compute(out, f, name=name, tag=f"elemwise|{name}")

    op.__name__ = name
    return op


vmla = _ternary("vmla", lambda x, y, z: x * y + z)  # x*y + z
vmadd = _ternary("vmadd", lambda x, y, z: x * z + y)  # x*z + y (TBE's operand order)
vmaddrelu = _ternary("vmaddrelu", lambda x, y, z: x * z + y, relu=True)  # relu(x*z + y)


def cast_to(data: te.Tensor, dtype: str, f1628IntegerFlag: bool = False) -> te.Tensor:  # noqa: N803 (TBE's name)
    """Cast to `dtype`; float -> int truncates toward zero unless f1628IntegerFlag rounds."""
    _check(data, "data", DTYPES)
    check_dtype(dtype, DTYPES, arg="dtype")
    if dtype == str(data.dtype):
        return data
    to_int = dtype.startswith("int") and str(data.dtype).startswith("float")
    if to_int and f1628IntegerFlag:
        return te.compute(data.shape, lambda *i: tirx.round(data(*i)).astype(dtype), name="cast_to", tag="elemwise|cast")
    return te.compute(data.shape, lambda *i: data(*i).astype(dtype), name="cast_to", tag="elemwise|cast")


def _rounding(name: str, fn: Callable) -> Callable:
    def op(raw_tensor: te.Tensor, dtype: str = "int32") -> te.Tensor:
        _check(raw_tensor, "raw_tensor", FLOAT)
        check_dtype(dtype, ("int32", "float16", "float32"), arg="dtype")
        return te.compute(raw_tensor.shape, lambda *i: fn(raw_tensor(*i)).astype(dtype), name=name,
                          tag=f"elemwise|{name}")

    op.__name__ = name
    op.__doc__ = f"{name} then cast to dtype (int32 by default, as TBE)."
    return op


round = _rounding("round", tirx.nearbyint)  # noqa: A001 (TBE's name); half to even like numpy
ceil = _rounding("ceil", tirx.ceil)
floor = _rounding("floor", tirx.floor)
