"""The operator catalogue: for each op its compute (through `opcompiler.dsl`), a numpy
reference, FLOP and byte counts (a multiply-add counts 2, as seed 000 §4.2.3), its parameters
with defaults, and its unfused decomposition when it is a fusion.

    >>> from opcompiler.ops import get_op, workload
    >>> wl = workload("conv2d", preset="resnet50.res2_3x3", dtype="float32")
    >>> op = get_op(wl.op); ins, out = op.compute(wl)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import OpcError
from ..workload import Workload
from .presets import PRESETS, parse_shape
from .presets import preset as preset_params


@dataclass(frozen=True, kw_only=True)
class Step:
    """One kernel of an unfused sequence: `inputs` name op inputs (`in0`..) or earlier steps (`s0`..)."""

    op: str
    params: Mapping[str, Any]
    inputs: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class OpDef:
    name: str
    summary: str
    family: str  # template family: conv2d | matmul | elemwise | reduce | pool
    defaults: Mapping[str, Any]
    dtypes: tuple[str, ...]
    compute_fn: Callable[[Workload], tuple[list, Any]]
    reference_fn: Callable[[Workload, list[np.ndarray]], np.ndarray]
    input_specs: Callable[[Workload], list[tuple[str, tuple[int, ...], str]]]  # (name, shape, dtype)
    flops_fn: Callable[[Workload], int]
    validate_fn: Callable[[Workload], None] = lambda wl: None
    unfused_fn: Callable[[Workload], list[Step]] | None = None
    preset_kind: str = ""  # which presets apply: conv | matmul | ""
    fusion: str = ""  # fusion pattern name when this op is a fusion

    def compute(self, wl: Workload) -> tuple[list, Any]:
        """(input placeholders, output tensor) as one TE graph."""
        return self.compute_fn(wl)

    def reference(self, wl: Workload, inputs: Sequence[np.ndarray]) -> np.ndarray:
        return self.reference_fn(wl, list(inputs))

    def flops(self, wl: Workload) -> int:
        return int(self.flops_fn(wl))

    def inputs(self, wl: Workload) -> list[tuple[str, tuple[int, ...], str]]:
        return self.input_specs(wl)

    def output_spec(self, wl: Workload) -> tuple[tuple[int, ...], str]:
        """(shape, dtype) of the output; read off the compute once per workload, since every
        run and measurement asks for it to allocate the output buffer."""
        key = (self.name, wl)
        if key not in _OUTPUT_SPECS:
            _, out = self.compute(wl)
            _OUTPUT_SPECS[key] = tuple(int(d) for d in out.shape), str(out.dtype)
        return _OUTPUT_SPECS[key]

    def bytes(self, wl: Workload) -> int:
        """Compulsory bytes: every input read once, the output written once."""
        total = sum(int(np.prod(s)) * np.dtype(d).itemsize for _, s, d in self.inputs(wl))
        shape, dt = self.output_spec(wl)
        return total + int(np.prod(shape)) * np.dtype(dt).itemsize

    def unfused(self, wl: Workload) -> list[Step]:
        """The op-by-op sequence (one kernel each); a single-op list for non-fused ops."""
        if self.unfused_fn is None:
            return [Step(op=self.name, params=dict(wl.params), inputs=tuple(f"in{i}" for i in range(len(self.inputs(wl)))))]
        return self.unfused_fn(wl)

    def make_inputs(self, wl: Workload, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for name, shape, dt in self.inputs(wl):
            if dt == "int8":
                out.append(rng.integers(-8, 8, size=shape).astype(dt))
            elif name in ("scale", "bn_scale"):
                out.append(rng.uniform(0.5, 1.5, size=shape).astype(dt))
            else:
                out.append(rng.standard_normal(size=shape).astype(dt))
        return out


_OUTPUT_SPECS: dict[tuple[str, Workload], tuple[tuple[int, ...], str]] = {}  # op names are unique
_OPS: dict[str, OpDef] = {}


def register_op(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise OpcError(f"op {op.name!r} is already registered")
    _OPS[op.name] = op
    return op


def _load() -> None:
    if not _OPS:
        from . import catalogue  # noqa: F401  (defines the built-in ops)


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


def default_dtype(op: str, target_family: str) -> str:
    """The dtype a target runs an op in by default: fp16 on the Ascend cube, fp32 elsewhere."""
    dts = get_op(op).dtypes
    if target_family == "ascend" and "float16" in dts:
        return "float16"
    return "float32" if "float32" in dts else dts[0]


def _kind(p: Mapping[str, Any]) -> str:
    return "conv" if "r" in p else "matmul"


def fold_bn(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float = 1e-5
            ) -> tuple[np.ndarray, np.ndarray]:
    """Inference batch norm as per-channel (scale, shift)."""
    scale = gamma / np.sqrt(var + eps)
    return scale.astype(gamma.dtype), (beta - mean * scale).astype(gamma.dtype)


__all__ = ["OpDef", "Step", "get_op", "list_ops", "register_op", "workload", "default_dtype", "fold_bn", "PRESETS"]
