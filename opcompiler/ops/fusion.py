"""A fusion registry in TBE's style: `@fusion_manager.register("fuse_add_relu")`.

A fusion pattern is a compute function that combines several ops into one TE graph (one
kernel); `ops` names the op-by-op sequence it replaces, which graph partitioning matches and
the unfused plan runs as separate kernels through global memory.

The built-in patterns (`opcompiler.ops.fused`) are written with `@fused(...)`, this
decorator's twin that only collects them; the manager registers them on its first use. So
this module imports them and they never import it (no import cycle), and a user's lookup
finds them whatever was imported first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import OpcError


@dataclass(frozen=True, kw_only=True)
class FusionPattern:
    name: str
    compute: Callable
    ops: tuple[str, ...] = ()


class FusionManager:
    """Registry of fused compute functions, keyed by name."""

    def __init__(self) -> None:
        self._patterns: dict[str, FusionPattern] = {}
        self._builtins_loaded = False

    def register(self, name: str, ops: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` as fusion pattern `name` (registering a name twice raises)."""
        self._load_builtins()  # a user's pattern named like a built-in collides now, not later

        def deco(fn: Callable) -> Callable:
            self._add(FusionPattern(name=name, compute=fn, ops=tuple(ops)))
            return fn
        return deco

    def _add(self, pattern: FusionPattern) -> None:
        if pattern.name in self._patterns:
            raise OpcError(f"fusion pattern {pattern.name!r} is already registered",
                           expected="a new name, or fusion_manager.unregister() first")
        self._patterns[pattern.name] = pattern

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
        if self._builtins_loaded:
            return
        self._builtins_loaded = True  # before registering: an unregistered built-in stays unregistered
        from .fused import BUILTIN
        for name, ops, fn in BUILTIN:
            self._add(FusionPattern(name=name, compute=fn, ops=ops))


fusion_manager = FusionManager()
