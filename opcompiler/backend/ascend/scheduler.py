"""The pipe scheduler: replay one core's instruction stream on six in-order, parallel pipes.

The scalar unit issues every instruction in program order (`issue_cycles` each, plus loop
control); each pipe (S, V, M, MTE1, MTE2, MTE3) executes its instructions in order; an
instruction starts when its pipe is free and every buffer it reads was last written (RAW)
and every buffer it writes has been read and written by earlier instructions (WAR, WAW).
A dependency between two pipes is what set_flag / wait_flag express on the chip; each costs
`sync_cycles` and is counted. Ping-pong buffers are distinct buffers, so double buffering
removes the WAR waits and lets MTE2, MTE1, M, V and MTE3 overlap.

Off-chip bandwidth is shared by the active cores. One core's program is simulated (core 0,
which holds the largest share) and every GM transfer runs at
    min(path rate, share of the L2 and HBM bandwidth among the active cores)
where a read is served from L2 with the kernel's L2 hit ratio: bytes re-read by the cores
(all cores' reads minus the unique bytes of the tensors, as far as L2 holds them) hit L2,
the rest come from HBM. Writes go to HBM.
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


def _gm_rates(prog: Program) -> tuple[float, float, float]:
    """(read bytes/cycle, write bytes/cycle, fraction of reads from HBM) for one core's GM traffic."""
    m = prog.machine
    n = max(prog.active_cores, 1)
    per_core_read = sum(i.nbytes for i in prog.instrs if isinstance(i, DataMove) and i.path[0] == "GM")
    unique = sum(b.nbytes for name, b in prog.gm.items() if name in prog.info.get("gm_inputs", ()))
    total_reads = per_core_read * n
    if total_reads <= 0:
        hbm_frac = 1.0
    else:
        reuse = max(0.0, 1.0 - unique / total_reads)
        held = min(1.0, m.l2_bytes / unique) if unique else 1.0
        hbm_frac = 1.0 - reuse * held
    hbm_bpc = m.offchip_gbps * GB / (m.clock_ghz * GB) / n
    l2_bpc = m.l2_gbps * GB / (m.clock_ghz * GB) / n
    read_bpc = 1.0 / (hbm_frac / hbm_bpc + (1.0 - hbm_frac) / l2_bpc)
    return read_bpc, hbm_bpc, hbm_frac


def cost(prog: Program) -> tuple[np.ndarray, float]:
    """Cycles of every instruction (same in both modes: it depends on shapes, never on values)."""
    m = prog.machine
    read_bpc, write_bpc, hbm_frac = _gm_rates(prog)
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
    return out, hbm_frac


def schedule(prog: Program) -> Timing:
    """Replay `prog` on the pipes; returns cycles and counters (no arithmetic)."""
    m = prog.machine
    cycles, hbm_frac = cost(prog)
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
