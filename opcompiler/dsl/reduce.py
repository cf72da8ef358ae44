"""Reductions (TBE `sum`, `reduce_max`, ...) over a list of axes."""
from __future__ import annotations

from typing import Callable, Sequence

from tvm import te, tirx

from ..errors import OpcError
from .elementwise import ARITH, _check
from .util import shape_to_list


def _axes(x: te.Tensor, axis: int | Sequence[int] | None) -> list[int]:
    rank = len(x.shape)
    if axis is None:
        return list(range(rank))
    axes = [axis] if isinstance(axis, int) else list(axis)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise OpcError("axis out of range", arg="axis", value=a, expected=f"-{rank} <= axis < {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise OpcError("repeated axis", arg="axis", value=axes)
    return sorted(out)


def _reduce(name: str, comb: Callable) -> Callable:
    def op(raw_tensor: te.Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> te.Tensor:
        _check(raw_tensor, "raw_tensor", ARITH)
        if name in ("sum", "reduce_prod") and str(raw_tensor.dtype) == "float16":
            # accumulate fp16 sums in fp32 (as the vector unit's reduce does), round once at the end
            wide = te.compute(raw_tensor.shape, lambda *i: raw_tensor(*i).astype("float32"), name=f"{name}_in",
                              tag="elemwise|cast")
            acc = op(wide, axis, keepdims)
            return te.compute(acc.shape, lambda *i: acc(*i).astype("float16"), name=f"{name}_out",
                              tag="elemwise|cast")
        axes = _axes(raw_tensor, axis)
        shape = shape_to_list(raw_tensor.shape)
        rax = [te.reduce_axis((0, shape[a]), name=f"r{a}") for a in axes]
        out_shape = [1 if i in axes else s for i, s in enumerate(shape)] if keepdims else \
            [s for i, s in enumerate(shape) if i not in axes]

        def f(*idx):
            full, it, rit = [], iter(idx), iter(rax)
            for i in range(len(shape)):
                if i in axes:
                    full.append(next(rit))
                    if keepdims:
                        next(it)
                else:
                    full.append(next(it))
            return comb(raw_tensor(*full), axis=rax)

        return te.compute(out_shape or [1], f if out_shape else (lambda _: comb(raw_tensor(*rax), axis=rax)),
                          name=name, tag=f"reduce|{name}")

    op.__name__ = name
    op.__doc__ = f"{name} over `axis` (all axes by default)."
    return op


def _prod(expr, axis):
    prod = te.comm_reducer(lambda a, b: a * b, lambda t: tirx.const(1, dtype=t), name="prod")
    return prod(expr, axis=axis)


sum = _reduce("sum", te.sum)  # noqa: A001 (TBE's name)
reduce_max = _reduce("reduce_max", te.max)
reduce_min = _reduce("reduce_min", te.min)
reduce_prod = _reduce("reduce_prod", _prod)
