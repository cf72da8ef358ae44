"""The operator catalogue: for each op its compute (through `opcompiler.dsl`), a numpy
reference, FLOP and byte counts (a multiply-add counts 2, as seed 000 §4.2.3), its parameters
with defaults, and its unfused decomposition when it is a fusion.

    >>> from opcompiler.ops import get_op, workload
    >>> wl = workload("conv2d", preset="resnet50.res2_3x3", dtype="float32")
    >>> op = get_op(wl.op); ins, out = op.compute(wl)
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..errors import OpcError
from ..workload import Workload
from .presets import PRESETS, parse_shape
from .presets import preset as preset_params
from .registry import _OPS, OpDef, Step, register_op


def _load() -> None:
    from . import catalogue  # noqa: F401  (defines the built-in ops; imported once, even after a user's register_op)


_PRIM_WL: dict[str, Workload] = {}  # workload key -> workload (the cache below is keyed by the string)


def op_prim_func(wl: Workload):
    """The op's TE compute as a PrimFunc, built once per workload: a simulator template's
    configs change only the schedule applied to it."""
    key = wl.key_str()
    _PRIM_WL[key] = wl
    return _op_prim_func(key)


@lru_cache(maxsize=128)
def _op_prim_func(key: str):
    from tvm import te

    wl = _PRIM_WL[key]
    ins, out = get_op(wl.op).compute(wl)
    return te.create_prim_func(list(ins) + [out])


def get_op(name: str) -> OpDef:
    _load()
    try:
        return _OPS[name]
    except KeyError:
        raise OpcError("unknown op", arg="op", value=name, expected="one of " + ", ".join(sorted(_OPS))) from None


def list_ops() -> list[OpDef]:
    _load()
    return [_OPS[k] for k in sorted(_OPS)]


def workload(op: str, shape: str | Mapping[str, Any] | None = None, *, preset: str | None = None,
             batch: int | None = None, dtype: str | None = None) -> Workload:
    """Resolve an op, a shape (key=value string, mapping or preset name), --batch and --dtype."""
    d = get_op(op)
    params = dict(d.defaults)
    if isinstance(shape, str) and shape and "=" not in shape:
        preset, shape = shape, None
    if preset:
        p = preset_params(preset)
        if d.preset_kind and _kind(p) != d.preset_kind:
            raise OpcError(f"preset {preset} is a {_kind(p)} shape but {op} takes a {d.preset_kind} shape",
                           arg="--preset", value=preset,
                           expected=", ".join(k for k, v in PRESETS.items() if _kind(v) == d.preset_kind))
        params.update(p)
    if shape:
        given = parse_shape(shape) if isinstance(shape, str) else dict(shape)
        if unknown := set(given) - set(d.defaults):
            raise OpcError(f"{op} has no shape parameter {sorted(unknown)[0]!r}", arg="--shape",
                           value=shape if isinstance(shape, str) else given,
                           expected="keys among " + ", ".join(d.defaults))
        params.update(given)
    if batch is not None:
        if not isinstance(batch, int) or batch < 1:
            raise OpcError("must be a positive integer", arg="--batch", value=batch)
        bk = "n" if "n" in d.defaults and d.preset_kind != "matmul" else ("m" if "m" in d.defaults else None)
        if bk is None:
            raise OpcError(f"{op} has no batch dimension", arg="--batch", value=batch)
        params[bk] = batch
    for k, default in d.defaults.items():
        if isinstance(default, int) and not isinstance(params[k], int):
            raise OpcError("expected an integer", arg=k, value=params[k])
    dt = dtype or d.dtypes[0]
    if dt not in d.dtypes:
        raise OpcError(f"{op} does not support this dtype", arg="--dtype", value=dt, expected=" or ".join(d.dtypes))
    wl = Workload.make(op, params, dt)
    d.validate_fn(wl)
    return wl


def default_dtype(op: str, target: Any) -> str:
    """The dtype a target (or a target family) runs an op in by default: the first of the family's
    preferred dtypes the op has (fp16 on the Ascend cube), else fp32, else the op's first."""
    from ..capabilities import capabilities
    dts = get_op(op).dtypes
    for dt in capabilities(target).preferred_dtypes:
        if dt in dts:
            return dt
    return "float32" if "float32" in dts else dts[0]


def _kind(p: Mapping[str, Any]) -> str:
    return "conv" if "r" in p else "matmul"


def fold_bn(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float = 1e-5
            ) -> tuple[np.ndarray, np.ndarray]:
    """Inference batch norm as per-channel (scale, shift)."""
    scale = gamma / np.sqrt(var + eps)
    return scale.astype(gamma.dtype), (beta - mean * scale).astype(gamma.dtype)


__all__ = ["OpDef", "Step", "get_op", "op_prim_func", "list_ops", "register_op", "workload", "default_dtype", "fold_bn", "PRESETS"]
