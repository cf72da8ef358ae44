"""The functional replay's own clock: a second accounting of the AI Core's cycles.

Timing mode (`timing.schedule`) costs what a program *declares* (each instruction's
`cost_cycles`, the `Machine` figures) on the scoreboard. The functional replay
(`execute.replay`) times what it *executes*, with nothing of that path:

* its own figures, read here from the target description (not from `Machine`): per data
  path the bytes per cycle, the latency and the cost per extra burst; the cube's start-up and
  fractals per cycle; the vector unit's start-up, cycles per repeat, slow ops and bytes per
  repeat; the scalar issue, flag (set_flag/wait_flag) and launch costs; HBM and L2 bandwidth
  and L2 capacity;
* its own cost of each executed instruction, from what the execution did: the levels the
  memory saw it read and write, the bytes it moved, the contiguous runs of the regions it
  touched, the fractal products the cube computed, the repeats the vector unit ran, the bytes a
  vector transpose moved;
* its own shared-bandwidth rounds (how many cores read HBM / L2 at once) from the GM bytes the
  execution moved and the input tensors that were really packed into GM;
* its own dependence tracking and list scheduling (`opcompiler.sim.trace`, from the buffers
  each execution read and wrote), never the scoreboard.

The two must give the same cycles on every kernel the simulator runs: tests hold them to
each other, and `tests/sim/test_mutations.py` breaks one cost in one accounting at a time
(cube, vector, each path's bandwidth, HBM, flags, barriers) and checks the clocks then differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from types import MappingProxyType
from typing import Mapping

from ...target import Target

__all__ = ["AscendClock", "clock", "bind", "for_machine", "runs", "ROUNDS"]

ROUNDS = 4  # the clock's own bandwidth-share rounds (the twin of `timing.CONTENTION_ROUNDS`)


@dataclass(frozen=True, kw_only=True)
class AscendClock:
    """Per-instruction latency and bandwidth tables of one Ascend target (per core)."""

    paths: Mapping[tuple[str, str], tuple[float, int, float]]  # (src, dst) -> (B/cycle, latency, per burst)
    cube_startup: int
    fractals_per_cycle: float
    vec_startup: int
    vec_per_repeat: int
    vec_slow: Mapping[str, int]
    vec_repeat_bytes: int  # bytes one repeat of the vector datapath moves (a transpose's unit)
    issue: int
    sync: int
    core_sync: int  # SyncAll across the active cores
    launch: int
    hbm_bpc: float  # bytes per cycle of the whole chip
    l2_bpc: float
    l2_bytes: int

    # -- what one executed instruction costs ---------------------------------------------------

    def move(self, src: str, dst: str, nbytes: int, bursts: int, read_bpc: float, write_bpc: float) -> int:
        """A transfer the execution made: latency + bytes at the path's rate (a GM side at most
        the contended GM rate) + the burst cost of every contiguous run after the first."""
        bpc, lat, burst = self.paths[(src, dst)]
        if src == "GM" and read_bpc < bpc:
            bpc = read_bpc
        elif dst == "GM" and write_bpc < bpc:
            bpc = write_bpc
        return ceil(lat + nbytes / bpc + burst * max(bursts - 1, 0))

    def cube(self, fractals: int) -> int:
        return self.cube_startup + ceil(fractals / self.fractals_per_cycle)

    def vector(self, op: str, repeats: int) -> int:
        return self.vec_startup + repeats * (self.vec_per_repeat + self.vec_slow.get(op, 0))

    def transpose(self, nbytes: int) -> int:
        """A vector transpose (vnchwconv) the execution ran: the bytes it moved through the
        vector datapath, a repeat's bytes per repeat time."""
        return self.vec_startup + ceil(nbytes / self.vec_repeat_bytes) * self.vec_per_repeat

    # -- the shared off-chip bandwidth -----------------------------------------------------------

    def hbm_fraction(self, read_bytes: int, unique_bytes: int, cores: int) -> float:
        """Fraction of one core's GM reads that reach HBM: what all cores re-read beyond the
        input tensors' own bytes hits L2, as far as L2 holds those tensors."""
        total = read_bytes * cores
        if total <= 0:
            return 1.0
        reread = max(0.0, 1.0 - unique_bytes / total)
        held = min(1.0, self.l2_bytes / unique_bytes) if unique_bytes else 1.0
        return 1.0 - reread * held

    def gm_rates(self, hbm_frac: float, readers: float, writers: float) -> tuple[float, float]:
        """(read, write) bytes per cycle of one core when `readers` / `writers` cores transfer at
        once: HBM split among the streams that reach it, L2 among the readers."""
        streams = max(readers * hbm_frac + writers, 1.0)
        hbm_share, l2_share = self.hbm_bpc / streams, self.l2_bpc / max(readers, 1.0)
        return 1.0 / (hbm_frac / hbm_share + (1.0 - hbm_frac) / l2_share), hbm_share


