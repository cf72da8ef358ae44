"""A fusion registry in TBE's style: `@fusion_manager.register("fuse_add_relu")`.

A fusion pattern is a compute function that combines several ops into one TE graph (one
kernel); `ops` names the op-by-op sequence it replaces, which graph partitioning matches and
the unfused plan runs as separate kernels through global memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import OpcError


@dataclass(frozen=True, kw_only=True)
class FusionPattern:
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
        self._load_builtins()
        try:
            return self._patterns[name]
        except KeyError:
            raise OpcError("unknown fusion pattern", arg="name", value=name,
                           expected=", ".join(sorted(self._patterns))) from None

    def patterns(self) -> list[FusionPattern]:
        self._load_builtins()
        return list(self._patterns.values())

    def _load_builtins(self) -> None:
        from .ops import fused  # noqa: F401  (registers the built-in patterns on first use)


fusion_manager = FusionManager()
