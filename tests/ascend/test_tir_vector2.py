"""Pooling (and what follows) through TVM (issue 12, items 1-2, Ascend vector side, continued).

`schedules/ascend/pool.py` (`pool_schedule`) schedules pool2d's own compute on the NC1HWC0 view (UB tiles of
output rows, the padded input computed at the tile loop, window taps as instruction loops,
emit_insn pragmas); the backend's `emit_insn` lowering (shaped nests: DMA boxes, strided-run
vector instructions, padded copies, reduction inits folded into the first tap) turns the module
into the AI Core program. These tests check the result against numpy, against the TIK-style
emission it replaced (kept here as the oracle), cycle for cycle where both kernels move the same
regions, and that the simulator runs what the lowering emitted (mutations break the output).
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
from opcompiler.backend.ascend.program import Buf, DataMove, Vec, VOp
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.ops.catalogue import pool_out_hw
from opcompiler.schedules.ascend.common import from_5hd, machine, to_5hd
from opcompiler.schedules.ascend.pool import AscendPool
from opcompiler.schedules.ascend.pool import count_table
from opcompiler.verify import compare

C0 = 16


# -- the TIK-style pooling kernel the TIR route replaced (the oracle) ---------------------------

def _tik_pixel_op(kb, op: str, dst: Buf, doff: int, src: Buf, soff: int, stride: int, npix: int) -> None:
    bpp = C0 * dst.itemsize // 32
    lanes_pb = 32 // dst.itemsize
    full, tail = divmod(npix, 8)
    for half in range(bpp):
        for reps, pix0, mask in ((full, 0, 8 * lanes_pb), (1 if tail else 0, full * 8, tail * lanes_pb)):
            if reps == 0:
                continue
            d = VOp(dst, doff + pix0 * C0 + half * lanes_pb, bpp, 8 * bpp)
            sv = VOp(src, soff + pix0 * stride * C0 + half * lanes_pb, stride * bpp, 8 * stride * bpp)
            kb.vec_raw(op, d, (sv,) if op == "copy" else (d, sv), reps, mask)


def tik_pool_plan(wl, target, cfg) -> Plan:
    """Per (plane, output-row tile): fill the padded input tile (pad > 0), DMA the in-image rows
    into it, per output row and tap one strided instruction group, avg: count tile and vdiv,
    DMA out. Buffers: the full padded width, `oh_tile` rows."""
    m = machine(target)
    dt = wl.dtype
    n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
    ho, wo = pool_out_hw(wl)
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    wp = max(w + 2 * p, (wo - 1) * s + k)
    c1 = ceil_div(c, C0)
    rt = cfg["oh_tile"]
    rin = (rt - 1) * s + k
    slots = 2 if cfg["double_buffer"] else 1
    avg = wl["mode"] == "avg"
    units = [(pl, r0, min(rt, ho - r0)) for pl in range(n * c1) for r0 in range(0, ho, rt)]
    active = min(cfg["block_dim"], len(units))
    fill = 0.0 if avg else float(np.finfo(dt).min)

    def program(core: int):
        kb = KernelBuilder(m, core, active)
        X = kb.gm("x", (n * c1, h, w, C0), dt)
        Y = kb.gm("y", (n * c1, ho, wo, C0), dt)
        CNT = kb.gm("count", (ho, wo, C0), dt) if avg else None
        bins = [kb.alloc("UB", f"in_{sl}", (rin, wp, C0), dt) for sl in range(slots)]
        bouts = [kb.alloc("UB", f"out_{sl}", (rt, wo, C0), dt) for sl in range(slots)]
        bcnt = [kb.alloc("UB", f"cnt_{sl}", (rt, wo, C0), dt) for sl in range(slots)] if avg else None
        lo, hi = split_even(len(units), active, core)
        for j, (pl, r0, rows) in enumerate(units[lo:hi]):
            bi, bo = bins[j % slots], bouts[j % slots]
            y0 = r0 * s - p
            ya, yb = max(y0, 0), min(y0 + (rows - 1) * s + k, h)
            if p > 0:
                kb.vec("dup", VOp(bi), (), rin * wp * C0, scalar=fill)
            kb.data_move(bi, (slice(ya - y0, yb - y0), slice(p, p + w)), X, (pl, slice(ya, yb)))
            for r in range(rows):
                for ky in range(k):
                    for kx in range(k):
                        soff = ((r * s + ky) * wp + kx) * C0
                        op = "copy" if ky == kx == 0 else ("add" if avg else "max")
                        _tik_pixel_op(kb, op, bo, r * wo * C0, bi, soff, s, wo)
            if avg:
                bc = bcnt[j % slots]
                kb.data_move(bc, (slice(0, rows),), CNT, (slice(r0, r0 + rows),))
                kb.vec("div", VOp(bo), (VOp(bo), VOp(bc)), rows * wo * C0)
            kb.data_move(Y, (pl, slice(r0, r0 + rows)), bo, (slice(0, rows),))
            kb.loop()
        return kb.finish(gm_inputs=("x", "count"))

    def pack(inputs):
        gm = {"x": to_5hd(inputs[0], wl.layout, C0).reshape(n * c1, h, w, C0)}
        if avg:
            gm["count"] = count_table(wl)
        return gm

    return Plan(active_cores=active, make_program=program, pack=pack, out_name="y", out_shape=(n * c1, ho, wo, C0),
                out_dtype=dt, unpack=lambda y: from_5hd(y.reshape(n, c1, ho * wo, C0), c, ho, wo, wl.layout),
                flops=0, unit="vector")


def _run_plan(plan, ins):
    prog = plan.make_program(0)
    out, t = execute.run(plan, prog, ins)
    return out, t.cycles, timing.schedule(prog).cycles


def _aligned(wl) -> bool:
    """The windows read every padded row and column ((H + 2P - K) and (W + 2P - K) multiples of
    the stride): the TIR schedule's input tile is then the TIK kernel's."""
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    return (wl["h"] + 2 * p - k) % s == 0 and (wl["w"] + 2 * p - k) % s == 0


POOL = ["n=1,c=13,h=9,w=9,kernel=3,stride=2,pad=1", "n=1,c=16,h=8,w=10,kernel=2,stride=2,pad=0",
        "n=2,c=20,h=11,w=11,kernel=3,stride=1,pad=1,layout=NHWC", "n=1,c=32,h=17,w=13,kernel=3,stride=2,pad=1",
        "n=1,c=16,h=8,w=8,kernel=3,stride=2,pad=1", "n=1,c=40,h=12,w=15,kernel=2,stride=2,pad=0"]


def _pool_configs(wl, target, k: int, seed: int):
    rng = random.Random(seed)
    knobs = AscendPool().space(wl, target)
    return [{kn.name: rng.choice(kn.values) for kn in knobs} for _ in range(k)]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("shape", POOL[:3])
def test_pool_tir_route_matches_numpy(backend, shape, mode, dtype):
    rep = run_op("pool2d", "ascend-sim", shape=f"{shape},mode={mode}", dtype=dtype)
    assert rep["correct"], rep["max_abs_err"]
    kern = backend.build(workload("pool2d", f"{shape},mode={mode}", dtype=dtype))
    assert kern.info["lowering"].startswith("TVM s_tir")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("shape", POOL)
def test_pool_parity_with_tik_emission(backend, shape, mode, dtype):
    """20 random configs: the TIR route's output bits equal the TIK kernel's and numpy's; the
    same cycles in functional and timing mode; against TIK: equal cycles when the tile divides
    the output rows and the windows read every padded column and row (the same regions), never
    more cycles otherwise save one case (the TIR tile fills and loads only what the windows
    read; stride 1 in fp32 is one contiguous instruction per tap, not two half-row ones). The
    case: pad 0 and (W - K) % S != 0, where the TIR tile loads the W' < W columns the windows
    read (fewer bytes, one burst per row) and TIK loaded whole rows (one burst): within 2 %."""
    wl = workload("pool2d", f"{shape},mode={mode}", dtype=dtype)
    ins = get_op("pool2d").make_inputs(wl)
    ref = get_op("pool2d").reference(wl, ins)
    ran = 0
    for cfg in _pool_configs(wl, backend.target, 20, zlib.crc32(f"{shape}{mode}{dtype}".encode())):
        try:
            kern = backend.build(wl, cfg)
        except OpcError:
            continue
        run = backend.run(kern, ins)
        timing = backend.measure(kern)
        tik_out, tik_fun, tik_time = _run_plan(tik_pool_plan(wl, backend.target, cfg), ins)
        assert np.array_equal(run.outputs[0], tik_out), cfg
        assert compare(run.outputs[0], ref)[0], cfg
        assert run.cycles == timing.cycles, cfg
        assert tik_fun == tik_time
        same = _aligned(wl) and pool_out_hw(wl)[0] % cfg["oh_tile"] == 0 and not (
            dtype == "float32" and wl["stride"] == 1)
        if same:
            assert run.cycles == tik_fun, (cfg, run.cycles, tik_fun)
        elif wl["pad"] == 0 and (wl["w"] - wl["kernel"]) % wl["stride"]:
            assert run.cycles <= tik_fun * 1.02, (cfg, run.cycles, tik_fun)
        else:
            assert run.cycles <= tik_fun, (cfg, run.cycles, tik_fun)
        ran += 1
    assert ran >= 10


def _mutated(kern, wl, ins, mutate):
    plan = kern.artifact.plan
    make = plan.make_program

    def program(core):
        prog = make(core)
        prog.instrs = [mutate(i) for i in prog.instrs]
        return prog

    out, _ = execute.run(replace(plan, make_program=program), program(0), ins)
    return out


def _copy(ins, **changes):
    out = copy.copy(ins)
    for k, v in changes.items():
        setattr(out, k, v)
    return out


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool_mutations_give_wrong_outputs(backend, mode):
    """The simulator runs the lowered program: a tap read with block stride 1 (the window stride
    dropped), the window op turned into min, or the input DMA shifted by one row changes the output."""
    wl = workload("pool2d", f"n=1,c=16,h=9,w=9,kernel=3,stride=2,pad=1,mode={mode}", dtype="float16")
    ins = get_op("pool2d").make_inputs(wl)
    ref = get_op("pool2d").reference(wl, ins)
    kern = backend.build(wl, {"oh_tile": 2, "double_buffer": 1, "block_dim": 2})
    unpack = kern.artifact.plan.unpack
    assert compare(_mutated(kern, wl, ins, lambda i: i), ref)[0]
    taps = [i for i in kern.artifact.plan.make_program(0).instrs if isinstance(i, Vec) and i.op in ("add", "max")]
    assert taps and all(i.srcs[1].blk_stride == 2 for i in taps)  # the window stride as block stride
    seen = []

    def shift_tap(i):
        if isinstance(i, Vec) and i.op in ("add", "max"):
            seen.append(i)
            s = i.srcs[1]
            return _copy(i, srcs=(i.srcs[0], VOp(s.buf, s.offset, 1, s.rep_stride)))
        return i

    assert not compare(_mutated(kern, wl, ins, shift_tap), ref)[0]
    wrong = "min" if mode == "max" else "sub"
    assert not compare(_mutated(kern, wl, ins, lambda i: _copy(i, op=wrong) if isinstance(i, Vec) and i.op in
                                ("add", "max") else i), ref)[0]
    moved = []

    def shift_dma(i):
        if isinstance(i, DataMove) and i.src.level == "GM" and i.src.name == "x" and not moved:
            moved.append(i)
            idx = list(i.src_idx)
            idx[1] = slice(idx[1].start + 1, idx[1].stop + 1) if idx[1].stop < i.src.shape[1] else \
                slice(idx[1].start - 1, idx[1].stop - 1)
            return _copy(i, src_idx=tuple(idx))
        return i

    assert not compare(_mutated(kern, wl, ins, shift_dma), ref)[0]
    assert moved and unpack is not None


def test_pool_trace_is_the_schedules_nests(backend):
    """9x9 max pool 3x3 stride 2 pad 1, fp16, 2 output rows per tile: per tile a fill of the
    padded tile (5 rows x 11 columns: two instructions), one DMA of the in-image rows (a burst per row), per output
    row the first tap a copy and 8 taps max (4 pixels: one masked repeat each), one DMA out."""
    wl = workload("pool2d", "n=1,c=16,h=9,w=9,kernel=3,stride=2,pad=1", dtype="float16")
    kern = backend.build(wl, {"oh_tile": 2, "double_buffer": 1, "block_dim": 1})
    prog = kern.artifact.program
    ops = [i.op if isinstance(i, Vec) else type(i).__name__ for i in prog.instrs]
    first = ops[:ops.index("Scalar") + 1]
    assert first == ["dup", "dup", "DataMove"] + (["copy"] + ["max"] * 8) * 2 + ["DataMove", "Scalar"]
    assert sum(i.repeat * i.mask for i in prog.instrs[:2]) == 5 * 11 * 16  # 6 repeats + a masked one
    dma = prog.instrs[2]
    assert dma.bursts == 4 and dma.nbytes == 4 * 9 * 32  # input rows 0..3 (padded rows 1..4)
    assert prog.high_water["UB"] == 2 * (5 * 11 + 2 * 5) * 32


def bench(shape: str = "n=1,c=64,h=56,w=56,kernel=3,stride=2,pad=1", dtype: str = "float16") -> None:
    """Seconds per candidate (build + measure in timing mode) on both routes, every config of
    the space once, then again (cached lowering). Run: python tests/ascend/test_tir_vector2.py"""
    import itertools
    import time

    from opcompiler.backend import get_backend
    from opcompiler.target import load_target

    be = get_backend(load_target("ascend-sim"))
    tmpl = AscendPool()
    for mode in ("max", "avg"):
        wl = workload("pool2d", f"{shape},mode={mode}", dtype=dtype)
        knobs = tmpl.space(wl, be.target)
        cfgs = [dict(zip([k.name for k in knobs], v)) for v in itertools.product(*[k.values for k in knobs])]
        tir_apply = AscendPool.apply
        res = {}
        for route in ("tik", "tir", "tir (again, cached)"):
            AscendPool.apply = tir_apply if route.startswith("tir") else (lambda self, w, t, c: tik_pool_plan(w, t, c))
            times, cycles, n_bad = [], {}, 0
            for cfg in cfgs:
                t0 = time.perf_counter()
                try:
                    cycles[str(cfg)] = be.measure(be.build(wl, cfg)).cycles
                except OpcError:
                    n_bad += 1
                times.append(time.perf_counter() - t0)
            AscendPool.apply = tir_apply
            res[route] = cycles
            print(f"{mode:4s} {route:20s} {len(cfgs)} configs ({n_bad} invalid): first {times[0] * 1e3:7.1f} ms, "
                  f"mean {np.mean(times) * 1e3:6.1f} ms, median {np.median(times) * 1e3:6.1f} ms per candidate; "
                  f"best {min(cycles.values())} cycles")
        same = sum(res["tir"].get(k) == v for k, v in res["tik"].items())
        print(f"{mode:4s} cycles equal on {same}/{len(res['tik'])} configs valid on both; TIR fewer on "
              f"{sum(res['tir'].get(k, 1e18) < v for k, v in res['tik'].items())}")


if __name__ == "__main__":
    bench()
