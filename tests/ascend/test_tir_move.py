"""Data-movement ops through TVM (issue 12, Ascend vector side): slice, pad, transpose, concat.

`schedules/ascend/move.py` schedules the op's own TE compute (views of the runs the op moves,
the op's block cache_written into a UB tile, tiles of ub_tile elements, dma_copy pragmas); the
backend's `lower.move` lowering (emit_insn's shaped lowering: DMA boxes, an instruction loop per
transposed block, a vector dup then the in-image box for padding) turns it into the program.
Outputs are copies: exact against numpy. Cycles and core-0 instruction counts below were
measured at afeecc6 by the retired TIK-style emitter (`AscendElemwise._apply_slice / _pad /
_transpose / _apply_concat`); the TVM route reproduces them exactly (asserted as equalities). concat's compute is written per
input (a block per input under the image loop, a tile loop per input: the retired emitter's
unit order); `tik_concat_plan` below is the retired concat emitter (abb07b1), the oracle of the
random parity check.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend.ascend import execute
from opcompiler.backend.ascend.lower import move
from opcompiler.backend.ascend import KernelBuilder, Plan, split_even
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload

from .conftest import pinned_target

CONFIGS = [None, {"ub_tile": 1024, "double_buffer": 1, "block_dim": 1},
           {"ub_tile": 1024, "double_buffer": 0, "block_dim": 2},
           {"ub_tile": 2048, "double_buffer": 1, "block_dim": 4},
           {"ub_tile": 4096, "double_buffer": 1, "block_dim": 8}]  # None: the default (32768, 1, 32)

# (op, shape, fp16|fp32) -> (cycles per CONFIGS entry, instructions on core 0 per entry), the retired emitter
PINNED = {
    ("slice", "dims=2x9x5x7,axis=1,start=3,end=8", "16"): ((1425, 1425, 1425, 1425, 1425), (3, 3, 3, 3, 3)),
    ("slice", "dims=2x9x5x7,axis=1,start=3,end=8", "32"): ((1441, 1441, 1441, 1441, 1441), (3, 3, 3, 3, 3)),
    ("slice", "dims=3x5000,axis=1,start=10,end=4990", "16"): ((2111, 4690, 4640, 1994, 1598), (3, 45, 24, 9, 3)),
    ("slice", "dims=3x5000,axis=1,start=10,end=4990", "32"): ((2811, 5174, 5018, 2182, 1790), (3, 45, 24, 9, 3)),
    ("slice", "dims=1x8x4x4,axis=1,start=0,end=4", "16"): ((1409, 1409, 1409, 1409, 1409), (3, 3, 3, 3, 3)),
    ("slice", "dims=1x8x4x4,axis=1,start=0,end=4", "32"): ((1412, 1412, 1412, 1412, 1412), (3, 3, 3, 3, 3)),
    ("slice", "dims=5x7x33,axis=2,start=1,end=30", "16"): ((1522, 1522, 1522, 1522, 1522), (3, 3, 3, 3, 3)),
    ("slice", "dims=5x7x33,axis=2,start=1,end=30", "32"): ((1570, 1570, 1570, 1570, 1570), (3, 3, 3, 3, 3)),
    ("slice", "dims=37x41,axis=0,start=3,end=20", "16"): ((1439, 1439, 1439, 1439, 1439), (3, 3, 3, 3, 3)),
    ("slice", "dims=37x41,axis=0,start=3,end=20", "32"): ((1472, 1472, 1472, 1472, 1472), (3, 3, 3, 3, 3)),
    ("concat", "n=2,c=13,c1=20,h=5,w=7", "16"): ((1429, 2092, 1870, 1429, 1429), (3, 12, 6, 3, 3)),
    ("concat", "n=2,c=13,c1=20,h=5,w=7", "32"): ((1450, 2168, 1924, 1450, 1450), (3, 12, 6, 3, 3)),
    ("concat", "n=1,c=32,c1=32,h=28,w=28", "16"): ((2582, 12798, 12374, 3086, 1926), (3, 150, 75, 21, 6)),
    ("concat", "n=1,c=32,c1=32,h=28,w=28", "32"): ((3758, 14382, 13550, 3566, 2246), (3, 150, 75, 21, 6)),
    ("concat", "n=3,c=5,c1=7,h=9,w=11", "16"): ((1430, 2534, 2303, 1652, 1430), (3, 18, 9, 6, 3)),
    ("concat", "n=3,c=5,c1=7,h=9,w=11", "32"): ((1453, 2647, 2382, 1697, 1453), (3, 18, 9, 6, 3)),
    ("pad", "n=2,c=3,h=7,w=6,pt=0,pl=0,pb=1,pr=1,fill=lowest", "16"): ((1442, 2543, 2330, 1655, 1442), (4, 24, 12, 8, 4)),
    ("pad", "n=2,c=3,h=7,w=6,pt=0,pl=0,pb=1,pr=1,fill=lowest", "32"): ((1445, 2553, 2339, 1659, 1445), (4, 24, 12, 8, 4)),
    ("pad", "n=1,c=5,h=9,w=40,pt=2,pl=3,pb=0,pr=1,fill=zero", "16"): ((1484, 2456, 2456, 1706, 1484), (5, 25, 15, 10, 5)),
    ("pad", "n=1,c=5,h=9,w=40,pt=2,pl=3,pb=0,pr=1,fill=zero", "32"): ((1509, 2531, 2531, 1740, 1509), (5, 25, 15, 10, 5)),
    ("pad", "n=1,c=4,h=56,w=56,pt=0,pl=0,pb=1,pr=1,fill=zero", "16"): ((1729, 5449, 5120, 1860, 1729), (5, 80, 40, 10, 5)),
    ("pad", "n=1,c=4,h=56,w=56,pt=0,pl=0,pb=1,pr=1,fill=zero", "32"): ((1905, 5884, 5474, 2008, 1905), (5, 80, 40, 10, 5)),
    ("pad", "n=1,c=3,h=13,w=17,pt=0,pl=0,pb=0,pr=0,fill=zero", "16"): ((1417, 1836, 1836, 1417, 1417), (3, 9, 6, 3, 3)),
    ("pad", "n=1,c=3,h=13,w=17,pt=0,pl=0,pb=0,pr=0,fill=zero", "32"): ((1427, 1856, 1856, 1427, 1427), (3, 9, 6, 3, 3)),
    ("pad", "n=2,c=2,h=11,w=9,pt=3,pl=0,pb=2,pr=0,fill=lowest", "16"): ((1451, 2109, 1904, 1451, 1451), (5, 20, 10, 5, 5)),
    ("pad", "n=2,c=2,h=11,w=9,pt=3,pl=0,pb=2,pr=0,fill=lowest", "32"): ((1458, 2127, 1918, 1458, 1458), (5, 20, 10, 5, 5)),
}
# Transposes keeping the innermost axis take strided DMAs now (a DMA gathers the runs of a chain
# of y's leading axes into the tile, laid out as y; one move out: tests/ascend/test_transpose_runs.py);
# the retired emitter moved one run per DMA (cycles per CONFIGS entry, then core-0 instructions:
# 1x2x3x7x9/02134 fp16 (2424 x5) (8 x5), fp32 (2442 x5) (8 x5); 1x2x4x8x8/02134 fp16 (2830 x5)
# (10 x5), fp32 (2854 x5) (10 x5); 5x3x700/102 fp16 (4700, 4547, 4526, 2094, 2371) (17, 45, 24,
# 8, 7), fp32 (5193, 4888, 4790, 2182, 2535) (17, 45, 24, 8, 7)). Configs where a tile holds one
# run (5x3x700 at ub_tile 1024) are unchanged. Their own counts, pinned the same way:
PINNED_STRIDED = {
    ("transpose", "dims=1x2x3x7x9,perm=02134", "16"): ((1632, 1632, 1632, 1632, 1632), (4, 4, 4, 4, 4)),
    ("transpose", "dims=1x2x3x7x9,perm=02134", "32"): ((1650, 1650, 1650, 1650, 1650), (4, 4, 4, 4, 4)),
    ("transpose", "dims=1x2x4x8x8,perm=02134", "16"): ((1642, 1642, 1642, 1642, 1642), (4, 4, 4, 4, 4)),
    ("transpose", "dims=1x2x4x8x8,perm=02134", "32"): ((1666, 1666, 1666, 1666, 1666), (4, 4, 4, 4, 4)),
    ("transpose", "dims=5x3x700,perm=102", "16"): ((2324, 4547, 4526, 1940, 1579), (5, 45, 24, 9, 3)),
    ("transpose", "dims=5x3x700,perm=102", "32"): ((2817, 4888, 4790, 2072, 1743), (5, 45, 24, 9, 3)),
}
# Transposes moving the innermost axis take vnchwconv now (tiles read in whole rows, transposed in
# UB by the vector unit, copied out: tests/ascend/test_transpose_vector.py); the retired emitter
# moved them one element at a time (fp16, default config: 4x6x5/201 25330 cycles, 3x600/10
# 363063, 6x5x4x3/3012 73578, 2x3x40x40/0132 1931106). Their own counts, pinned the same way:
PINNED_VNCHWCONV = {
    ("transpose", "dims=4x6x5,perm=201", "16"): ((1490, 1490, 1490, 1490, 1490), (4, 4, 4, 4, 4)),
    ("transpose", "dims=4x6x5,perm=201", "32"): ((1496, 1496, 1496, 1496, 1496), (4, 4, 4, 4, 4)),
    ("transpose", "dims=3x600,perm=10", "16"): ((2790, 6255, 4138, 2237, 1718), (4, 76, 40, 12, 4)),
    ("transpose", "dims=3x600,perm=10", "32"): ((2944, 6316, 4209, 2266, 1752), (4, 76, 40, 12, 4)),
    ("transpose", "dims=6x5x4x3,perm=3012", "16"): ((1702, 3065, 2236, 1501, 1702), (4, 32, 16, 4, 4)),
    ("transpose", "dims=6x5x4x3,perm=3012", "32"): ((1719, 3073, 2241, 1719, 1719), (4, 32, 16, 4, 4)),
    ("transpose", "dims=2x3x40x40,perm=0132", "16"): ((3068, 10136, 6237, 2894, 1942), (12, 144, 72, 26, 9)),
    ("transpose", "dims=2x3x40x40,perm=0132", "32"): ((3218, 10448, 6446, 3008, 1716), (18, 144, 72, 26, 6)),
}
# rows longer than the tile (moved in chunks), checked the same way (the retired emitter, afeecc6)
LONG_CONFIGS = [{"ub_tile": 1024, "double_buffer": 1, "block_dim": 1},
                {"ub_tile": 2048, "double_buffer": 0, "block_dim": 4}, None]
PINNED_LONG = {
    ("transpose", "dims=3x2x3000,perm=102", "16"): (5386, 2459, 2459),  # default config: 3251 before strided DMAs
    ("transpose", "dims=3x2x3000,perm=102", "32"): (5966, 2696, 3303),  # 4095 before
    ("transpose", "dims=2x3x5x9000,perm=1023", "16"): (62464, 17629, 2942),
    ("transpose", "dims=2x3x5x9000,perm=1023", "32"): (70916, 20794, 4478),
    ("slice", "dims=4x3x3000,axis=1,start=1,end=3", "16"): (6774, 2504, 2537),
    ("slice", "dims=4x3x3000,axis=1,start=1,end=3", "32"): (7538, 2785, 3662),
    ("pad", "n=1,c=3,h=40,w=1000,pt=1,pl=2,pb=3,pr=4,fill=lowest", "16"): (33830, 10449, 3245),
    ("pad", "n=1,c=3,h=40,w=1000,pt=1,pl=2,pb=3,pr=4,fill=lowest", "32"): (37510, 12304, 4986),
}
TIR_OPS = ("slice", "pad", "transpose", "concat")


@pytest.mark.parametrize("key", list(PINNED) + list(PINNED_VNCHWCONV) + list(PINNED_STRIDED),
                         ids=lambda k: f"{k[0]}-{k[1]}-fp{k[2]}")
def test_move_parity_with_the_retired_emitter(pinned_backend, key):
    """Exact outputs, and the retired emitter's cycles and core-0 instruction counts exactly on
    every pinned config (the TVM route reproduces them all: equal, not merely no slower), on
    both clocks (functional and timing); the transposes moving the innermost axis at the
    vnchwconv route's own pinned counts, those keeping it at the strided DMAs' own."""
    op, shape, bits = key
    cycles, instrs = {**PINNED, **PINNED_VNCHWCONV, **PINNED_STRIDED}[key]
    for cfg, old, n_ins in zip(CONFIGS, cycles, instrs):
        rep = run_op(op, pinned_target(), shape=shape, dtype=f"float{bits}", config=cfg)
        assert rep["correct"] and rep["max_abs_err"] == 0, (cfg, rep["max_abs_err"])
        assert rep["cycles"] == rep["timing_cycles"] == old, (cfg, rep["cycles"], old)
        assert rep["instructions_core0"] == n_ins, (cfg, rep["instructions_core0"], n_ins)
    kern = pinned_backend.build(workload(op, shape, dtype=f"float{bits}"))
    if op in TIR_OPS:
        assert kern.info["lowering"].startswith("TVM s_tir")


@pytest.mark.parametrize("key", list(PINNED_LONG), ids=lambda k: f"{k[0]}-{k[1]}-fp{k[2]}")
def test_long_rows_parity(key):
    op, shape, bits = key
    for cfg, old in zip(LONG_CONFIGS, PINNED_LONG[key]):
        rep = run_op(op, pinned_target(), shape=shape, dtype=f"float{bits}", config=cfg)
        assert rep["correct"] and rep["max_abs_err"] == 0, (cfg, rep["max_abs_err"])
        assert rep["cycles"] == rep["timing_cycles"] == old, (cfg, rep["cycles"], old)


def test_outputs_are_the_op_s_copies_bit_for_bit(pinned_backend):
    """Bit patterns, not just values: fp16 fills (lowest) and every moved element."""
    for op, shape in [("pad", "n=2,c=2,h=11,w=9,pt=3,pl=0,pb=2,pr=0,fill=lowest"),
                      ("transpose", "dims=6x5x4x3,perm=3012"), ("slice", "dims=5x7x33,axis=2,start=1,end=30")]:
        wl = workload(op, shape, dtype="float16")
        d = get_op(op)
        ins = d.make_inputs(wl, 3)
        kern = pinned_backend.build(wl, {"ub_tile": 1024, "double_buffer": 1, "block_dim": 4})
        out = pinned_backend.run(kern, ins).outputs[0]
        ref = d.reference(wl, ins)
        assert out.shape == ref.shape and np.array_equal(out.view(np.uint16), ref.view(np.uint16))


def test_the_schedule_is_the_op_s_compute():
    from opcompiler.schedules.ascend.move import move_schedule
    cfg = {"ub_tile": 1024, "double_buffer": 1, "block_dim": 2}
    for op, shape, names in [("slice", "dims=2x9x5x7,axis=1,start=3,end=8", ["x", "slice"]),
                             ("pad", "n=1,c=5,h=9,w=40,pt=2,pl=3,pb=0,pr=1", ["x", "pad_out"]),
                             ("transpose", "dims=4x6x5,perm=201", ["x", "transpose"])]:
        mod = move_schedule(workload(op, shape, dtype="float16"), cfg)
        assert [b.name for b in mod["main"].params] == names
        vk = move.lower(mod)
        trans = [n for n in vk.nests if "vector_transpose" in n]  # 201 moves the innermost axis: vnchwconv
        assert vk.cores == 2 and vk.slots == 2 and all("dma_copy" in n for n in vk.nests if n not in trans)
        assert len(trans) == (op == "transpose")


def test_a_corrupted_program_gives_a_wrong_result(monkeypatch):
    """The simulator runs what the lowering emitted: shifting the first move's source box by
    one element changes the output."""
    real = move.lower

    def shifted(mod):
        vk = copy.deepcopy(real(mod))
        o = next(o for o in vk.ops if o.kind == "dma" and o.srcs[0].buf in vk.gm)
        lo = o.srcs[0].box[0].copy()
        lo[:, -1] += 1
        o.srcs[0].box = (lo, o.srcs[0].box[1])
        return vk

    monkeypatch.setattr(move, "lower", shifted)
    rep = run_op("slice", "ascend-sim", shape="dims=5x7x33,axis=2,start=1,end=30", dtype="float16")
    assert not rep["correct"]


@pytest.mark.parametrize("op,shape,cfg", [
    ("transpose", "dims=300x300x2,perm=102", None),  # 180000 runs of one element
    ("pad", "n=1,c=64,h=5,w=100,pt=1,pl=1,pb=1,pr=1,layout=NHWC", {"ub_tile": 1024, "double_buffer": 1, "block_dim": 1}),  # a padded NHWC row of 102*64
    ("pad", "n=1,c=2,h=5,w=1500,pt=1,pl=1,pb=1,pr=1", {"ub_tile": 1024, "double_buffer": 1, "block_dim": 1})])
def test_bad_inputs_still_raise_opc_errors(op, shape, cfg):
    with pytest.raises(OpcError):
        run_op(op, "ascend-sim", shape=shape, dtype="float16", config=cfg)


def tik_concat_plan(wl, target, cfg) -> Plan:
    """The retired TIK-style concat (AscendElemwise._apply_concat at abb07b1): per image, each
    input's channel block in tiles, GM -> UB -> GM, the units shared over the cores in order."""
    from opcompiler.schedules.ascend.common import machine

    m = machine(target)
    dt = wl.dtype
    n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
    slots = 2 if cfg["double_buffer"] else 1
    tile = cfg["ub_tile"]
    hw = h * w
    cc = (c, wl["c1"])
    units = [(i, (b, s), min(tile, cc[i] * hw - s)) for b in range(n) for i in range(2)
             for s in range(0, cc[i] * hw, tile)]
    out_shape_gm = (n, (c + wl["c1"]) * hw)
    active = min(cfg["block_dim"], len(units))

    def program(core: int):
        kb = KernelBuilder(m, core, active)
        xs = [kb.gm("x0", (n, c * hw), dt), kb.gm("x1", (n, wl["c1"] * hw), dt)]
        y = kb.gm("y", out_shape_gm, dt)
        bufs = [kb.alloc("UB", f"x0_{s}", (tile,), dt) for s in range(slots)]
        lo, hi = split_even(len(units), active, core)
        for j, (plane, (b, s0), cnt) in enumerate(units[lo:hi]):
            ub = bufs[j % slots]
            off = (0 if plane == 0 else c * hw) + s0
            kb.data_move(ub, (slice(0, cnt),), xs[plane], (b, slice(s0, s0 + cnt)))
            kb.data_move(y, (b, slice(off, off + cnt)), ub, (slice(0, cnt),))
            kb.loop()
        return kb.finish(gm_inputs=("x0", "x1"))

    def pack(inputs):
        return {f"x{i}": np.ascontiguousarray(x).reshape(n, -1) for i, x in enumerate(inputs)}

    return Plan(active_cores=active, make_program=program, pack=pack, out_name="y", out_shape=out_shape_gm,
                out_dtype=dt, unpack=lambda y: y.reshape(n, c + wl["c1"], h, w), flops=0, unit="vector")


