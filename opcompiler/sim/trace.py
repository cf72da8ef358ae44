"""An independent accounting of a functional replay: cycles from what the execution did.

Timing mode schedules the instructions a program *declares* on the scoreboard, in one pass
that keeps running state (`scoreboard.Scoreboard`). A functional replay instead records, as
it executes each instruction, an `Event`: the unit, the buffers the execution actually read
and wrote (the machine's memory records them), its cost and the shared channels it held.
This module turns such a trace into cycles by a different route, never calling the
scoreboard:

1. `Trace.edges` derives the dependency graph from the access history alone: for every event,
   the previous event on its pipe, the last writer of every key it read, and the last writer
   and the readers since of every key it wrote;
2. `Trace.account` evaluates the graph in list-scheduling order across cores (at each step the
   core whose next event can start earliest, ties to the lower core), each start the latest of
   its predecessors' ends (a flag cost where a dependency crosses pipes, when the machine has
   flags), the issue clock and the barrier times; shared channels are granted in that order.

The two accountings agree when the program's declared dependencies are what its execution
does and the timing shortcuts (repeat compression, steady-state skips, core groups) are
exact; tests hold them to each other, and a dropped dependency, a dropped barrier or a wrong
cost makes them disagree or changes the result.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

WORK, STALL, BARRIER = 0, 1, 2


@dataclass(frozen=True)
class Event:
    """One executed instruction: kind (WORK, STALL: scalar work on the issue unit, BARRIER),
    pipe, keys read and written, cycles on its pipe, channels held (name, cycles) from `lead`
    cycles after it starts, and `mult` identical cores it stands for."""

    kind: int
    pipe: str = ""
    reads: tuple = ()
    writes: tuple = ()
    cycles: int = 0
    holds: tuple = ()
    lead: int = 0
    mult: int = 1


@dataclass
class Accounting:
    cycles: int
    busy: dict[str, float]
    syncs: int
    ends: list[int] = field(default_factory=list)  # per core: when its last event finished


def _edges(events: Sequence[Event]) -> list[tuple]:
    """(previous event on the pipe, ((writer, key) per key read), ((writer or None, readers since)
    per key written)) for every event of one core, from the access history."""
    last_on_pipe: dict[str, int] = {}
    writer: dict[Any, int] = {}
    readers: dict[Any, list[int]] = defaultdict(list)
    out = []
    for i, e in enumerate(events):
        if e.kind != WORK:
            out.append((None, (), ()))
            continue
        raw = tuple((writer[k], k) for k in e.reads if k in writer)
        war = tuple((writer.get(k), tuple(readers[k])) for k in e.writes)
        out.append((last_on_pipe.get(e.pipe), raw, war))
        last_on_pipe[e.pipe] = i
        for k in e.reads:
            readers[k].append(i)
        for k in e.writes:
            writer[k] = i
            readers[k] = []
    return out


class Trace:
    """The events of a functional replay, per core."""

    def __init__(self, ncores: int = 1):
        self.cores: list[list[Event]] = [[] for _ in range(ncores)]
        self._edges: list | None = None

    def record(self, core: int, event: Event) -> None:
        self.cores[core].append(event)
        self._edges = None

    def edges(self) -> list[list[tuple]]:
        if self._edges is None:
            self._edges = [_edges(evs) for evs in self.cores]
        return self._edges

    def account(self, *, costs: Sequence[Sequence[int]] | None = None, issue_cycles: int = 0, issue_unit: str = "",
                start: int = 0, sync_cycles: int | None = None) -> Accounting:
        """Evaluate the dependency graph (see the module docstring). `costs` overrides the
        events' cycles (per core, per event), e.g. for another round of bandwidth shares."""
        edges = self.edges()
        n = len(self.cores)
        ends = [[0] * len(evs) for evs in self.cores]
        issue = [start] * n
        floor = [0] * n  # barrier time: nothing of the core starts before it
        pos = [0] * n
        busy: dict[str, float] = defaultdict(float)
        chan_free: dict[str, int] = defaultdict(int)
        syncs = 0
        flags = sync_cycles is not None
        sync = sync_cycles or 0
        last_end = [start] * n

        def cost(c: int, i: int) -> int:
            return self.cores[c][i].cycles if costs is None else costs[c][i]

        def earliest(c: int, i: int) -> tuple[int, int]:
            """(start, flag syncs) of event i of core c if it issued now."""
            e, (prev, raw, war) = self.cores[c][i], edges[c][i]
            t = max(floor[c], issue[c] + issue_cycles)
            if prev is not None and ends[c][prev] > t:
                t = ends[c][prev]
            k = 0
            for w, _ in raw:
                v = ends[c][w]
                if flags and self.cores[c][w].pipe != e.pipe:
                    v += sync
                    k += 1
                if v > t:
                    t = v
            for w, rs in war:
                v = ends[c][w] if w is not None else 0
                for r in rs:
                    if ends[c][r] > v:
                        v = ends[c][r]
                if v > t:
                    t = v + sync
                    if flags:
                        k += 1
            return t, k

        while True:
            live = [c for c in range(n) if pos[c] < len(self.cores[c])]
            if not live:
                break
            # a barrier holds a core until every core with events reached one
            waiting = [c for c in live if self.cores[c][pos[c]].kind == BARRIER]
            runnable = [c for c in live if self.cores[c][pos[c]].kind != BARRIER]
            if not runnable:
                t = max(max(last_end[c], issue[c]) for c in waiting)
                for c in waiting:
                    floor[c] = issue[c] = last_end[c] = t
                    pos[c] += 1
                continue
            c = min(runnable, key=lambda j: (earliest(j, pos[j])[0] if self.cores[j][pos[j]].kind == WORK
                                             else issue[j], j))
            i = pos[c]
            e = self.cores[c][i]
            pos[c] += 1
            if e.kind == STALL:
                issue[c] += cost(c, i)
                busy[issue_unit] += cost(c, i)
                last_end[c] = max(last_end[c], issue[c])
                continue
            t, k = earliest(c, i)
            syncs += k
            if issue_cycles:
                issue[c] += issue_cycles
                busy[issue_unit] += issue_cycles
            end = t + cost(c, i)
            for ch, ccyc in e.holds:
                if ccyc:
                    s0 = max(chan_free[ch], t + e.lead)
                    chan_free[ch] = s0 + ccyc * e.mult
                    busy[ch] += ccyc * e.mult
                    end = max(end, chan_free[ch])
            busy[e.pipe] += (end - t) * e.mult
            ends[c][i] = end
            last_end[c] = max(last_end[c], end)
        total = max(max(last_end[c], issue[c]) for c in range(n)) if n else 0
        return Accounting(cycles=int(total), busy=dict(busy), syncs=syncs, ends=list(last_end))