def runs(shape: tuple[int, ...], idx: tuple) -> tuple[int, int]:
    """(elements, contiguous runs) of the region `array[idx]` of a C-ordered array: a run is
    the innermost block of dimensions the region spans whole, plus the first it does not."""
    counts: list[int] = []
    whole: list[bool] = []
    for d, n in enumerate(shape):
        s = idx[d] if d < len(idx) else slice(None)
        if isinstance(s, slice):
            start, stop, step = s.indices(n)
            k = len(range(start, stop, step))
            counts.append(k)
            whole.append(k == n and step == 1)
        else:
            counts.append(1)
            whole.append(n == 1)
    elems = 1
    for k in counts:
        elems *= k
    if not elems:
        return 0, 0
    block = 1
    for k, w in zip(reversed(counts), reversed(whole)):
        block *= k
        if not w:
            break
    return elems, max(1, elems // block)


_CACHE: dict[tuple, AscendClock] = {}


def clock(target: Target) -> AscendClock:
    """The functional clock's tables for `target`, read from the target description."""
    key = (target.name, target.path, target.digest)
    if key not in _CACHE:
        _CACHE[key] = _read(target)
    return _CACHE[key]


def _read(target: Target) -> AscendClock:
    cube, vec, sc = target.unit("cube"), target.unit("vector"), target.unit("scalar")
    paths = {}
    for key, p in (target.extra.get("paths") or {}).items():
        src, dst = key.split("_")
        paths[(src, dst)] = (float(p["bytes_per_cycle"]), int(p["latency_cycles"]), float(p.get("burst_cycles", 0)))
    shared = [mem for mem in target.memories if mem.shared]
    hbm = next(mem for mem in shared if mem.scope == "global")
    l2 = next(mem for mem in shared if mem.scope == "global.L2")
    return AscendClock(
        paths=MappingProxyType(paths), cube_startup=int(cube["startup_cycles"]),
        fractals_per_cycle=float(cube.get("fractals_per_cycle", 1)),
        vec_startup=int(vec["startup_cycles"]), vec_per_repeat=int(vec["cycles_per_repeat"]),
        vec_slow=MappingProxyType({k: int(v) for k, v in dict(vec.get("slow_ops", {})).items()}),
        vec_repeat_bytes=int(vec["repeat_bytes"]),
        issue=int(sc["issue_cycles"]), sync=int(sc["sync_cycles"]),
        core_sync=int(sc["core_sync_cycles"]), launch=int(sc["kernel_launch_cycles"]),
        hbm_bpc=hbm.bandwidth_gbps / target.clock_ghz, l2_bpc=l2.bandwidth_gbps / target.clock_ghz,
        l2_bytes=l2.capacity_bytes)


_BOUND: dict[int, tuple[object, AscendClock]] = {}


def bind(machine: object, target: Target) -> None:
    """Remember which target description a `Machine` was read from (the backend does this), so a
    replay of its programs reads the same file's figures."""
    _BOUND[id(machine)] = (machine, clock(target))


def for_machine(machine) -> AscendClock:
    """The functional clock of the target a program's machine was read from: the bound file, or
    the shipped target of that name (a `Machine` whose figures a test changed still replays on
    the file's figures: the two accountings read the target separately)."""
    got = _BOUND.get(id(machine))
    if got is not None and got[0] is machine:
        return got[1]
    from ...target import load_target

    return clock(load_target(machine.target_name))