def test_concat_random_parity_with_the_retired_emitter(pinned_backend):
    """Random shapes and configs: the TVM route's output bits equal the retired kernel's and
    numpy's; cycles (functional and timing) and core-0 instruction counts equal to the retired
    kernel's."""
    import random

    rnd = random.Random(12)
    from opcompiler.schedules.ascend.elemwise import UB_TILES

    for _ in range(24):
        shape = (f"n={rnd.randint(1, 3)},c={rnd.randint(1, 40)},c1={rnd.randint(1, 40)},"
                 f"h={rnd.randint(1, 40)},w={rnd.randint(1, 40)}")
        wl = workload("concat", shape, dtype=rnd.choice(["float16", "float32"]))
        cfg = {"ub_tile": rnd.choice(UB_TILES), "double_buffer": rnd.randint(0, 1), "block_dim": rnd.choice([1, 2, 4, 8, 32])}
        ins = get_op("concat").make_inputs(wl, 1)
        kern = pinned_backend.build(wl, cfg)
        run = pinned_backend.run(kern, ins)
        plan = tik_concat_plan(wl, pinned_backend.target, cfg)
        prog = plan.make_program(0)
        old_out, t = execute.run(plan, prog, ins)
        assert run.outputs[0].tobytes() == old_out.tobytes() == np.concatenate(ins, axis=1).tobytes(), (shape, cfg)
        assert run.cycles == pinned_backend.measure(kern).cycles == t.cycles, (shape, cfg, run.cycles, t.cycles)
        assert len(kern.artifact.plan.make_program(0).instrs) == len(prog.instrs), (shape, cfg)


