"""Memory levels, bump allocation with capacity and alignment, and the one CapacityError.

Both machines allocate their on-chip buffers through `Arena`: Ascend's `KernelBuilder.alloc`
(L1, L0A/B/C, UB; per core) and the DSP's `Allocator.alloc` (GSM per cluster, AM and SM per
core). An overflow raises `CapacityError` naming the buffer, the level and the bytes; it is
the project's `opcompiler.errors.CapacityError` (an `OpcError`, so the CLI prints one line and
the tuner records an invalid candidate).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CapacityError

__all__ = ["Arena", "CapacityError", "Level"]


@dataclass(frozen=True, kw_only=True)
class Level:
    """One memory level: its name, capacity in bytes (0: unbounded) and alignment in bytes."""

    name: str
    capacity: int
    alignment: int


class Arena:
    """Bump allocation in one level of one core (or of a shared level): buffers never overlap."""

    __slots__ = ("level", "capacity", "align", "top", "buffers")

    def __init__(self, level: str, capacity_bytes: int, align_bytes: int):
        self.level, self.capacity, self.align, self.top = level, capacity_bytes, max(int(align_bytes), 1), 0
        self.buffers: list[tuple[str, int]] = []

    @classmethod
    def of(cls, level: Level) -> "Arena":
        return cls(level.name, level.capacity, level.alignment)

    def alloc(self, name: str, nbytes: int, what: str = "") -> int:
        """Byte offset of a new `nbytes` buffer at the level's alignment. Overflow raises
        CapacityError: the buffer's bytes against the bytes still free (capacity 0: unbounded)."""
        start = -(-self.top // self.align) * self.align
        if self.capacity and start + nbytes > self.capacity:
            used = ", ".join(f"{n} {b} B" for n, b in self.buffers) or "nothing else"
            detail = f"{what}; " if what else ""
            raise CapacityError(name, self.level, nbytes, self.capacity - start, f"{detail}already holding {used}")
        self.top = start + nbytes
        self.buffers.append((name, nbytes))
        return start
