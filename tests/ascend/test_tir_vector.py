"""Flat element-wise chains through TVM (issue 12, items 1-2, Ascend vector side).

`schedules/ascend/elemwise.py` (`flat_schedule`) schedules the op's own TE compute (UB tiles, cache_read /
cache_write, stages computed at the tile loop, emit_insn pragmas); the backend's
`lower.vector` lowering turns the scheduled module into the AI Core program. These tests check
that the result equals numpy, that it is the same kernel, cycle for cycle, as the TIK-style
emission it replaced (kept here, below, as the oracle), and that the simulator really runs
what the lowering emitted (a corrupted offset or instruction gives a wrong answer).
"""
from __future__ import annotations

import copy
import random
import zlib
from dataclasses import replace

import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend.ascend import execute, timing
from opcompiler.backend.ascend.lower import vector
from opcompiler.backend.ascend import KernelBuilder, Plan, split_even
from opcompiler.backend.ascend.program import Buf, DataMove, Vec, VOp
from opcompiler.errors import OpcError, OpcFailure
from opcompiler.ops import get_op, workload
from opcompiler.backend.ascend.lower.cube import channel_op
from opcompiler.schedules.ascend.common import machine
from opcompiler.schedules.ascend.elemwise import UB_TILES, _steps
from opcompiler.schedules.ascend.elemwise import flat_schedule
from opcompiler.verify import compare


def emit_steps(kb: KernelBuilder, steps, x: Buf, fulls: list[Buf], params: list[Buf], cnt_elems: int,
               rows: int, cb: int) -> None:
    """The vector instructions of a step chain on one UB tile (`rows` of 16 channels at channel
    offset `cb` for per-channel steps), TIK style: the retired emitter's step chain, kept here as
    this file's oracle (no template emits through it)."""
    fi = pi = 0
    vx = VOp(x)
    for name, args in steps:
        if name == "relu":
            kb.vec("relu", vx, (vx,), cnt_elems)
        elif name == "sigmoid":  # 1 / (1 + exp(-x)), as the DSL writes it
            kb.vec("muls", vx, (vx,), cnt_elems, scalar=-1.0)
            kb.vec("exp", vx, (vx,), cnt_elems)
            kb.vec("adds", vx, (vx,), cnt_elems, scalar=1.0)
            kb.vec("rec", vx, (vx,), cnt_elems)
        elif name == "clip":
            kb.vec("mins", vx, (vx,), cnt_elems, scalar=args[1])
            kb.vec("maxs", vx, (vx,), cnt_elems, scalar=args[0])
        elif name == "pow":  # x ** P = exp(P * ln x), x > 0 (LRN's denominator)
            kb.vec("ln", vx, (vx,), cnt_elems)
            kb.vec("muls", vx, (vx,), cnt_elems, scalar=args[0])
            kb.vec("exp", vx, (vx,), cnt_elems)
        elif name == "affine":  # x * A + B (HardSigmoid's first half)
            kb.vec("muls", vx, (vx,), cnt_elems, scalar=args[0])
            kb.vec("adds", vx, (vx,), cnt_elems, scalar=args[1])
        elif name in ("add", "mul"):
            kb.vec(name, vx, (vx, VOp(fulls[fi])), cnt_elems)
            fi += 1
        elif name in ("bias", "scale"):
            channel_op(kb, "add" if name == "bias" else "mul", x, 0, rows, params[pi], cb)
            pi += 1
        elif name == "bn":
            channel_op(kb, "mul", x, 0, rows, params[pi], cb)
            channel_op(kb, "add", x, 0, rows, params[pi + 1], cb)
            pi += 2

FLAT = [("relu", "n=1,c=13,h=7,w=9"), ("add", "n=2,c=16,h=5,w=5"), ("add_relu", "n=1,c=3,h=30,w=30"),
        ("ew_chain", "n=1,c=13,h=7,w=9,chain=sigmoid"), ("ew_chain", "n=1,c=13,h=7,w=9,chain=mul;clip:0:6"),
        ("ew_chain", "n=1,c=13,h=7,w=9,chain=affine:0.2:0.5;clip:0:1"),
        ("ew_chain", "n=1,c=20,h=30,w=30,chain=sigmoid;pow:0.75;add;relu,layout=NHWC"),
        ("ew_chain", "n=2,c=40,h=33,w=31,chain=affine:0.5:-1;sigmoid;mul;clip:-1:0.5")]


