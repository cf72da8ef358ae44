"""The pipe scheduler: replay one core's instruction stream on six in-order, parallel pipes.

The scalar unit issues every instruction in program order (`issue_cycles` each, plus loop
control); each pipe (S, V, M, MTE1, MTE2, MTE3) executes its instructions in order; an
instruction starts when its pipe is free and every buffer it reads was last written (RAW)
and every buffer it writes has been read and written by earlier instructions (WAR, WAW).
A dependency between two pipes is what set_flag / wait_flag express on the chip; each costs
`sync_cycles` and is counted. Ping-pong buffers are distinct buffers, so double buffering
removes the WAR waits and lets MTE2, MTE1, M, V and MTE3 overlap.

Off-chip bandwidth is shared by the active cores. One core's program is simulated (core 0,
which holds the largest share; the others run the same loop on other tiles) and every GM
transfer runs at
    min(path rate, its share of the L2 and HBM bandwidth)
where a read is served from L2 with the kernel's L2 hit ratio (bytes re-read by the cores,
i.e. all cores' reads minus the unique bytes of the input tensors, hit L2 as far as L2 holds
those tensors; the rest come from HBM) and writes go to HBM. The share divides HBM among the
streams reaching it and L2 among the readers; how many cores transfer at once is the active
core count times the busy fraction of the simulated core's MTE2 / MTE3 pipe, found by a
damped fixed-point iteration over a few replays (`CONTENTION_ROUNDS`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .builder import Program
from .isa import Barrier, DataMove, Load3D, Mmad, Scalar, Vec
from .machine import PIPES

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The outcome of a schedule replay: cycles, per-pipe busy cycles, bytes moved per path."""

    cycles: int
    busy: dict[str, int]
    bytes_by_path: dict[str, int]
    gm_read_bytes: int
    gm_write_bytes: int
    hbm_read_fraction: float
    syncs: int
    instructions: int
    cube_fractals: int
    vec_elements: int


def _hbm_fraction(prog: Program) -> tuple[float, int, int]:
    """(fraction of GM reads served by HBM, core 0's GM read bytes, core 0's GM write bytes)."""
    m = prog.machine
    n = max(prog.active_cores, 1)
    per_core_read = sum(i.nbytes for i in prog.instrs if isinstance(i, DataMove) and i.path[0] == "GM")
    per_core_write = sum(i.nbytes for i in prog.instrs if isinstance(i, DataMove) and i.path[1] == "GM")
    unique = sum(b.nbytes for name, b in prog.gm.items() if name in prog.info.get("gm_inputs", ()))
    total_reads = per_core_read * n
    if total_reads <= 0:
        return 1.0, per_core_read, per_core_write
    reuse = max(0.0, 1.0 - unique / total_reads)
    held = min(1.0, m.l2_bytes / unique) if unique else 1.0
    return 1.0 - reuse * held, per_core_read, per_core_write


def _gm_rates(prog: Program, hbm_frac: float, readers: float, writers: float) -> tuple[float, float]:
    """(read, write) bytes per cycle of one core's GM transfers when `readers` and `writers`
    cores transfer at the same time: HBM is split among the streams that reach it, L2 among
    the readers."""
    m = prog.machine
    hbm = m.offchip_gbps / m.clock_ghz  # bytes per cycle for the whole chip
    l2 = m.l2_gbps / m.clock_ghz
    streams = max(readers * hbm_frac + writers, 1.0)
    hbm_share, l2_share = hbm / streams, l2 / max(readers, 1.0)
    read = 1.0 / (hbm_frac / hbm_share + (1.0 - hbm_frac) / l2_share)
    return read, hbm_share


def cost(prog: Program, read_bpc: float, write_bpc: float) -> np.ndarray:
    """Cycles of every instruction (same in both modes: it depends on shapes, never on values)."""
    m = prog.machine
    out = np.zeros(len(prog.instrs), np.int64)
    for j, ins in enumerate(prog.instrs):
        if isinstance(ins, DataMove):
            p = m.path(*ins.path)
            bpc = p.bytes_per_cycle
            if ins.path[0] == "GM":
                bpc = min(bpc, read_bpc)
            elif ins.path[1] == "GM":
                bpc = min(bpc, write_bpc)
            c = p.latency_cycles + ins.nbytes / bpc + p.burst_cycles * max(ins.bursts - 1, 0)
        elif isinstance(ins, Load3D):
            p = m.path("L1", ins.dst.level)
            c = p.latency_cycles + ins.nbytes / p.bytes_per_cycle
        elif isinstance(ins, Mmad):
            c = m.cube_startup + ins.m1 * ins.k1 * ins.n1
        elif isinstance(ins, Vec):
            slow = m.vec_slow_ops.get(ins.op, 0)
            c = m.vec_startup + ins.repeat * (m.vec_cycles_per_repeat + slow)
        elif isinstance(ins, Scalar):
            c = ins.n
        else:
            c = 0
        out[j] = int(np.ceil(c))
        ins.cycles = int(out[j])
    return out


