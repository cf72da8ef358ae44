"""Per-channel element-wise chains through TVM (issue 12, Ascend vector side, continued).

`schedules/ascend/elemwise.py` (`channel_schedule`) schedules the chain (bias_add, batch_norm, bn_relu, add_relu
with bcast=1, ew_chain with bias / scale / bn steps) on the NC1HWC0 view: UB tiles of pixels of
one channel block, the per-channel parameters resident in UB (a prologue before the tile loop),
emit_insn pragmas; the backend's `emit_insn` lowering (shaped nests; a broadcast parameter row
becomes a per-channel instruction: block stride 0 for fp16, two half-row instructions for fp32)
turns the module into the AI Core program. These tests check the result against numpy, against
the TIK-style emission it replaced (kept here as the oracle), bit for bit and cycle for cycle,
and that the simulator runs what the lowering emitted (mutations break the output).
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
from opcompiler.backend.ascend import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.program import DataMove, Vec, VOp
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.backend.ascend.lower.cube import channel_op
from opcompiler.schedules.ascend.common import from_5hd, machine, per_channel, to_5hd
from opcompiler.ops.steps import STEPS
from opcompiler.schedules.ascend.elemwise import AscendElemwise, _steps
from opcompiler.verify import compare

C0 = 16


# -- the TIK-style per-channel kernel the TIR route replaced (the oracle) -----------------------

def _tik_steps(kb, steps, x, fulls, params, cnt_elems: int, rows: int, cb: int) -> None:
    fi = pi = 0
    vx = VOp(x)
    for name, args in steps:
        if name == "relu":
            kb.vec("relu", vx, (vx,), cnt_elems)
        elif name == "sigmoid":
            kb.vec("muls", vx, (vx,), cnt_elems, scalar=-1.0)
            kb.vec("exp", vx, (vx,), cnt_elems)
            kb.vec("adds", vx, (vx,), cnt_elems, scalar=1.0)
            kb.vec("rec", vx, (vx,), cnt_elems)
        elif name == "clip":
            kb.vec("mins", vx, (vx,), cnt_elems, scalar=args[1])
            kb.vec("maxs", vx, (vx,), cnt_elems, scalar=args[0])
        elif name == "pow":
            kb.vec("ln", vx, (vx,), cnt_elems)
            kb.vec("muls", vx, (vx,), cnt_elems, scalar=args[0])
            kb.vec("exp", vx, (vx,), cnt_elems)
        elif name == "affine":
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


def tik_channel_plan(wl, target, cfg) -> Plan:
    """Per (plane, tile of ub_tile / 16 pixels): DMA x (and same-shape operands) in, the chain's
    steps in place (per-channel steps on the parameter block of the plane's channels, loaded
    into UB once per core), DMA out."""
    m = machine(target)
    steps = _steps(wl)
    dt = wl.dtype
    n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
    slots = 2 if cfg["double_buffer"] else 1
    tile = cfg["ub_tile"]
    n_full = sum(STEPS[nm].operands.count("full") for nm, _ in steps)
    n_chan = sum(STEPS[nm].operands.count("chan") for nm, _ in steps)
    c1, hw = ceil_div(c, C0), h * w
    rows_per_tile = max(1, tile // C0)
    units = [(p, r, min(rows_per_tile, hw - r)) for p in range(n * c1) for r in range(0, hw, rows_per_tile)]
    gm_shape = (n * c1, hw, C0)
    active = min(cfg["block_dim"], len(units))

    def program(core: int):
        kb = KernelBuilder(m, core, active)
        xs = [kb.gm(f"x{i}", gm_shape, dt) for i in range(1 + n_full)]
        y = kb.gm("y", gm_shape, dt)
        params = []
        for i in range(n_chan):
            g = kb.gm(f"p{i}", (c1, C0), dt)
            b = kb.alloc("UB", f"param{i}", (c1, C0), dt)
            kb.data_move(b, (slice(None),), g, (slice(None),))
            params.append(b)
        bufs = [[kb.alloc("UB", f"x{i}_{s}", (tile,), dt) for i in range(1 + n_full)] for s in range(slots)]
        lo, hi = split_even(len(units), active, core)
        for j, (plane, start, cnt) in enumerate(units[lo:hi]):
            ub = bufs[j % slots]
            for i in range(1 + n_full):
                kb.data_move(ub[i], (slice(0, cnt * C0),), xs[i], (plane, slice(start, start + cnt)))
            _tik_steps(kb, steps, ub[0], ub[1:], params, cnt * C0, cnt, (plane % c1) * C0)
            kb.data_move(y, (plane, slice(start, start + cnt)), ub[0], (slice(0, cnt * C0),))
            kb.loop()
        return kb.finish(gm_inputs=tuple(f"x{i}" for i in range(1 + n_full)) + tuple(f"p{i}" for i in range(n_chan)))

    layout = wl.layout

    def pack(inputs):
        fulls, chans, rest = [], [], iter(inputs[1:])
        for name, _ in steps:
            for what in STEPS[name].operands:
                (fulls if what == "full" else chans).append(next(rest))
        gm = {f"x{i}": to_5hd(a, layout, C0).reshape(gm_shape) for i, a in enumerate([inputs[0], *fulls])}
        for i, a in enumerate(chans):
            gm[f"p{i}"] = per_channel(a.reshape(-1), c1, C0)
        return gm

    return Plan(active_cores=active, make_program=program, pack=pack, out_name="y", out_shape=gm_shape,
                out_dtype=dt, unpack=lambda yv: from_5hd(yv.reshape(n, c1, hw, C0), c, h, w, layout),
                flops=0, unit="vector")


def _run_plan(plan, ins):
    prog = plan.make_program(0)
    out, t = execute.run(plan, prog, ins)
    return out, t.cycles, timing.schedule(prog).cycles


def _inputs(wl):
    ins = get_op(wl.op).make_inputs(wl)
    if "pow" in str(wl.p.get("chain", "")):  # pow is exp(P ln x): x > 0 (every operand positive)
        ins = [(np.abs(a) + 0.5).astype(wl.dtype) for a in ins]
    return ins


CHANNEL = [("bias_add", "n=1,c=20,h=5,w=7"), ("batch_norm", "n=2,c=33,h=9,w=9,layout=NHWC"),
           ("bn_relu", "n=1,c=16,h=3,w=3"), ("bn_relu", "n=1,c=48,h=40,w=60"),
           ("add_relu", "n=1,c=20,h=5,w=7,bcast=1,layout=NHWC"), ("add_relu", "n=2,c=7,h=50,w=45,bcast=1"),
           ("ew_chain", "n=1,c=20,h=5,w=7,chain=add;bias;sigmoid;bn;clip:0:6"),
           ("ew_chain", "n=1,c=24,h=12,w=13,chain=scale;mul;affine:0.5:1;pow:0.75,layout=NHWC"),
           ("ew_chain", "n=2,c=17,h=1,w=1,chain=bias;relu;scale"),  # one pixel: single-row nests
           ("ew_chain", "n=2,c=20,h=5,w=5,chain=bn;relu;add"),  # a stage named as the output (vadd)
           ("ew_chain", "n=1,c=20,h=9,w=11,chain=add;bias;mul;scale;add,layout=NHWC")]


def _configs(wl, target, k: int, seed: int):
    """`k` random configs of the space that fit (the template's check), without repeats."""
    import itertools

    tmpl = AscendElemwise()
    knobs = tmpl.space(wl, target)
    every = [dict(zip([kn.name for kn in knobs], v)) for v in itertools.product(*[kn.values for kn in knobs])]
    random.Random(seed).shuffle(every)
    return [cfg for cfg in every if tmpl.check(wl, target, cfg) is None][:k]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op,shape", CHANNEL[:3] + CHANNEL[4:5])
def test_channel_tir_route_matches_numpy(backend, op, shape, dtype):
    rep = run_op(op, "ascend-sim", shape=shape, dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]
    kern = backend.build(workload(op, shape, dtype=dtype))
    assert kern.info["lowering"].startswith("TVM s_tir")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op,shape", CHANNEL)
def test_channel_parity_with_tik_emission(backend, op, shape, dtype):
    """20 random valid configs: the TIR route's output bits equal the TIK kernel's and numpy's,
    the same cycles in functional and timing mode, and the TIK kernel's cycles."""
    wl = workload(op, shape, dtype=dtype)
    ins = _inputs(wl)
    ref = get_op(op).reference(wl, ins)
    ran = 0
    for cfg in _configs(wl, backend.target, 20, zlib.crc32(f"{op}{shape}{dtype}".encode())):
        kern = backend.build(wl, cfg)
        run = backend.run(kern, ins)
        timing = backend.measure(kern)
        tik_out, tik_fun, tik_time = _run_plan(tik_channel_plan(wl, backend.target, cfg), ins)
        assert run.outputs[0].tobytes() == tik_out.tobytes(), cfg  # bit for bit
        assert compare(run.outputs[0], ref)[0], cfg
        assert run.cycles == timing.cycles, cfg
        assert tik_fun == tik_time
        assert run.cycles == tik_fun, (cfg, run.cycles, tik_fun)
        ran += 1
    assert ran >= 15


def _mutated(kern, ins, mutate):
    plan = kern.artifact.plan
    make = plan.make_program

    def program(core):
        prog = make(core)
        prog.instrs = [mutate(i) for i in prog.instrs]
        return prog

    out, _ = execute.run(replace(plan, make_program=program), program(0), ins)
    return out


def _breaks(kern, ins, mutate, ref) -> bool:
    """The mutated program gives a wrong output (or reads outside its buffers)."""
    try:
        return not compare(_mutated(kern, ins, mutate), ref)[0]
    except IndexError:
        return True


def _copy(ins, **changes):
    out = copy.copy(ins)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_channel_mutations_give_wrong_outputs(backend, dtype):
    """The simulator runs the lowered program: the parameter read with block stride 1 (the
    broadcast dropped), its offset moved to the next channel block, the op swapped, or the
    parameter DMA shifted changes the output."""
    wl = workload("batch_norm", "n=1,c=40,h=5,w=7", dtype=dtype)
    ins = get_op("batch_norm").make_inputs(wl)
    ref = get_op("batch_norm").reference(wl, ins)
    kern = backend.build(wl, {"ub_tile": 1024, "double_buffer": 1, "block_dim": 2})
    assert compare(_mutated(kern, ins, lambda i: i), ref)[0]
    prog = kern.artifact.plan.make_program(0)
    chan = [i for i in prog.instrs if isinstance(i, Vec) and i.op in ("add", "mul")]
    assert chan and all(i.srcs[1].blk_stride == 0 and i.srcs[1].rep_stride == 0 for i in chan)
    want = (1, 8) if dtype == "float16" else (2, 16)
    assert all((i.dst.blk_stride, i.dst.rep_stride) == want for i in chan)
    assert len(chan) == (2 if dtype == "float16" else 4) * 2  # two planes on core 0, mul + add, halves

    def unbroadcast(i):
        if isinstance(i, Vec) and i.op in ("add", "mul"):
            s = i.srcs[1]
            return _copy(i, srcs=(i.srcs[0], VOp(s.buf, s.offset, 1, 8)))
        return i

    def next_block(i):
        if isinstance(i, Vec) and i.op == "add":
            s = i.srcs[1]
            return _copy(i, srcs=(i.srcs[0], VOp(s.buf, (s.offset + 16) % 48, 0, 0)))
        return i

    assert _breaks(kern, ins, unbroadcast, ref)
    assert _breaks(kern, ins, next_block, ref)
    assert _breaks(kern, ins, lambda i: _copy(i, op="sub") if isinstance(i, Vec) and i.op == "add" else i, ref)

    def shift_param(i):
        if isinstance(i, DataMove) and i.src.level == "GM" and i.src.name == "p0":
            return _copy(i, src_idx=(slice(1, 3), slice(None)), dst_idx=(slice(0, 2), slice(None)))
        return i

    assert _breaks(kern, ins, shift_param, ref)


def test_channel_trace_is_the_schedules_nests(backend):
    """bn_relu 20 channels (2 blocks), 5x7 pixels, fp16, one core: the two parameter loads once
    (prologue), then per plane: one DMA in, vmul and vadd with the parameter block at block
    stride 0 (35 pixels: 5 repeats of 8 rows), vrelu over 560 elements (4 repeats + a masked
    one), one DMA out; UB: the parameters and one 40-row tile per ping-pong slot."""
    wl = workload("bn_relu", "n=1,c=20,h=5,w=7", dtype="float16")
    kern = backend.build(wl, {"ub_tile": 1024, "double_buffer": 1, "block_dim": 1})
    prog = kern.artifact.program
    ops = [i.op if isinstance(i, Vec) else type(i).__name__ for i in prog.instrs]
    assert ops == ["DataMove"] * 2 + (["DataMove", "mul", "add", "relu", "relu", "DataMove", "Scalar"]) * 2
    mul = prog.instrs[3]
    assert mul.repeat == 5 and mul.mask == 128 and mul.srcs[1].offset == 0
    assert prog.instrs[10].srcs[1].offset == 16  # the second plane reads the second channel block
    assert prog.high_water["UB"] == 2 * 2 * 16 * 2 + 2 * 40 * 16 * 2


def bench(op: str = "bn_relu", shape: str = "n=1,c=64,h=56,w=56", dtype: str = "float16") -> None:
    """Seconds per candidate (build + measure in timing mode) on both routes, every config of
    the space once, then again (cached lowering). Run: python tests/ascend/test_tir_vector3.py"""
    import itertools
    import time

    from opcompiler.backend import get_backend
    from opcompiler.target import load_target

    be = get_backend(load_target("ascend-sim"))
    tmpl = AscendElemwise()
    wl = workload(op, shape, dtype=dtype)
    knobs = tmpl.space(wl, be.target)
    cfgs = [dict(zip([k.name for k in knobs], v)) for v in itertools.product(*[k.values for k in knobs])]
    tir_apply = AscendElemwise.apply
    res = {}
    for route in ("tik", "tir", "tir (again, cached)"):
        AscendElemwise.apply = tir_apply if route.startswith("tir") else (
            lambda self, w, t, c: tik_channel_plan(w, t, c))
        times, cycles, n_bad = [], {}, 0
        for cfg in cfgs:
            t0 = time.perf_counter()
            try:
                cycles[str(cfg)] = be.measure(be.build(wl, cfg)).cycles
            except OpcError:
                n_bad += 1
            times.append(time.perf_counter() - t0)
        AscendElemwise.apply = tir_apply
        res[route] = cycles
        print(f"{route:20s} {len(cfgs)} configs ({n_bad} invalid): first {times[0] * 1e3:7.1f} ms, "
              f"mean {np.mean(times) * 1e3:6.1f} ms, median {np.median(times) * 1e3:6.1f} ms per candidate; "
              f"best {min(cycles.values())} cycles")
    same = sum(res["tir"].get(k) == v for k, v in res["tik"].items())
    print(f"cycles equal on {same}/{len(res['tik'])} configs valid on both")


if __name__ == "__main__":
    bench()
