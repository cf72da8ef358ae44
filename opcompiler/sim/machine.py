"""Reading a simulated machine from its target description: once per description.

Both machines are frozen `Clocked` figures read from a `Target` (`targets/*.toml`, or a user's
variant): `load` reads one with the machine's own reader and caches it under everything a
description can differ by (its file, its content digest, and the fields a caller may replace:
cores, clock, memories, plus what a machine adds, e.g. the DSP's data mode), and remembers the
description each machine was read from (`source_target`: the functional clocks read the same
file with their own tables). `levels` reads the memory levels a machine allocates in (capacity
and alignment) the same way for both.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, TypeVar

from .buffers import Level

__all__ = ["load", "levels", "source_target"]

M = TypeVar("M")

_CACHE: dict[tuple, Any] = {}
_SOURCE: dict[int, tuple[Any, Any]] = {}


def load(target: Any, read: Callable[[Any], M], *key: Hashable) -> M:
    """The machine `read(target)` returns, read once per description (`key`: what the machine
    reads besides the file's figures, e.g. a mode a command line sets)."""
    k = (read, target.name, target.path, target.digest, target.cores, target.clock_ghz, target.memories, *key)
    m = _CACHE.get(k)
    if m is None:
        m = _CACHE[k] = read(target)
        _SOURCE[id(m)] = (m, target)
    return m


def source_target(m: Any) -> Any | None:
    """The target description machine `m` was read from (None for a machine built elsewhere)."""
    got = _SOURCE.get(id(m))
    return got[1] if got is not None and got[0] is m else None


def levels(target: Any, names: Iterable[str]) -> dict[str, Level]:
    """The memory levels `names` of the target, with its capacity and alignment (the target
    names a missing one: `Target.memory`)."""
    out = {}
    for name in names:
        mem = target.memory(name)
        out[name] = Level(name=name, capacity=mem.capacity_bytes, alignment=mem.alignment_bytes)
    return out