def _inputs(wl):
    ins = get_op(wl.op).make_inputs(wl)
    if "pow" in str(wl.p.get("chain", "")):
        ins[0] = (np.abs(ins[0]) + 0.5).astype(wl.dtype)  # pow is exp(P ln x): x > 0
    return ins


def tik_flat_plan(wl, target, cfg) -> Plan:
    """The TIK-style emission the TIR route replaced (the oracle): per UB tile of the flat
    tensor, DMA every operand in, the chain's vector steps in place, DMA out."""
    m = machine(target)
    dt, steps = wl.dtype, _steps(wl)
    n_full = sum(1 for nm, _ in steps if nm in ("add", "mul"))
    total = int(np.prod([wl["n"], wl["c"], wl["h"], wl["w"]]))
    tile, slots = cfg["ub_tile"], 2 if cfg["double_buffer"] else 1
    units = [(s, min(tile, total - s)) for s in range(0, total, tile)]
    active = min(cfg["block_dim"], len(units))

    def program(core):
        kb = KernelBuilder(m, core, active)
        xs = [kb.gm(f"x{i}", (total,), dt) for i in range(1 + n_full)]
        y = kb.gm("y", (total,), dt)
        bufs = [[kb.alloc("UB", f"x{i}_{s}", (tile,), dt) for i in range(1 + n_full)] for s in range(slots)]
        lo, hi = split_even(len(units), active, core)
        for j, (start, cnt) in enumerate(units[lo:hi]):
            ub = bufs[j % slots]
            for i in range(1 + n_full):
                kb.data_move(ub[i], (slice(0, cnt),), xs[i], (slice(start, start + cnt),))
            emit_steps(kb, steps, ub[0], ub[1:], [], cnt, 0, 0)
            kb.data_move(y, (slice(start, start + cnt),), ub[0], (slice(0, cnt),))
            kb.loop()
        return kb.finish(gm_inputs=tuple(f"x{i}" for i in range(1 + n_full)))

    shape = get_op(wl.op).output_spec(wl)[0]
    return Plan(active_cores=active, make_program=program,
                pack=lambda ins: {f"x{i}": np.ascontiguousarray(a).reshape(-1) for i, a in enumerate(ins)},
                out_name="y", out_shape=(total,), out_dtype=dt, unpack=lambda v: v.reshape(shape), flops=0,
                unit="vector")


def _run_plan(plan, ins):
    prog = plan.make_program(0)
    out, t = execute.run(plan, prog, ins)
    return out, t.cycles, timing.schedule(prog).cycles


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op,shape", FLAT)
def test_tir_route_matches_numpy(backend, op, shape, dtype):
    """Default config through the public path: the template now takes the TIR route."""
    rep = run_op(op, "ascend-sim", shape=shape, dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]
    wl = workload(op, shape, dtype=dtype)
    kern = backend.build(wl)
    assert kern.info["lowering"].startswith("TVM s_tir")


def _configs(k: int, seed: int):
    rng = random.Random(seed)
    return [{"ub_tile": rng.choice(UB_TILES), "double_buffer": rng.choice((0, 1)),
             "block_dim": rng.choice((1, 2, 4, 8, 16, 32))} for _ in range(k)]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op,shape", FLAT + [("relu", "n=3,c=64,h=21,w=23")])
def test_tir_parity_with_tik_emission(backend, op, shape, dtype):
    """20 random configs across the space: the TIR route gives the same output bits as the
    TIK-style emission, equal to numpy, and the same cycles (functional and timing mode)."""
    wl = workload(op, shape, dtype=dtype)
    ins = _inputs(wl)
    ref = get_op(op).reference(wl, ins)
    ran = 0
    for cfg in _configs(20, zlib.crc32(f"{op}{dtype}".encode())):
        try:
            kern = backend.build(wl, cfg)
        except OpcError:  # over UB capacity for this tile: the template's check rejects it
            with pytest.raises(OpcError):
                tik_flat_plan(wl, backend.target, cfg).make_program(0)
            continue
        run = backend.run(kern, ins)
        timing = backend.measure(kern)
        tik_out, tik_fun, tik_time = _run_plan(tik_flat_plan(wl, backend.target, cfg), ins)
        assert np.array_equal(run.outputs[0], tik_out), cfg
        assert compare(run.outputs[0], ref)[0], cfg
        assert run.cycles == timing.cycles == tik_fun == tik_time, (cfg, run.cycles, tik_time)
        ran += 1
    assert ran >= 15


