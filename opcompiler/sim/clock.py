"""One clock unit for both machines: Hz. Rates given in GB/s become bytes per cycle here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Clocked:
    """Base of a machine's figures: cores and the clock in Hz."""

    cores: int
    clock_hz: float

    @property
    def clock_ghz(self) -> float:
        return self.clock_hz / 1e9

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    def bytes_per_cycle(self, gbps: float) -> float:
        return gbps * 1e9 / self.clock_hz