CONTENTION_ROUNDS = 4


def schedule(prog: Program) -> Timing:
    """Replay `prog` on the pipes (no arithmetic). Bandwidth contention is found by a short
    fixed-point iteration: the cores transferring at once = active cores x the fraction of
    time the simulated core's MTE2 (reads) / MTE3 (writes) pipe is busy."""
    hbm_frac, _, _ = _hbm_fraction(prog)
    n = float(max(prog.active_cores, 1))
    readers = writers = n
    t = None
    for _ in range(CONTENTION_ROUNDS):
        read_bpc, write_bpc = _gm_rates(prog, hbm_frac, readers, writers)
        t = _replay(prog, cost(prog, read_bpc, write_bpc), hbm_frac)
        duty_r = t.busy["MTE2"] / t.cycles if t.cycles else 1.0
        duty_w = t.busy["MTE3"] / t.cycles if t.cycles else 1.0
        # damped update keeps the iteration from oscillating
        readers = max(1.0, 0.5 * readers + 0.5 * n * duty_r)
        writers = max(1.0, 0.5 * writers + 0.5 * n * duty_w)
    return t


def _replay(prog: Program, cycles: np.ndarray, hbm_frac: float) -> Timing:
    m = prog.machine
    issue_c, sync_c = m.issue_cycles, m.sync_cycles
    pipe_free = dict.fromkeys(PIPES, 0)
    busy = dict.fromkeys(PIPES, 0)
    ready: dict[int, int] = {}  # buffer id -> end of its last write
    writer_pipe: dict[int, str] = {}
    read_done: dict[int, int] = {}  # buffer id -> end of the last read since that write
    by_path: dict[str, int] = {}
    s_time = m.launch_cycles
    syncs = fractals = vec_el = 0
    gm_r = gm_w = 0
    end_all = s_time
    for ins, c in zip(prog.instrs, cycles.tolist()):
        if isinstance(ins, Barrier):
            s_time = max(s_time, max(pipe_free.values()))
            for p in PIPES:
                pipe_free[p] = s_time
            continue
        if isinstance(ins, Scalar):
            s_time += c
            busy["S"] += c
            continue
        s_time += issue_c
        busy["S"] += issue_c
        pipe = ins.pipe
        start = max(s_time, pipe_free[pipe])
        for b in ins.reads:
            t = ready.get(b.id)
            if t is not None:
                if writer_pipe[b.id] != pipe:
                    t += sync_c
                    syncs += 1
                start = max(start, t)
        for b in ins.writes:
            t = max(ready.get(b.id, 0), read_done.get(b.id, 0))
            if t > start:
                start, syncs = t + sync_c, syncs + 1
        end = start + c
        pipe_free[pipe] = end
        busy[pipe] += c
        end_all = max(end_all, end)
        for b in ins.reads:
            if b.level != "GM":
                read_done[b.id] = max(read_done.get(b.id, 0), end)
        for b in ins.writes:
            if b.level != "GM":
                ready[b.id] = end
                writer_pipe[b.id] = pipe
                read_done[b.id] = end
        if isinstance(ins, DataMove):
            key = f"{ins.path[0]}->{ins.path[1]}"
            by_path[key] = by_path.get(key, 0) + ins.nbytes
            if ins.path[0] == "GM":
                gm_r += ins.nbytes
            elif ins.path[1] == "GM":
                gm_w += ins.nbytes
        elif isinstance(ins, Load3D):
            key = f"L1->{ins.dst.level}"
            by_path[key] = by_path.get(key, 0) + ins.nbytes
        elif isinstance(ins, Mmad):
            fractals += ins.m1 * ins.k1 * ins.n1
        elif isinstance(ins, Vec):
            vec_el += ins.repeat * ins.mask
    total = max(end_all, s_time)
    return Timing(cycles=int(total), busy=busy, bytes_by_path=by_path, gm_read_bytes=gm_r, gm_write_bytes=gm_w,
                  hbm_read_fraction=hbm_frac, syncs=syncs, instructions=len(prog.instrs), cube_fractals=fractals,
                  vec_elements=vec_el)