def test_tir_trace_is_the_schedules_nests(backend):
    """sigmoid;add in 1024-element tiles: per tile 2 DMAs in, muls exp adds rec add, 1 DMA out;
    every stage reuses the input's UB buffer (in place), so UB holds 2 tiles x 2 slots."""
    wl = workload("ew_chain", "n=1,c=4,h=16,w=40,chain=sigmoid;add", dtype="float16")
    kern = backend.build(wl, {"ub_tile": 1024, "double_buffer": 1, "block_dim": 2})
    prog = kern.artifact.program
    ops = [i.op if isinstance(i, Vec) else type(i).__name__ for i in prog.instrs]
    tile = ["DataMove", "DataMove", "muls", "exp", "adds", "rec", "add", "DataMove", "Scalar"]
    assert ops == tile * 2  # 2560 elements = 3 tiles; core 0 of 2 holds 2
    assert prog.high_water["UB"] == 4 * 1024 * 2
    assert {i.nbytes for i in prog.instrs if isinstance(i, DataMove)} == {2048}


def test_decomposes_one_stage_holding_the_whole_chain(backend):
    """All stages inlined into one nest: the lowering splits the expression tree into vector
    instructions on UB temporaries, in place: the same program and cycles as the staged one."""
    wl = workload("ew_chain", "n=2,c=40,h=33,w=31,chain=affine:0.5:-1;sigmoid;mul;clip:-1:0.5", dtype="float16")
    cfg = {"ub_tile": 4096, "double_buffer": 1, "block_dim": 4}
    m = machine(backend.target)
    staged = vector.lower(flat_schedule(wl, cfg))
    fused = vector.lower(flat_schedule(wl, cfg, inline=True))
    assert len(fused.nests) == 4 and len(staged.nests) == 12
    assert [o.op for o in fused.ops] == [o.op for o in staged.ops]
    assert len(fused.phys) == len(staged.phys) == 2
    ins = _inputs(wl)
    outs = []
    for vk in (staged, fused):
        plan = Plan(active_cores=vk.active_cores, make_program=lambda c, vk=vk: vk.program(m, c),
                    pack=lambda a, vk=vk: {nm: x.reshape(-1) for nm, x in zip(vk.inputs, a)}, out_name=vk.output,
                    out_shape=vk.gm[vk.output][0], out_dtype=wl.dtype, unpack=lambda v: v, flops=0, unit="vector")
        outs.append(_run_plan(plan, ins))
    assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1:] == outs[1][1:]
    assert compare(outs[1][0].reshape(get_op(wl.op).output_spec(wl)[0]), get_op(wl.op).reference(wl, ins))[0]


def _copy(ins, **changes):
    out = copy.copy(ins)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


def _mutated_run(backend, wl, cfg, mutate):
    kern = backend.build(wl, cfg)
    plan = kern.artifact.plan
    make = plan.make_program

    def program(core):
        prog = make(core)
        prog.instrs = [mutate(i) for i in prog.instrs]
        return prog

    plan = replace(plan, make_program=program)
    out, _ = execute.run(plan, program(0), _inputs(wl))
    return out


def test_mutations_give_wrong_outputs(backend):
    """The simulator executes the lowered program: shifting one DMA's GM offset, or turning
    the vrelu into vabs, changes the result (the unmutated program is right)."""
    wl = workload("add_relu", "n=1,c=8,h=20,w=20", dtype="float16")
    cfg = {"ub_tile": 1024, "double_buffer": 1, "block_dim": 2}
    ins = _inputs(wl)
    ref = get_op(wl.op).reference(wl, ins)
    assert compare(_mutated_run(backend, wl, cfg, lambda i: i), ref)[0]
    seen = []

    def shift(i):
        if isinstance(i, DataMove) and i.src.level == "GM" and not seen:
            seen.append(i)
            s = i.src_idx[0]
            return _copy(i, src_idx=(slice(s.start + 16, s.stop + 16),))
        return i

    assert not compare(_mutated_run(backend, wl, cfg, shift), ref)[0]

    def wrong_op(i):
        return _copy(i, op="abs") if isinstance(i, Vec) and i.op == "relu" else i

    assert not compare(_mutated_run(backend, wl, cfg, wrong_op), ref)[0]


