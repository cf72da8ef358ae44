"""The operator catalogue: for each op its compute (through `opcompiler.dsl`), a numpy
reference, FLOP and byte counts (a multiply-add counts 2, as seed 000 §4.2.3), its parameters
with defaults, and its unfused decomposition when it is a fusion.

    >>> from opcompiler.ops import get_op, workload
    >>> wl = workload("conv2d", preset="resnet50.res2_3x3", dtype="float32")
    >>> op = get_op(wl.op); ins, out = op.compute(wl)
"""
from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..errors import OpcError
from ..workload import Workload, use_catalogue
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
        raise _unknown_op(name, _OPS) from None


def _unknown_op(name: str, names) -> OpcError:
    return OpcError("unknown op" + did_you_mean(name, names), arg="op", value=name,
                    expected="one of " + ", ".join(sorted(names)))


def did_you_mean(word: str, choices) -> str:
    """`; did you mean 'x'?` for the closest of `choices` (difflib), or ''."""
    import difflib
    close = difflib.get_close_matches(str(word), sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def op_info(op: str):
    """The op's `index.OpInfo` (family, summary, defaults in its key order, preset kind, dtypes):
    from the TVM-free index when it is current and lists the op, else from the catalogue."""
    from .index import OPS, OpInfo, current
    if op not in _OPS and current():
        if op in OPS:
            return OPS[op]
        raise _unknown_op(op, OPS)  # the index is the whole catalogue: a typo, answered without TVM
    d = get_op(op)
    return OpInfo(d.family, d.summary, dict(d.defaults), d.preset_kind, tuple(d.dtypes))


def op_infos() -> dict:
    """Every op's `index.OpInfo`, by name (the index when current, else the catalogue)."""
    from .index import OPS, current
    if current():
        return {**OPS, **{k: op_info(k) for k in _OPS if k not in OPS}}
    return {o.name: op_info(o.name) for o in list_ops()}


def op_keys(op: str) -> tuple[str, ...]:
    """The op's shape keys in its own order (without loading the catalogue for a built-in op)."""
    return op_info(op).keys


def check_args(op: str, shape: str | Mapping[str, Any] | None = None, preset: str | None = None,
               dtype: str | None = None) -> None:
    """What `workload` checks about names, without TVM: the op's name (with a suggestion), the
    preset, the keys of `shape` and the dtype. The CLI runs it before anything imports TVM, so
    a typo is answered at once (`op_info`: the catalogue is loaded only when the index is stale)."""
    info = op_info(op)
    if isinstance(shape, str) and shape and "=" not in shape:
        preset, shape = shape, None
    if preset:
        if preset not in PRESETS:
            raise OpcError("unknown preset" + did_you_mean(preset, PRESETS), arg="--preset", value=preset,
                           expected="one of " + ", ".join(sorted(PRESETS)))
        kind = _kind(PRESETS[preset])
        if info.preset_kind and kind != info.preset_kind:
            raise OpcError(f"preset {preset} is a {kind} shape but {op} takes a {info.preset_kind} shape",
                           arg="--preset", value=preset,
                           expected=", ".join(k for k, v in PRESETS.items() if _kind(v) == info.preset_kind))
    if shape:
        given = parse_shape(shape) if isinstance(shape, str) else dict(shape)
        if unknown := [k for k in given if k not in info.keys]:
            raise OpcError(f"{op} has no shape parameter {unknown[0]!r}" + did_you_mean(unknown[0], info.keys),
                           arg="--shape", value=shape if isinstance(shape, str) else given,
                           expected="keys among " + ", ".join(info.keys))
    if dtype and dtype not in info.dtypes:
        raise OpcError(f"{op} does not support this dtype", arg="--dtype", value=dtype,
                       expected=" or ".join(info.dtypes))


def shape_sources(op: str, shape: str | Mapping[str, Any] | None = None, preset: str | None = None,
                  batch: int | None = None) -> dict[str, str]:
    """Where `workload` takes each shape key from, in the op's key order: 'shape' (given),
    'batch' (--batch), the preset's name, or 'default' (the op's defaults)."""
    if isinstance(shape, str) and shape and "=" not in shape:
        preset, shape = shape, None
    src = {k: "default" for k in op_keys(op)}
    if preset:
        src.update({k: preset for k in PRESETS.get(preset, {}) if k in src})
    if shape:
        src.update({k: "shape" for k in (parse_shape(shape) if isinstance(shape, str) else shape) if k in src})
    if batch is not None:
        bk = "n" if "n" in src and op_info(op).preset_kind != "matmul" else ("m" if "m" in src else None)
        if bk is not None:
            src[bk] = "batch"
    return src


def ordered_params(op: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` in the op's own key order (a workload keeps them sorted, for its record key)."""
    keys = [k for k in op_keys(op) if k in params]
    return {**{k: params[k] for k in keys}, **{k: v for k, v in sorted(params.items()) if k not in keys}}


def shape_text(op: str, params: Mapping[str, Any], preset: str | None = None) -> str:
    """`n=1,c=64,h=56,...` in the op's key order, after the preset's name when one was used:
    `resnet50.res2_3x3 (n=1,c=64,...)`."""
    s = ",".join(f"{k}={v}" for k, v in ordered_params(op, params).items())
    return f"{preset} ({s})" if preset else s


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


use_catalogue(sys.modules[__name__])  # the core's config and record store ask ops through this module

__all__ = ["OpDef", "Step", "get_op", "check_args", "op_info", "op_infos", "shape_sources", "shape_text", "ordered_params", "op_keys", "op_prim_func", "list_ops", "register_op", "workload", "default_dtype", "fold_bn", "PRESETS"]
