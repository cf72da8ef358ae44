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

The pipes, the issue clock, the flag costs and barriers are the simulator core's scoreboard
(`opcompiler.sim.scoreboard`); what stays here is the DaVinci ISA's: which instructions the
scalar unit runs itself, the GM rates under contention, and the counters the report reads.
`replay` / `run` are functional mode with its own accounting (`opcompiler.sim.trace`, from
the buffers each instruction's execution touched), never this scoreboard; `profile` builds the
run's typed `Profile`, and `report_keys` the DaVinci core's own report keys beside it.
"""
from __future__ import annotations

from ...sim.profile import Profile, Timing, bound_of
from ...sim.scoreboard import Scoreboard, barrier
from ...sim.trace import STALL, WORK as EV_WORK, Event, Trace
from . import fclock
from .builder import Plan, Program
from .fclock import AscendClock
from .isa import TRANS_BLOCKS, Barrier, DataMove, Load3D, Memory, Mmad, Scalar, SyncAll, Vec, VecTrans
from .machine import PIPES

GB = 1e9

__all__ = ["Timing", "Profile", "schedule", "replay", "run", "cost", "profile", "report_keys",
           "CONTENTION_ROUNDS"]


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


CONTENTION_ROUNDS = 4
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


# -- functional mode: execution and its own accounting -------------------------------------


def _damped(n: float, readers: float, writers: float, busy: dict, cycles: int) -> tuple[float, float]:
    duty_r = busy.get("MTE2", 0) / cycles if cycles else 1.0
    duty_w = busy.get("MTE3", 0) / cycles if cycles else 1.0
    return max(1.0, 0.5 * readers + 0.5 * n * duty_r), max(1.0, 0.5 * writers + 0.5 * n * duty_w)


def replay(prog: Program, mem: Memory, fc: AscendClock | None = None, at_sync=None) -> Timing:
    """Functional mode: execute core 0's program on `mem` and time it with the functional
    clock (`fclock`), a second accounting that shares nothing with `schedule`: the memory
    records the buffers each instruction actually read and wrote, the execution reports the
    work it did (bytes moved, fractal products, vector elements), the cost of each executed
    instruction comes from the clock's own tables (read from the target description, not
    from `Machine` or the ISA's `cost_cycles`), and `sim.trace` derives the dependency graph
    from those accesses and evaluates it, with the clock's own bandwidth-share rounds from the
    GM bytes the execution moved. The two must agree; a dependency the program fails to
    declare, a byte count it gets wrong, or a cost one accounting gets wrong shows.
    `at_sync()` runs at each SyncAll (the other cores catch up to it: `run`)."""
    fc = fc or fclock.for_machine(prog.machine)
    tr = Trace(1)
    by_path: dict[str, int] = {}
    gm_r = gm_w = fractals = vec_el = 0
    done: list[tuple] = []  # per event: what the clock costs it by
    for ins in prog.instrs:
        if isinstance(ins, Barrier):
            tr.record(0, Event(BARRIER))
            done.append(("free",))
            continue
        if isinstance(ins, Scalar):
            tr.record(0, Event(STALL, "S"))
            done.append(("scalar", ins.n))  # loop control: the scalar unit's declared work
            continue
        if isinstance(ins, SyncAll):
            if at_sync is not None:
                at_sync()
            tr.record(0, Event(STALL, "S"))
            done.append(("scalar", fc.core_sync))  # the clock's own figure for the cross-core wait
            continue
        mem.log = log = []
        work = ins.execute(mem)
        mem.log = None
        tr.record(0, Event(EV_WORK, ins.pipe, tuple(b.id for b, mode in log if mode == "r" and b.level != "GM"),
                           tuple(b.id for b, mode in log if mode == "w" and b.level != "GM")))
        if isinstance(ins, (DataMove, Load3D)):
            sb = next(b for b, mode in log if mode == "r")
            db = next(b for b, mode in log if mode == "w")
            src, dst = sb.level, db.level
            key = f"{src}->{dst}"
            by_path[key] = by_path.get(key, 0) + work
            if src == "GM":
                gm_r += work
            elif dst == "GM":
                gm_w += work
            done.append(("move", src, dst, work, _bursts(ins, sb, db)))
        elif isinstance(ins, Mmad):
            fractals += work
            done.append(("cube", work))
        elif isinstance(ins, Vec):
            vec_el += work
            done.append(("vector", ins.op, work // ins.mask if ins.mask else 0))
        elif isinstance(ins, VecTrans):
            vec_el += work
            done.append(("transpose", work * next(b for b, mode in log if mode == "r").itemsize))
        else:  # pragma: no cover - every instruction class is one of the above
            raise TypeError(f"the functional clock has no cost for {type(ins).__name__}")
    n = max(prog.active_cores, 1)
    unique = sum(mem.gm[name].nbytes for name in prog.info.get("gm_inputs", ()) if name in mem.gm)
    hbm_frac = fc.hbm_fraction(gm_r, unique, n)
    readers = writers = float(n)
    acc = None
    for _ in range(CONTENTION_ROUNDS):
        read_bpc, write_bpc = fc.gm_rates(hbm_frac, readers, writers)
        costs = [_fcost(fc, d, read_bpc, write_bpc) for d in done]
        acc = tr.account(costs=[costs], issue_cycles=fc.issue, issue_unit="S", start=fc.launch, sync_cycles=fc.sync)
        duty_r = acc.busy.get("MTE2", 0) / acc.cycles if acc.cycles else 1.0
        duty_w = acc.busy.get("MTE3", 0) / acc.cycles if acc.cycles else 1.0
        readers, writers = max(1.0, 0.5 * readers + 0.5 * n * duty_r), max(1.0, 0.5 * writers + 0.5 * n * duty_w)
    busy = {p: int(acc.busy.get(p, 0)) for p in PIPES}
    detail = {"bytes_by_path": by_path, "gm_read_bytes": gm_r, "gm_write_bytes": gm_w, "cube_fractals": fractals,
              "vec_elements": vec_el, "hbm_read_fraction": hbm_frac}
    return Timing(cycles=acc.cycles, busy=busy, bytes_by_level=by_path, syncs=acc.syncs,
                  instructions=len(prog.instrs), detail=detail)


def _bursts(ins, src, dst) -> int:
    """Contiguous runs of the regions an executed transfer read and wrote (`fclock.runs`);
    a fractal conversion writes one K0 row (nd2zz, nd2fz) or one 16-element row (nz2nd) at a
    time; Load3D moves whole fractals (one run)."""
    if not isinstance(ins, DataMove):
        return 1
    elems, r_src = fclock.runs(src.shape, ins.src_idx)
    _, r_dst = fclock.runs(dst.shape, ins.dst_idx)
    if ins.transform in ("nd2zz", "nd2fz"):
        r_src = max(r_src, elems // dst.shape[3])
    elif ins.transform == "nz2nd":
        r_src = max(r_src, elems // 16)
    return max(r_src, r_dst)


def _fcost(fc: AscendClock, d: tuple, read_bpc: float, write_bpc: float) -> int:
    kind = d[0]
    if kind == "move":
        return fc.move(d[1], d[2], d[3], d[4], read_bpc, write_bpc)
    if kind == "cube":
        return fc.cube(d[1])
    if kind == "vector":
        return fc.vector(d[1], d[2])
    if kind == "transpose":
        return fc.transpose(d[1])
    if kind == "scalar":
        return d[1]
    return 0


def run(plan: Plan, program: Program, inputs) -> tuple:
    """Functional mode for a whole kernel: the host packs the inputs into GM, every active
    core's program executes on its own on-chip memories (core 0's is `program`), the host
    unpacks the output. The cores run in lockstep between SyncAll barriers: at each of core 0's,
    every other core runs up to its own, so what any core wrote to GM before a barrier is there
    for every core after it. Returns (output, core 0's Timing by the functional accounting)."""
    import numpy as np

    m = program.machine
    gm = plan.pack([np.asarray(x) for x in inputs])
    gm[plan.out_name] = np.zeros(plan.out_shape, plan.out_dtype)
    caps = {lvl: lv.capacity for lvl, lv in m.levels.items()}
    others = [(iter(plan.make_program(core).instrs), Memory(caps, gm)) for core in range(1, plan.active_cores)]

    def catch_up() -> None:
        """Every other core runs up to and through its next SyncAll (or to its end): lockstep."""
        for it, mem in others:
            for ins in it:
                if isinstance(ins, SyncAll):
                    break
                if not isinstance(ins, (Barrier, Scalar)):
                    ins.execute(mem)

    t = replay(program, Memory(caps, gm), at_sync=catch_up)
    catch_up()  # the rest of every other core's program (after its last SyncAll, or all of it)
    for it, mem in others:
        if next(it, None) is not None:
            raise RuntimeError("a core's program has more SyncAll than core 0's (every core must meet each one)")
    return plan.unpack(gm[plan.out_name]), t


# -- the report ------------------------------------------------------------------------------

PIPE_RATIO = {"M": "mac_ratio", "V": "vec_ratio", "S": "scalar_ratio", "MTE1": "mte1_ratio",
              "MTE2": "mte2_ratio", "MTE3": "mte3_ratio"}
PIPE_RESOURCE = {"M": "cube (M pipe)", "V": "vector unit (V pipe)", "S": "scalar unit (S pipe)",
                 "MTE1": "L1 -> L0 loads (MTE1)", "MTE2": "GM reads (MTE2)", "MTE3": "GM writes (MTE3)"}


def profile(m, plan, t: Timing, dtype: str) -> Profile:
    """The typed report of one kernel: core 0's replay scaled to the active cores (core 0 holds
    the largest share), the peak of the unit the plan names (cube or vector), the HBM traffic
    after L2 hits as the roofline's off-chip bytes; busy ratios per pipe over core 0's cycles
    and the bound by the simulator core's one rule (`opcompiler.sim.profile.bound_of`)."""
    import numpy as np

    if plan.unit == "cube":
        peak_per_cycle = m.peak_flops_per_cycle.get(dtype, 0.0)
    else:
        peak_per_cycle = float(m.lanes(np.dtype(dtype).itemsize))
    n = plan.active_cores
    hbm_bytes = (t.gm_read_bytes * t.hbm_read_fraction + t.gm_write_bytes) * n
    ratios = {PIPE_RATIO[p]: t.busy[p] / t.cycles if t.cycles else 0.0 for p in PIPE_RATIO}
    bound = bound_of(ratios, labels={PIPE_RATIO[p]: PIPE_RESOURCE[p] for p in PIPE_RATIO})
    by_level = {"GM_read": t.gm_read_bytes * n, "GM_write": t.gm_write_bytes * n,
                m.offchip_name: int(hbm_bytes), "L2_hit": int(t.gm_read_bytes * (1 - t.hbm_read_fraction) * n)}
    for key, v in t.bytes_by_path.items():
        if key.split("->")[1] != "GM":
            by_level[key] = v * n
    return Profile(cycles=t.cycles, clock_hz=m.clock_hz, flops=plan.flops,
                   peak_flops=peak_per_cycle * m.clock_ghz * 1e9 * m.cores, busy=dict(t.busy), busy_ratio=ratios,
                   bytes_by_level=by_level, offchip_bytes=hbm_bytes, offchip_gbps=m.offchip_gbps, bound=bound)


def report_keys(plan, t: Timing, p: Profile) -> dict:
    """The DaVinci core's own report keys, beside the profile's (`opcompiler.sim.profile.report`)."""
    n = plan.active_cores
    ratios = {k: round(v, 4) for k, v in p.busy_ratio.items()}
    return {
        "gm_bytes": (t.gm_read_bytes + t.gm_write_bytes) * n,
        "memory_bound_ratio": round(ratios["mte2_ratio"] / max(ratios["mac_ratio"], ratios["vec_ratio"], 1e-9), 4),
        "active_cores": n, "sync_events_core0": t.syncs, "instructions_core0": t.instructions,
        "l2_hit_ratio": round(1 - t.hbm_read_fraction, 4),
        "bytes_note": "bytes are core 0's traffic x active cores (core 0 holds the largest share)",
    }