def test_unmappable_nest_is_a_one_line_error():
    """A nest the lowering has no instruction for is refused, naming the nest."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule

    x = te.placeholder((300,), "float16", name="x")
    y = te.compute((300,), lambda i: tirx.sin(x[i]), name="vsin")
    sch = Schedule(te.create_prim_func([x, y]))
    blk = sch.get_sblock("vsin")
    out = sch.cache_write(blk, 0, "local.UB")
    rd = sch.cache_read(blk, 0, "local.UB")
    t, i = sch.split(sch.get_loops(out)[0], [None, 128])
    sch.annotate(t, vector.CORES, 1)
    sch.annotate(i, vector.PRAGMA, "dma_copy")
    sch.compute_at(blk, t)
    sch.annotate(sch.get_loops(blk)[-1], vector.PRAGMA, "vector_auto")
    sch.compute_at(rd, t, index=0)
    sch.annotate(sch.get_loops(rd)[-1], vector.PRAGMA, "dma_copy")
    with pytest.raises(OpcFailure, match=r"nest 1 \(128 over vsin_local.UB, vector_auto\).*tirx.sin") as e:
        vector.lower(sch.mod)
    assert "\n" not in str(e.value)
    sch.unannotate(sch.get_loops(blk)[-1], vector.PRAGMA)
    with pytest.raises(OpcFailure, match="has no pragma_emit_insn"):
        vector.lower(sch.mod)


def test_lowering_is_cached_per_schedule():
    wl = workload("relu", "n=1,c=13,h=7,w=9", dtype="float16")
    cfg = {"ub_tile": 1024, "double_buffer": 1, "block_dim": 4}
    assert vector.lower(flat_schedule(wl, cfg)) is vector.lower(flat_schedule(wl, cfg))
    assert vector.lower(flat_schedule(wl, {**cfg, "block_dim": 8})).cores == 8


def bench(shape: str = "n=1,c=256,h=56,w=56", dtype: str = "float16") -> None:
    """Seconds per candidate (build + measure in timing mode) on both routes, every config of
    the space once (as a tuner visits them), then the same configs again (cached lowering).
    Run: python tests/ascend/test_tir_vector.py"""
    import itertools
    import time

    from opcompiler.backend import get_backend
    from opcompiler.schedules.ascend.elemwise import AscendElemwise
    from opcompiler.target import load_target

    be = get_backend(load_target("ascend-sim"))
    tmpl = AscendElemwise()
    for op, extra in (("relu", ""), ("ew_chain", ",chain=affine:0.2:0.5;sigmoid;mul;clip:0:1")):
        wl = workload(op, shape + extra, dtype=dtype)
        knobs = tmpl.space(wl, be.target)
        cfgs = [dict(zip([k.name for k in knobs], v)) for v in itertools.product(*[k.values for k in knobs])]
        tir_apply = AscendElemwise.apply
        for route in ("tik", "tir", "tir (again, cached)"):
            AscendElemwise.apply = tir_apply if route.startswith("tir") else \
                (lambda self, w, t, c: tik_flat_plan(w, t, c))
            times, cycles, n_bad = [], {}, 0
            for cfg in cfgs:
                t0 = time.perf_counter()
                try:
                    cycles[str(cfg)] = be.measure(be.build(wl, cfg)).cycles
                except OpcError:
                    n_bad += 1
                times.append(time.perf_counter() - t0)
            AscendElemwise.apply = tir_apply
            print(f"{op:9s} {route:20s} {len(cfgs)} configs ({n_bad} invalid): first {times[0] * 1e3:7.1f} ms, "
                  f"mean {np.mean(times) * 1e3:6.1f} ms, median {np.median(times) * 1e3:6.1f} ms per candidate; "
                  f"best {min(cycles.values())} cycles")
            if route == "tik":
                tik_cycles = cycles
            else:
                assert cycles == tik_cycles, "cycle parity"


if __name__ == "__main__":
    bench()
