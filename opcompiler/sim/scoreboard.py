"""The scoreboard scheduler: in-order pipes per core, buffer dependencies, shared channels.

One `Scoreboard` is one core (or a group of `mult` identical cores issuing the same work).
An instruction starts when its pipe is free (pipes execute in order), when the scalar issue
clock has issued it (`issue_cycles` per instruction; 0 for a machine without an issue model),
when every buffer it reads was last written (RAW) and every buffer it writes was last read
and written (WAR, WAW). With `sync_cycles` a dependency crossing pipes costs that many cycles
(set_flag / wait_flag on the DaVinci core) and is counted. A transfer may also hold shared
`Channels` (off-chip or cluster-shared bandwidth): each channel is a queue that carries one
transfer at a time for bytes / bandwidth cycles, times the group's multiplicity, so cores
moving data at once wait on each other. `barrier` makes every pipe of every given core wait
for the latest of them.

Busy time is charged per pipe as the cycles an instruction held it (end - start, channel
waits included), per channel as the cycles it carried data, and per issue unit as issue cycles.
`run_repeated` runs a block issued many times in a row and, once the state advances by the
same amount for three repetitions in a row, adds the rest exactly (the schedule is then
periodic). `interleave` issues several cores' streams in earliest-start order (channels are
granted in time order); `merge` folds identical core groups into one board.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any, Callable, Iterable

class Channels:
    """Shared-bandwidth channels: name -> cycle the channel is free again."""

    __slots__ = ("free", "busy")

    def __init__(self, names: Iterable[str], busy: dict | None = None):
        self.free = dict.fromkeys(names, 0)
        self.busy = busy if busy is not None else defaultdict(float)

    def hold(self, name: str, earliest: int, cycles: int, mult: int = 1) -> int:
        """Carry a transfer of `cycles` (per core, `mult` cores at once) starting no earlier than
        `earliest`; returns when it is done."""
        s0 = self.free[name]
        if earliest > s0:
            s0 = earliest
        end = s0 + cycles * mult
        self.free[name] = end
        self.busy[name] += cycles * mult
        return end


class Scoreboard:
    """One core's pipes and buffer scoreboard (see the module docstring)."""

    __slots__ = ("pipes", "work", "pipe", "ready", "read_end", "writer", "busy", "mult", "issue", "issue_cycles",
                 "issue_unit", "sync_cycles", "flags", "syncs")

    def __init__(self, pipes: tuple[str, ...], *, work: tuple[str, ...] | None = None, busy: dict | None = None,
                 mult: int = 1, issue_cycles: int = 0, issue_unit: str = "", start: int = 0,
                 sync_cycles: int | None = None):
        self.pipes = tuple(pipes)
        self.work = tuple(work or pipes)  # the pipes that run work (the floor of the steady-state test)
        self.pipe = dict.fromkeys(self.pipes, 0)
        self.ready: dict[Any, int] = {}  # key -> end of its last write
        self.read_end: dict[Any, int] = {}  # key -> end of its last read
        self.writer: dict[Any, str] = {}  # key -> pipe of its last write (with sync_cycles)
        self.busy = busy if busy is not None else defaultdict(float)
        self.mult = mult
        self.issue = start  # the scalar issue clock
        self.issue_cycles, self.issue_unit = issue_cycles, issue_unit
        self.flags = sync_cycles is not None
        self.sync_cycles = sync_cycles or 0
        self.syncs = 0

    # -- placing one instruction ------------------------------------------------------------

    def earliest(self, pipe: str, reads: tuple, writes: tuple) -> int:
        """The earliest start of an instruction now (no issue, no flags): pipe and dependencies."""
        t = self.pipe[pipe]
        r, w = self.ready, self.read_end
        for k in reads:
            v = r.get(k, 0)
            if v > t:
                t = v
        for k in writes:
            v = r.get(k, 0)
            v2 = w.get(k, 0)
            if v2 > v:
                v = v2
            if v > t:
                t = v
        return t

    def place(self, pipe: str, reads: tuple, writes: tuple, cycles: int,
              channels: Channels | None = None, holds: tuple = (), lead: int = 0) -> int:
        """Issue an instruction of `cycles` on `pipe`; `holds` are (channel, cycles) it also
        needs, from `lead` cycles after it starts. Returns its end."""
        if self.flags:
            start = self._start_flags(pipe, reads, writes)
        else:
            start = self.earliest(pipe, reads, writes)
        end = start + cycles
        if holds:
            k = self.mult
            for ch, ccyc in holds:
                if ccyc:
                    e = channels.hold(ch, start + lead, ccyc, k)
                    if e > end:
                        end = e
        self.busy[pipe] += (end - start) * self.mult
        self.pipe[pipe] = end
        rd = self.ready
        for key in writes:
            rd[key] = end
        if self.flags:
            wp = self.writer
            for key in writes:
                wp[key] = pipe
        rc = self.read_end
        for key in reads:
            if rc.get(key, 0) < end:
                rc[key] = end
        return end

    def _start_flags(self, pipe: str, reads: tuple, writes: tuple) -> int:
        if self.issue_cycles:
            self.issue += self.issue_cycles
            self.busy[self.issue_unit] += self.issue_cycles
        start = self.pipe[pipe]
        if self.issue > start:
            start = self.issue
        sync = self.sync_cycles
        ready, wp = self.ready, self.writer
        for k in reads:
            t = ready.get(k)
            if t is not None:
                if wp[k] != pipe:
                    t += sync
                    self.syncs += 1
                if t > start:
                    start = t
        rc = self.read_end
        for k in writes:
            t = ready.get(k, 0)
            t2 = rc.get(k, 0)
            if t2 > t:
                t = t2
            if t > start:
                start = t + sync
                self.syncs += 1
        return start

    def stall(self, cycles: int) -> None:
        """Scalar work on the issue unit: nothing issues for `cycles`."""
        self.issue += cycles
        self.busy[self.issue_unit] += cycles

    # -- time ---------------------------------------------------------------------------------

    def now(self) -> int:
        """When everything issued so far has finished."""
        t = max(self.pipe.values())
        return t if t > self.issue else self.issue

    def wait_until(self, t: int) -> None:
        for p in self.pipes:
            self.pipe[p] = t
        if t > self.issue:
            self.issue = t

    # -- steady state -------------------------------------------------------------------------

    def state(self, channels: Channels | None) -> list:
        """Every live timestamp, in a fixed order (pipes, channels, writes, reads)."""
        p = self.pipe
        out: list = [p[k] for k in self.pipes]
        if channels is not None:
            out += list(channels.free.values())
        return (out + [("r", t, v) for t, v in self.ready.items()]
                + [("w", t, v) for t, v in self.read_end.items()])

    def floor(self) -> int:
        return min(self.pipe[k] for k in self.work)

    def advance(self, dt: int, channels: Channels | None) -> None:
        """Shift every timestamp not in the past (>= the work pipes' floor) by dt."""
        now = self.floor()
        p = self.pipe
        for key in p:
            if p[key] >= now:
                p[key] += dt
        if channels is not None:
            f = channels.free
            for ch in f:
                if f[ch] >= now:
                    f[ch] += dt
        for d in (self.ready, self.read_end):
            for t, v in d.items():
                if v >= now:
                    d[t] = v + dt


