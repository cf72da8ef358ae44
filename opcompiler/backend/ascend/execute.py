"""The functional run: every active core's program executed on simulated memories, timed by
the functional clock (`fclock`), a second accounting that shares nothing with the timing model
(`timing.py`).

`run` executes a whole kernel (the host packs the inputs into GM, the cores run in lockstep
between SyncAll barriers, the host unpacks the output); `replay` executes core 0's program and
times it from what the execution read, wrote and did.
"""
from __future__ import annotations

import numpy as np

from ...sim.profile import Timing
from ...sim.trace import BARRIER, STALL, WORK as EV_WORK, Event, Trace
from . import fclock
from .fclock import AscendClock
from .machine import PIPES
from .program import Barrier, DataMove, Load3D, Memory, Mmad, Plan, Program, Scalar, SyncAll, Vec, VecTrans

__all__ = ["run", "replay"]


def run(plan: Plan, program: Program, inputs) -> tuple:
    """Functional mode for a whole kernel: the host packs the inputs into GM, every active
    core's program executes on its own on-chip memories (core 0's is `program`), the host
    unpacks the output. The cores run in lockstep between SyncAll barriers: at each of core 0's,
    every other core runs up to its own, so what any core wrote to GM before a barrier is there
    for every core after it. Returns (output, core 0's Timing by the functional accounting)."""
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
    for _ in range(fclock.ROUNDS):
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
