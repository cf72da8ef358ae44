"""A fusion registry in TBE's style: `@fusion_manager.register("fuse_add_relu")`.

A fusion pattern is a compute function that combines several ops into one TE graph (one
kernel); `ops` names the op-by-op sequence it replaces, which graph partitioning matches and
the unfused plan runs as separate kernels through global memory.

The registry itself is `opcompiler.ops.registry`'s `fusion_manager`; the built-in patterns
(`opcompiler.ops.fused`) register into it with the same `@fusion_manager.register(...)` a user
writes, when that module is imported. This module imports it first, so a lookup through it finds
the built-ins whatever was imported before, and a user's pattern named like a built-in collides
at once.
"""
from __future__ import annotations

from . import fused  # noqa: F401  (registers the built-in patterns)
from .registry import FusionManager, FusionPattern, fusion_manager

__all__ = ["FusionManager", "FusionPattern", "fusion_manager"]