def barrier(boards: list[Scoreboard]) -> None:
    """Every pipe of every board waits for the latest of them (pipe_barrier / a cluster barrier)."""
    t = max(sb.now() for sb in boards)
    for sb in boards:
        sb.wait_until(t)


def _shift(a: list, b: list, floor: int) -> int | None:
    """The common advance of all timestamps from state a to state b, if the move is a pure time
    shift (timestamps that did not move lie in the past and cannot bind again)."""
    if len(a) != len(b):
        return None
    va = [x if not isinstance(x, tuple) else x[2] for x in a]
    vb = [x if not isinstance(x, tuple) else x[2] for x in b]
    if any(isinstance(x, tuple) and (x[:2] != y[:2]) for x, y in zip(a, b)):
        return None
    moved = {y - x for x, y in zip(va, vb) if y != x}
    if len(moved) != 1:
        return None
    d = moved.pop()
    if any(y == x and y > floor - d for x, y in zip(va, vb)):
        return None  # a timestamp that did not move could still bind
    return d


def run_repeated(sb: Scoreboard, channels: Channels | None, body: tuple, count: int,
                 issue: Callable[[Any], None], on_skip: Callable[[int], None], skip: bool = True) -> None:
    """Issue `body` (through `issue`, one instruction at a time) `count` times on one board.
    Once three repetitions in a row advanced every live timestamp by the same amount, the state
    is periodic: the remaining r repetitions shift it by r times that amount, busy time grows
    by r times one repetition's, and `on_skip(r)` accounts the rest (counters). `skip=False`
    issues every repetition (tests check the skip is exact)."""
    deltas: list = []
    done = 0
    tallies = [sb.busy]
    if channels is not None and channels.busy is not sb.busy:
        tallies.append(channels.busy)
    while done < count:
        before = (sb.state(channels), [dict(b) for b in tallies])
        for ins in body:
            issue(ins)
        done += 1
        if not skip or count - done < 2:
            continue
        d = _shift(before[0], sb.state(channels), sb.floor())
        deltas.append(d)
        if d is not None and len(deltas) >= 3 and deltas[-2] == d and deltas[-3] == d:
            r = count - done
            sb.advance(r * d, channels)
            for busy, was in zip(tallies, before[1]):
                for key, v in busy.items():
                    busy[key] = v + r * (v - was.get(key, 0.0))
            on_skip(r)
            done = count


