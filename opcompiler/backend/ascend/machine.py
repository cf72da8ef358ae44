"""The DaVinci AI Core machine model, read from a target description (never hard-coded).

`Machine.from_target` turns a `Target` of family "ascend" into the figures the simulator and
the templates use: per-core buffers (capacity, alignment), the data paths (which pipe moves
which level to which, bytes per cycle, latency per instruction), the cube fractal per dtype,
the vector repeat, scalar costs, and the shared off-chip levels (HBM or DDR, L2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ...errors import OpcError
from ...sim.buffers import Level
from ...sim.clock import Clocked
from ...sim.machine import levels as memory_levels, load
from ...target import Target

PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3")
ON_CHIP = ("L1", "L0A", "L0B", "L0C", "UB")


@dataclass(frozen=True, kw_only=True)
class Path:
    """One data path: the pipe that executes it, its per-core rate and fixed cost per instruction."""

    src: str
    dst: str
    pipe: str
    bytes_per_cycle: float
    latency_cycles: int
    burst_cycles: float


@dataclass(frozen=True, kw_only=True)
class Machine(Clocked):
    """Everything the simulator needs to know about one Ascend target (`cores`, `clock_hz` and
    the clock helpers come from the simulator core's `Clocked`; `clock_ghz` is derived)."""

    target_name: str
    levels: Mapping[str, Level]
    paths: Mapping[tuple[str, str], Path]
    cube: Mapping[str, tuple[int, int, int]]  # dtype -> (m0, k0, n0)
    cube_acc: Mapping[str, str]
    cube_startup: int
    vec_repeat_bytes: int
    vec_block_bytes: int
    vec_max_repeat: int
    vec_cycles_per_repeat: int
    vec_startup: int
    vec_slow_ops: Mapping[str, int]
    issue_cycles: int
    loop_cycles: int
    sync_cycles: int
    core_sync_cycles: int  # SyncAll: a barrier across the active cores
    launch_cycles: int
    offchip_name: str
    offchip_gbps: float
    offchip_latency: int
    offchip_bytes: int
    l2_bytes: int
    l2_gbps: float
    c0: Mapping[str, int] = field(default_factory=dict)
    peak_flops_per_cycle: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def from_target(target: Target) -> "Machine":
        return _machine(target)

    def path(self, src: str, dst: str) -> Path:
        try:
            return self.paths[(src, dst)]
        except KeyError:
            raise OpcError(f"target {self.target_name} has no data path {src} -> {dst}",
                           expected=", ".join(f"{a}->{b}" for a, b in self.paths)) from None

    def level(self, name: str) -> Level:
        return self.levels[name]

    def cube_shape(self, dtype: str) -> tuple[int, int, int]:
        if dtype not in self.cube:
            raise OpcError(f"the cube of {self.target_name} does not take {dtype} operands", arg="--dtype",
                           value=dtype, expected=" or ".join(self.cube) + " (fp32 work runs on the vector unit; "
                           "seed 000 §6.3.2)")
        return self.cube[dtype]

    def lanes(self, itemsize: int) -> int:
        """Elements of one vector repeat (256 B) at this element size."""
        return self.vec_repeat_bytes // itemsize


def _int(v) -> int:
    return int(v)


def _machine(target: Target) -> Machine:
    return load(target, _read)  # once per description (the simulator core's loader)


def _read(target: Target) -> Machine:
    m = _build_machine(target)
    from . import fclock  # the functional replay of this machine's programs reads the same file

    fclock.bind(m, target)
    return m


def _build_machine(target: Target) -> Machine:
    if target.family != "ascend":
        raise OpcError(f"target {target.name} is of family {target.family}, not ascend")
    levels = memory_levels(target, ON_CHIP)
    shared = [m for m in target.memories if m.shared]
    off = [m for m in shared if m.scope == "global"]
    l2 = [m for m in shared if m.scope == "global.L2"]
    if not off or not l2:
        raise OpcError(f"target {target.name} needs a shared off-chip level (scope 'global') and an L2 "
                       f"(scope 'global.L2')")
    paths = {}
    for key, p in (target.extra.get("paths") or {}).items():
        src, dst = key.split("_")
        if p["pipe"] not in PIPES:
            raise OpcError(f"target {target.name}: path {key} names pipe {p['pipe']!r}", expected=", ".join(PIPES))
        paths[(src, dst)] = Path(src=src, dst=dst, pipe=p["pipe"], bytes_per_cycle=float(p["bytes_per_cycle"]),
                                 latency_cycles=_int(p["latency_cycles"]), burst_cycles=float(p.get("burst_cycles", 0)))
    cube_u, vec_u, sc_u = target.unit("cube"), target.unit("vector"), target.unit("scalar")
    cube = {dt: tuple(int(x) for x in v) for dt, v in cube_u.items() if isinstance(v, tuple)}
    acc = {k[4:]: v for k, v in cube_u.items() if k.startswith("acc_")}
    return Machine(
        target_name=target.name, cores=target.cores, clock_hz=target.clock_ghz * 1e9,
        levels=MappingProxyType(levels), paths=MappingProxyType(paths),
        cube=MappingProxyType(cube), cube_acc=MappingProxyType(acc), cube_startup=_int(cube_u["startup_cycles"]),
        vec_repeat_bytes=_int(vec_u["repeat_bytes"]), vec_block_bytes=_int(vec_u["block_bytes"]),
        vec_max_repeat=_int(vec_u["max_repeat"]), vec_cycles_per_repeat=_int(vec_u["cycles_per_repeat"]),
        vec_startup=_int(vec_u["startup_cycles"]), vec_slow_ops=MappingProxyType(dict(vec_u.get("slow_ops", {}))),
        issue_cycles=_int(sc_u["issue_cycles"]), loop_cycles=_int(sc_u["loop_cycles"]),
        sync_cycles=_int(sc_u["sync_cycles"]), core_sync_cycles=_int(sc_u["core_sync_cycles"]), launch_cycles=_int(sc_u["kernel_launch_cycles"]),
        offchip_name=off[0].name, offchip_gbps=off[0].bandwidth_gbps, offchip_latency=off[0].latency_cycles,
        offchip_bytes=off[0].capacity_bytes,
        l2_bytes=l2[0].capacity_bytes, l2_gbps=l2[0].bandwidth_gbps,
        c0=MappingProxyType(dict(target.extra.get("c0", {}))),
        peak_flops_per_cycle=target.peak_flops_per_cycle,
    )
