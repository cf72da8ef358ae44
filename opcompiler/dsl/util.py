"""Shape helpers with TBE's names (`te.lang.cce.util`, `topi.cce.util`)."""
from __future__ import annotations

from typing import Sequence

from ..errors import OpcError

SHAPE_SIZE_LIMIT = 2**31 - 1  # elements; TBE's limit for one tensor

DTYPES = ("float16", "float32", "int8", "int32")


def shape_to_list(shape: Sequence) -> list[int]:
    """A `te.Tensor.shape` (or any sequence of ints / IntImm) as a list of ints."""
    return [int(x) for x in shape]


def produce_shapes(shape_x: Sequence[int], shape_y: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Right-align two shapes (numpy rules) and return (x padded, y padded, broadcast shape)."""
    x, y = list(shape_x), list(shape_y)
    n = max(len(x), len(y))
    x = [1] * (n - len(x)) + x
    y = [1] * (n - len(y)) + y
    out = []
    for i, (a, b) in enumerate(zip(x, y)):
        if a != b and a != 1 and b != 1:
            raise OpcError(f"shapes {list(shape_x)} and {list(shape_y)} do not broadcast at axis {i} ({a} vs {b})",
                           expected="equal sizes or 1 on each axis (numpy broadcasting)")
        out.append(max(a, b))
    return x, y, out


def check_shape_size(shape: Sequence[int], limit: int = SHAPE_SIZE_LIMIT) -> int:
    size = 1
    for d in shape:
        if int(d) <= 0:
            raise OpcError("every dimension must be positive", arg="shape", value=list(shape))
        size *= int(d)
    if size > limit:
        raise OpcError(f"has {size} elements, more than the limit {limit}", arg="shape", value=list(shape))
    return size


def check_dtype(dtype: str, allowed: Sequence[str], arg: str = "dtype") -> str:
    if dtype not in allowed:
        raise OpcError("unsupported dtype", arg=arg, value=dtype, expected=" or ".join(allowed))
    return dtype