def merge(boards: list[Scoreboard], mult: int) -> Scoreboard:
    """One board standing for `boards` from now on (identical groups whose programs no longer
    differ): every timestamp the latest of theirs, the multiplicity their sum, busy shared."""
    one = Scoreboard(boards[0].pipes, work=boards[0].work, busy=boards[0].busy, mult=mult,
                     issue_cycles=boards[0].issue_cycles, issue_unit=boards[0].issue_unit,
                     sync_cycles=boards[0].sync_cycles if boards[0].flags else None)
    one.pipe = {k: max(sb.pipe[k] for sb in boards) for k in one.pipe}
    one.issue = max(sb.issue for sb in boards)
    for attr in ("ready", "read_end"):
        d: dict = {}
        for sb in boards:
            for t, v in getattr(sb, attr).items():
                d[t] = max(d.get(t, 0), v)
        setattr(one, attr, d)
    return one


def interleave(streams: list[list], mult: list[int], earliest: Callable[[int, Any], int],
               issue: Callable[[int, Any], None], sync: Callable[[list[int]], None],
               is_barrier: Callable[[Any], bool]) -> None:
    """Several cores (or groups) issuing their streams: at each step the core whose next
    instruction can start earliest (ties to the lower core) issues it, so shared channels are
    granted in time order. A barrier holds a core until every core with a stream reached it
    (counting multiplicities), then `sync` aligns them."""
    n = len(streams)
    idx = [0] * n
    heap: list[tuple[int, int]] = [(0, c) for c in range(n) if streams[c]]
    heapq.heapify(heap)
    at_barrier: set[int] = set()
    total = sum(mult[c] for c in range(n) if streams[c])
    while heap:
        _, c = heapq.heappop(heap)
        ins = streams[c][idx[c]]
        if is_barrier(ins):
            at_barrier.add(c)
            if sum(mult[j] for j in at_barrier) < total:
                continue
            sync(sorted(at_barrier))
            for j in sorted(at_barrier):
                idx[j] += 1
                if idx[j] < len(streams[j]):
                    heapq.heappush(heap, (earliest(j, streams[j][idx[j]]), j))
            at_barrier.clear()
            continue
        issue(c, ins)
        idx[c] += 1
        if idx[c] < len(streams[c]):
            heapq.heappush(heap, (earliest(c, streams[c][idx[c]]), c))
