"""The timing model: replay one core's instruction stream on six in-order, parallel pipes.

Every cost of the timing model lives here or on the instruction classes it reads: each
instruction's `cost_cycles` (`program.py`: the per-instruction cost table, from the `Machine`
figures and the GM rates this module passes it) and, here, the GM rates under contention, the
issue model and the dependencies. Its twin, the functional clock of what an execution did, is
`fclock.py` (used by `execute.py`); the two share no code.

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

The pipes, the issue clock, the flag costs and barriers are the simulator core's scoreboard
(`opcompiler.sim.scoreboard`); what stays here is the DaVinci ISA's: which instructions the
scalar unit runs itself, the GM rates under contention, and the counters the report reads
(`backend.profile` / `backend.report_keys`). The functional run (`execute.run` / `replay`)
has its own accounting, never this scoreboard.
"""
from __future__ import annotations

from ...sim.profile import Timing
from ...sim.scoreboard import Scoreboard, barrier
from .machine import PIPES
from .program import TRANS_BLOCKS, Barrier, DataMove, Load3D, Mmad, Program, Scalar, SyncAll, Vec, VecTrans

__all__ = ["Timing", "schedule", "cost", "stream", "counters", "CONTENTION_ROUNDS"]


def _hbm_fraction(prog: Program, gm_bytes: tuple[int, int] | None = None) -> tuple[float, int, int]:
    """(fraction of GM reads served by HBM, core 0's GM read bytes, core 0's GM write bytes);
    the bytes are the program's (or `gm_bytes`: what an execution moved)."""
    m = prog.machine
    n = max(prog.active_cores, 1)
    if gm_bytes is None:
        per_core_read = sum(i.nbytes for i in prog.instrs if isinstance(i, DataMove) and i.path[0] == "GM")
        per_core_write = sum(i.nbytes for i in prog.instrs if isinstance(i, DataMove) and i.path[1] == "GM")
    else:
        per_core_read, per_core_write = gm_bytes
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


def cost(prog: Program, read_bpc: float, write_bpc: float) -> list[int]:
    """Cycles of every instruction (same in both modes: it depends on shapes, never on values);
    each instruction's `cost_cycles` is the ISA's cost model."""
    m = prog.machine
    out = [ins.cost_cycles(m, read_bpc, write_bpc) for ins in prog.instrs]
    for ins, c in zip(prog.instrs, out):
        ins.cycles = c
    return out


CONTENTION_ROUNDS = 4  # bandwidth-share rounds (the functional clock has its own: fclock.ROUNDS)
ISSUE, WORK, BARRIER = 0, 1, 2  # how the issue model treats an instruction


def stream(prog: Program) -> list[tuple]:
    """Core 0's instructions as the scoreboard sees them: (kind, pipe, read keys, write keys),
    the keys being the on-chip buffers (GM is never a dependency: the cores' tiles are
    disjoint and each GM tensor is read or written, not both, within a kernel)."""
    out = []
    for ins in prog.instrs:
        if isinstance(ins, Barrier):
            out.append((BARRIER, "", (), ()))
        elif isinstance(ins, (Scalar, SyncAll)):  # the scalar unit waits (loop control, other cores)
            out.append((ISSUE, "S", (), ()))
        else:
            out.append((WORK, ins.pipe, tuple(b.id for b in ins.reads if b.level != "GM"),
                        tuple(b.id for b in ins.writes if b.level != "GM")))
    return out


def counters(prog: Program) -> dict:
    """What core 0 issued: bytes per path, GM bytes, cube fractals, vector elements."""
    by_path: dict[str, int] = {}
    gm_r = gm_w = fractals = vec_el = 0
    for ins in prog.instrs:
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
        elif isinstance(ins, VecTrans):
            vec_el += ins.repeat * TRANS_BLOCKS * (32 // ins.src.itemsize)
    return {"bytes_by_path": by_path, "gm_read_bytes": gm_r, "gm_write_bytes": gm_w, "cube_fractals": fractals,
            "vec_elements": vec_el}


def schedule(prog: Program) -> Timing:
    """Replay `prog` on the pipes (no arithmetic). Bandwidth contention is found by a short
    fixed-point iteration: the cores transferring at once = active cores x the fraction of
    time the simulated core's MTE2 (reads) / MTE3 (writes) pipe is busy."""
    hbm_frac, _, _ = _hbm_fraction(prog)
    n = float(max(prog.active_cores, 1))
    readers = writers = n
    seq = stream(prog)
    cycles = busy = syncs = None
    for _ in range(CONTENTION_ROUNDS):
        read_bpc, write_bpc = _gm_rates(prog, hbm_frac, readers, writers)
        cycles, busy, syncs = _replay(prog, seq, cost(prog, read_bpc, write_bpc))
        readers, writers = _damped(n, readers, writers, busy, cycles)  # damped: no oscillation
    c = counters(prog)
    return Timing(cycles=int(cycles), busy=busy, bytes_by_level=c["bytes_by_path"], syncs=syncs,
                  instructions=len(prog.instrs), detail={**c, "hbm_read_fraction": hbm_frac})


def _replay(prog: Program, seq: list[tuple], cycles: list[int]) -> tuple[int, dict[str, int], int]:
    """One replay on the simulator core's scoreboard: (cycles, busy per pipe, flag syncs)."""
    m = prog.machine
    busy = dict.fromkeys(PIPES, 0)
    sb = Scoreboard(PIPES, busy=busy, issue_cycles=m.issue_cycles, issue_unit="S", start=m.launch_cycles,
                    sync_cycles=m.sync_cycles)
    place = sb.place
    for (kind, pipe, reads, writes), c in zip(seq, cycles):
        if kind == WORK:
            place(pipe, reads, writes, c)
        elif kind == ISSUE:
            sb.stall(c)
        else:
            barrier([sb])
    return sb.now(), busy, sb.syncs


def _damped(n: float, readers: float, writers: float, busy: dict, cycles: int) -> tuple[float, float]:
    duty_r = busy.get("MTE2", 0) / cycles if cycles else 1.0
    duty_w = busy.get("MTE3", 0) / cycles if cycles else 1.0
    return max(1.0, 0.5 * readers + 0.5 * n * duty_r), max(1.0, 0.5 * writers + 0.5 * n * duty_w)