def test_concat_per_input_is_the_op_s_compute():
    """concat's PrimFunc (a block per input) computes what the op's TE compute does."""
    import tvm
    from tvm import te

    from opcompiler.schedules.ascend.move import concat_func

    wl = workload("concat", "n=2,c=3,c1=5,h=4,w=7", dtype="float16")
    ins, out = get_op("concat").compute(wl)
    ref = tvm.compile(te.create_prim_func(list(ins) + [out]), target="llvm")
    mine = tvm.compile(concat_func(2, 3, 5, 4, 7, "float16"), target="llvm")
    xs = get_op("concat").make_inputs(wl, 1)
    outs = []
    for f in (ref, mine):
        o = tvm.runtime.tensor(np.zeros((2, 8, 4, 7), "float16"))
        f(*[tvm.runtime.tensor(x) for x in xs], o)
        outs.append(o.numpy())
    assert np.array_equal(outs[0], np.concatenate(xs, axis=1)) and np.array_equal(outs[1], outs[0])


def test_a_corrupted_concat_program_gives_a_wrong_result(monkeypatch):
    """The first input's move out of UB shifted by one element: a wrong result."""
    real = move.lower

    def shifted(mod):
        vk = copy.deepcopy(real(mod))
        o = [o for o in vk.ops if o.kind == "dma" and o.dst.buf in vk.gm][0]
        lo = o.dst.box[0].copy()
        lo[:, -1] += 1
        o.dst.box = (lo, o.dst.box[1])
        return vk

    assert run_op("concat", "ascend-sim", shape="n=2,c=13,c1=20,h=5,w=7", dtype="float16")["correct"]
    monkeypatch.setattr(move, "lower", shifted)
    rep = run_op("concat", "ascend-sim", shape="n=2,c=13,c1=20,h=5,w=7", dtype="float16")
    assert not rep["correct"]
