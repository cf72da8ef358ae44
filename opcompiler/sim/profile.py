"""The typed outcome of a simulation: `Timing` (what a replay produced) and `Profile` (the
report: cycles and time at the clock, busy per unit, bytes per memory level, peak, the bound
and the roofline). Both machines produce these; each names its own units and levels.

The bound is decided by one rule for every machine, `bound_of`: the unit with the largest busy
ratio bounds the kernel when it is busy at least half the time (`BUSY_FLOOR`); below that no
unit is, and the kernel is bound by latency (its units wait on each other). A unit whose issue
slots carry another unit's work (`feeds`: the DSP's VPU issue carries its FMACs' operations)
names that unit when it is at least `FED_SHARE` as busy, since the busy issue slots are then
doing its work. `report` is a run's metrics: the profile's keys, the machine's own, the mode."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True, kw_only=True)
class Timing:
    """A schedule replay: total cycles (host part included), busy cycles per unit (pipes,
    channels, issue), bytes per memory level or path, and the machine's own counters in
    `detail` (read as attributes: `t.gm_read_bytes`, `t.dsp_cycles`, ...)."""

    cycles: int
    busy: dict[str, float]
    bytes_by_level: dict[str, int] = field(default_factory=dict)
    host_cycles: int = 0
    syncs: int = 0
    instructions: int = 0
    counters: Any = None  # the issued work (a machine's counter object)
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device_cycles(self) -> int:
        return self.cycles - self.host_cycles

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "detail":
            raise AttributeError(name)
        try:
            return self.detail[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}") from None


BUSY_FLOOR = 0.5  # a unit busy at least this share of the run bounds it; below: latency
FED_SHARE = 0.9  # an issuing unit names the unit it feeds when that one is this busy relative to it
LATENCY = "latency (pipes wait on each other)"


def bound_of(ratio: Mapping[str, float], labels: Mapping[str, str] | None = None,
             feeds: Mapping[str, str] | None = None) -> str:
    """The one bound rule (see the module docstring). `ratio`: busy share per unit, unrounded,
    in the machine's order (the first of equal shares wins); `labels`: how a bounding unit is
    named (default: its key); `feeds`: issuing unit -> the unit whose work it issues."""
    labels, feeds = labels or {}, feeds or {}
    unit = max(ratio, key=ratio.get)
    if ratio[unit] < BUSY_FLOOR:
        return LATENCY
    fed = feeds.get(unit)
    if fed is not None and ratio[fed] >= FED_SHARE * ratio[unit]:
        unit = fed
    return labels.get(unit, unit)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What a run reports, in one typed form for every simulated machine."""

    cycles: int
    clock_hz: float
    flops: float
    peak_flops: float  # of the whole chip (or cluster), FLOP/s
    busy: Mapping[str, float]  # busy cycles per unit
    busy_ratio: Mapping[str, float]  # busy / cycles (per unit, normalised as the machine says)
    bytes_by_level: Mapping[str, int]
    offchip_bytes: float  # bytes to and from the off-chip level (the roofline's denominator)
    offchip_gbps: float
    bound: str  # the resource that bounds the kernel: `bound_of(busy_ratio, ...)`

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz

    @property
    def achieved_flops(self) -> float:
        s = self.seconds
        return self.flops / s if s else 0.0

    @property
    def percent_of_peak(self) -> float:
        s = self.seconds
        return 100.0 * self.flops / s / self.peak_flops if s and self.peak_flops else 0.0

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.offchip_bytes if self.offchip_bytes else float("inf")

    @property
    def attainable_flops(self) -> float:
        return min(self.peak_flops, self.arithmetic_intensity * self.offchip_gbps * 1e9)

    @property
    def roofline_bound(self) -> str:
        return "compute" if self.arithmetic_intensity * self.offchip_gbps * 1e9 >= self.peak_flops else "memory"

    def roofline(self) -> dict[str, Any]:
        return {"peak_tflops": self.peak_flops / 1e12, "arithmetic_intensity": self.arithmetic_intensity,
                "attainable_tflops": self.attainable_flops / 1e12, "roofline_bound": self.roofline_bound,
                "offchip_gbps": self.offchip_gbps}

    def metrics(self) -> dict[str, Any]:
        """The keys every simulated machine reports."""
        return {"cycles": self.cycles, "time_us": self.seconds * 1e6, "tflops": self.achieved_flops / 1e12,
                "percent_of_peak": self.percent_of_peak, "bound": self.bound,
                "pipe_ratios": {k: round(v, 4) for k, v in self.busy_ratio.items()},
                "bytes_by_level": dict(self.bytes_by_level), "roofline": self.roofline()}


def report(p: Profile, machine_keys: Mapping[str, Any], functional: bool) -> dict[str, Any]:
    """A run's metrics, for every simulated machine: the profile's common keys (cycles, time,
    TFLOPS, percent of peak, bound, busy ratios per unit as `pipe_ratios`, bytes per level, the
    roofline), then the machine's own keys, then the mode ("functional" or "timing")."""
    return {**p.metrics(), **machine_keys, "mode": "functional" if functional else "timing"}
