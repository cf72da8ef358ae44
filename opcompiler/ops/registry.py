"""The registries of ops and of fusion patterns.

Ops: `OpDef` (an op's compute, reference, shapes and flops), `Step` and `register_op`. The
catalogue of built-in ops registers into it; `opcompiler.ops` looks ops up (loading the
catalogue first), so the catalogue imports this module, never the package.

Fusion patterns: `fusion_manager`, TBE's `@fusion_manager.register(name, ops=...)`, the one way
a pattern is registered, the built-in ones (`opcompiler.ops.fused`) and a user's alike. Users
import it from `opcompiler.ops.fusion`, which loads the built-ins first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import OpcError
from ..workload import Workload
from .steps import Chain, parse_chain


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
    # element-wise ops: the op as a chain of steps (`opcompiler.ops.steps`), its text or a function of
    # the workload giving it ("bn;relu"); the simulators' element-wise templates lower any op that has one
    chain: str | Callable[[Workload], str] = ""
    # fused ops: the element-wise steps applied, in order, to the anchor's (conv2d's, matmul's) result,
    # as chain text over the same vocabulary ("bias;relu", "bn;add;relu": `add` is the residual);
    # the templates lower a fused op when they can lower every step of it (`steps.lowerable`)
    epilogue: str = ""

    def epilogue_steps(self, wl: Workload | None = None) -> Chain:
        """The fused op's epilogue steps, parsed ([(step, args)]); [] when it has none."""
        return parse_chain(self.epilogue) if self.epilogue else []

    def steps(self, wl: Workload) -> Chain | None:
        """The op's chain of element-wise steps, parsed ([(step, args)]); None when it is no chain."""
        if not self.chain:
            return None
        return parse_chain(self.chain(wl) if callable(self.chain) else self.chain)

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
        specs = self.inputs(wl)
        hidden = next((s[-1] for n, s, _ in specs if n == "R" and len(s) == 3), 1)  # recurrent: R (1, gates*h, h)
        for name, shape, dt in specs:
            if dt == "int8":
                out.append(rng.integers(-8, 8, size=shape).astype(dt))
            elif name in ("scale", "bn_scale"):
                out.append(rng.uniform(0.5, 1.5, size=shape).astype(dt))
            elif name in ("W", "R", "B") and shape[0] == 1:  # ONNX recurrent weights, as torch initialises
                # them, U(-1/sqrt(h), 1/sqrt(h)) (h: R's last axis, for lstm and gru alike): N(0, 1)
                # recurrent weights are chaotic over many steps
                bound = 1.0 / np.sqrt(hidden)
                out.append(rng.uniform(-bound, bound, size=shape).astype(dt))
            else:
                out.append(rng.standard_normal(size=shape).astype(dt))
        return out


_OUTPUT_SPECS: dict[tuple[str, Workload], tuple[tuple[int, ...], str]] = {}  # op names are unique
_OPS: dict[str, OpDef] = {}


@dataclass(frozen=True, kw_only=True)
class FusionPattern:
    """A compute function combining several ops into one TE graph (one kernel); `ops` names the
    op-by-op sequence it replaces, which graph partitioning matches and the unfused plan runs as
    separate kernels through global memory."""

    name: str
    compute: Callable
    ops: tuple[str, ...] = ()


class FusionManager:
    """Registry of fused compute functions, keyed by name."""

    def __init__(self) -> None:
        self._patterns: dict[str, FusionPattern] = {}

    def register(self, name: str, ops: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` as fusion pattern `name` (registering a name twice raises)."""
        def deco(fn: Callable) -> Callable:
            if name in self._patterns:
                raise OpcError(f"fusion pattern {name!r} is already registered",
                               expected="a new name, or fusion_manager.unregister() first")
            self._patterns[name] = FusionPattern(name=name, compute=fn, ops=tuple(ops))
            return fn
        return deco

    def unregister(self, name: str) -> None:
        self._patterns.pop(name, None)

    def get(self, name: str) -> FusionPattern:
        try:
            return self._patterns[name]
        except KeyError:
            raise OpcError("unknown fusion pattern", arg="name", value=name,
                           expected=", ".join(sorted(self._patterns))) from None

    def patterns(self) -> list[FusionPattern]:
        return list(self._patterns.values())


fusion_manager = FusionManager()


def register_op(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise OpcError(f"op {op.name!r} is already registered")
    _OPS[op.name] = op
    return op
