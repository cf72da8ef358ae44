"""Cycles derived by hand from the target figures, asserted exactly on BOTH clocks (the timing
model and the functional replay's own clock), for small kernels of each simulator: one DMA,
one cube / FMAC block, a double-buffered loop, a multi-core split with a barrier, an epilogue.

ascend910-sim figures (targets/ascend910-sim.toml): launch 1000, scalar issue 2 per
instruction, set_flag/wait_flag 4 per dependency between pipes; GM->UB 110 B/cycle + 200,
UB->GM 64 B/cycle + 200, L1->L0A 512 B/cycle + 20, L1->L0B 256 B/cycle + 20, L0C->UB
256 B/cycle + 20 (a transfer costs ceil(latency + bytes / rate)); cube 32 + 1 per fractal;
vector 16 + 1 per 256-byte repeat (128 fp16 or 64 fp32 lanes); HBM 1200 B/cycle, L2
3520 B/cycle for the chip.

ft-m7032-dsp-sim figures (targets/ft-m7032-dsp-sim.toml): DMA engine 300 start-up +
latency (DDR 200, GSM 40) + bytes / 64 + 2 per contiguous run, truncated to whole cycles;
DDR 42.7 GB/s / 1.8 GHz = 23.72 B/cycle and GSM 307.2 / 1.8 = 170.67 B/cycle shared by the
cluster, held from the transfer's start + 300 for ceil(bytes / rate) cycles; VPU: 2 vector
load/store slots (latency 4), 3 FMACs (latency 6), 1 vector ALU (latency 2), loop exit 7."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opcompiler.backend.ascend import KernelBuilder
from opcompiler.backend.ascend.program import Memory as AscMemory, VOp
from opcompiler.backend.ascend.machine import Machine
from opcompiler.backend.ascend.execute import replay
from opcompiler.backend.ascend.timing import schedule
from opcompiler.backend.dsp import execute as ex, fclock as dfc, program as vx, timing as tm
from opcompiler.backend.dsp.lower.assemble import host_ops
from opcompiler.backend.dsp.machine import machine as dsp_machine
from opcompiler.backend.dsp.program import Op, Program, View, dma_op
from opcompiler.target import load_target

AM = Machine.from_target(load_target("ascend-sim"))
DM = dsp_machine(load_target("dsp-sim"))
DFC = dfc.clock(load_target("dsp-sim"))


def _asc_both(prog) -> tuple[int, int]:
    """(timing, functional) cycles of an Ascend program; GM tensors hold zeros."""
    gm = {name: np.zeros(b.shape, b.dtype) for name, b in prog.gm.items()}
    mem = AscMemory({k: v.capacity for k, v in AM.levels.items()}, gm)
    return schedule(prog).cycles, replay(prog, mem).cycles


# ---------------------------------------------------------------- ascend


def test_ascend_one_dma():
    """One 16 KiB GM -> UB transfer on one core. It leaves the scalar unit at 1000 + 2 = 1002.
    GM rate: the whole tensor is read once (no L2 re-reads: all 16 KiB go to HBM), one reader
    and one writer share HBM: 1200 / 2 = 600 B/cycle > the path's 110, so 110 holds.
    ceil(200 + 16384 / 110) = ceil(348.95) = 349: 1002 + 349 = 1351."""
    kb = KernelBuilder(AM, 0, 1)
    x = kb.gm("x", (8192,), "float16")
    u = kb.alloc("UB", "u", (8192,), "float16")
    kb.data_move(u, (slice(None),), x, (slice(None),))
    assert _asc_both(kb.finish(gm_inputs=("x",))) == (1351, 1351)


def test_ascend_one_cube_block():
    """Load2D A (2 x 4 fractals, 4 KiB) and B (4 x 2, 4 KiB), one MMAD of 2 x 4 x 2 = 16
    fractals. A: issue 1002, 20 + 4096 / 512 = 28 -> 1030. B: issued at 1004, MTE1 busy until
    1030, 20 + 4096 / 256 = 36 -> 1066. MMAD issued at 1006 waits for B's flag: 1066 + 4 = 1070,
    32 + 16 = 48 -> 1118."""
    kb = KernelBuilder(AM, 0, 1)
    a1 = kb.alloc("L1", "a1", (2, 4, 16, 16), "float16")
    b1 = kb.alloc("L1", "b1", (4, 2, 16, 16), "float16")
    a0 = kb.alloc("L0A", "a0", (2, 4, 16, 16), "float16")
    b0 = kb.alloc("L0B", "b0", (4, 2, 16, 16), "float16")
    c0 = kb.alloc("L0C", "c0", (2, 32, 16), "float32")
    kb.data_move(a0, (slice(None),), a1, (slice(None),))
    kb.data_move(b0, (slice(None),), b1, (slice(None),))
    kb.mmad(c0, a0, b0, 2, 4, 2)
    prog = kb.finish()
    assert _asc_both(prog) == (1118, 1118)
    assert schedule(prog).busy["M"] == 48 and schedule(prog).busy["MTE1"] == 64


def _stream(slots: int, barrier: bool = False):
    kb = KernelBuilder(AM, 0, 1)
    x = kb.gm("x", (2, 4096), "float16")
    y = kb.gm("y", (2, 4096), "float16")
    bufs = [kb.alloc("UB", f"u{s}", (4096,), "float16") for s in range(slots)]
    for i in range(2):
        u = bufs[i % slots]
        kb.data_move(u, (slice(None),), x, (i,))
        kb.vec("relu", VOp(u), (VOp(u),), 4096)
        kb.data_move(y, (i,), u, (slice(None),))
    return kb.finish(gm_inputs=("x",))


def test_ascend_double_buffered_loop():
    """Two tiles of 4096 fp16 (8 KiB): in ceil(200 + 8192 / 110) = 275, ReLU 16 + 32 repeats = 48,
    out ceil(200 + 8192 / 64) = 328 (one core: HBM shares 600 B/cycle, above both paths).
    Two UB buffers: in0 1002-1277; relu0 (flag +4) 1281-1329; out0 1333-1661; in1 starts when
    MTE2 is free, 1277-1552; relu1 1556-1604; out1 waits for MTE3: 1661-1989.
    One buffer: in1 must wait until out0 has read u0 (WAR, + flag): 1665-1940; relu1
    1944-1992; out1 1996-2324. Double buffering saves 335 cycles."""
    assert _asc_both(_stream(2)) == (1989, 1989)
    assert _asc_both(_stream(1)) == (2324, 2324)


def _split(barrier: bool):
    kb = KernelBuilder(AM, 0, 2)  # core 0 of two: its half of x
    x = kb.gm("x", (2, 4096), "float16")
    y = kb.gm("y", (2, 4096), "float16")
    u = kb.alloc("UB", "u", (4096,), "float16")
    v = kb.alloc("UB", "v", (512,), "float16")
    kb.data_move(u, (slice(None),), x, (0,))
    if barrier:
        kb.barrier()
    kb.vec("dup", VOp(v), (), 512, scalar=1.0)
    kb.vec("relu", VOp(u), (VOp(u),), 4096)
    kb.data_move(y, (0,), u, (slice(None),))
    return kb.finish(gm_inputs=("x",))


def test_ascend_multi_core_split_with_a_barrier():
    """Core 0 of a two-core split reads its half of x (8 KiB). Both cores read disjoint halves
    (no L2 re-reads), two readers and two writers share HBM: 1200 / 4 = 300 B/cycle, above the
    paths, so in = 275 and out = 328 as on one core. in: 1002-1277. pipe_barrier: every pipe
    and the issue clock wait until 1277. dup of 512 fp16 (4 repeats: 20) issued at 1279:
    1279-1299; ReLU issued at 1281, V busy until 1299: 1299-1347; out (flag +4) 1351-1679.
    Without the barrier the dup runs under the DMA (1004-1024), ReLU waits only for the data
    (1281-1329) and out ends at 1333 + 328 = 1661: the barrier costs 18 cycles."""
    assert _asc_both(_split(True)) == (1679, 1679)
    assert _asc_both(_split(False)) == (1661, 1661)


def test_ascend_epilogue():
    """L0C -> UB of 256 fp32 (1 KiB, V pipe): 20 + 1024 / 256 = 24, issued at 1002 -> 1026.
    ReLU in fp32 (64 lanes: 4 repeats, 20), same pipe, no flag: 1026-1046. Cast to fp16 (the
    wider operand sets 64 lanes: 4 repeats, 20): 1046-1066. UB -> GM of 512 B on MTE3 (flag
    +4): ceil(200 + 512 / 64) = 208, 1070-1278."""
    kb = KernelBuilder(AM, 0, 1)
    y = kb.gm("y", (256,), "float16")
    c0 = kb.alloc("L0C", "c0", (1, 16, 16), "float32")
    u32 = kb.alloc("UB", "u32", (1, 16, 16), "float32")
    u16 = kb.alloc("UB", "u16", (256,), "float16")
    kb.data_move(u32, (slice(None),), c0, (slice(None),))
    kb.vec("relu", VOp(u32), (VOp(u32),), 256)
    kb.vec("conv", VOp(u16), (VOp(u32),), 256)
    kb.data_move(y, (slice(None),), u16, (slice(None),))
    assert _asc_both(kb.finish()) == (1278, 1278)


def test_ascend_two_transfers_queue_on_one_pipe():
    """Two 16 KiB GM -> UB transfers of two tensors, no dependence between them: the first as in
    test_ascend_one_dma, 1002-1351; the second is issued at 1004 but MTE2 moves one transfer at
    a time: 1351 + 349 = 1700."""
    kb = KernelBuilder(AM, 0, 1)
    x = kb.gm("x", (8192,), "float16")
    z = kb.gm("z", (8192,), "float16")
    u = kb.alloc("UB", "u", (8192,), "float16")
    w = kb.alloc("UB", "w", (8192,), "float16")
    kb.data_move(u, (slice(None),), x, (slice(None),))
    kb.data_move(w, (slice(None),), z, (slice(None),))
    assert _asc_both(kb.finish(gm_inputs=("x", "z"))) == (1700, 1700)


def test_ascend_one_vector_op():
    """ReLU over 8192 fp16 in UB: 128 lanes a repeat, 64 repeats: 16 + 64 = 80 cycles on V,
    issued at 1002: 1082."""
    kb = KernelBuilder(AM, 0, 1)
    u = kb.alloc("UB", "u", (8192,), "float16")
    kb.vec("relu", VOp(u), (VOp(u),), 8192)
    assert _asc_both(kb.finish()) == (1082, 1082)


# ---------------------------------------------------------------- dsp


def _prog(cores, ddr: dict, mult=None) -> Program:
    return Program(cores=cores, multiplicity=mult or [1] * len(cores), host_pre=[], host_post=[],
                   ddr_tensors=ddr, inputs=[], output=next(iter(ddr)), out_shape=ddr[next(iter(ddr))])


def _dsp_both(prog) -> tuple[int, int]:
    """(timing, functional) device cycles of a DSP program."""
    return tm.timing(DM, prog).dsp_cycles, dfc.replay(DM, prog, [])[2].dsp_cycles


def _load(space, n: int, at: int, tag: str, dst_at: int = 0) -> Op:
    return dma_op(DM, View(space, at, (n,), (1,)), View(("AM",), dst_at, (n,), (1,)), (), (tag,), True)


def _store(n: int, at: int, tag: str, src_at: int) -> Op:
    return dma_op(DM, View(("AM",), src_at, (n,), (1,)), View(("DDR", "x"), at, (n,), (1,)), (tag,), (), True)


def _pass(nest: vx.Nest, reads: tuple, writes: tuple) -> Op:
    k = vx.VKernel((nest,), "hand")
    return Op("vpu", "vpu", cycles=tm.kernel_cost(DM, k).cycles, reads=reads, writes=writes,
              fn=lambda mem, k=k: ex.execute_pass(mem, k, DM.lanes))


def _fma_block(at: int, out: int, reads: tuple = (), writes: tuple = ()) -> Op:
    """y = (x * w + x) * w + x on one 32-lane vector: two chained FMAs."""
    return _pass(vx.Nest(outer=(1,), post=(
        vx.VI("vld", "x", (vx.Mem("AM", at, (0,)),)), vx.VI("vld", "w", (vx.Mem("AM", at + 32, (0,)),)),
        vx.VI("vfma", "y", ("x", "w", "x")), vx.VI("vfma", "y", ("y", "w", "x")),
        vx.VI("vst", vx.Mem("AM", out, (0,)), ("y",)))), reads, writes)


def test_dsp_one_dma():
    """DDR -> AM of 4 KiB: engine 300 + 200 + 4096 / 64 + 2 = 566; the DDR channel is held from
    300 for ceil(4096 / 23.72) = 173 cycles, until 473 < 566: 566.
    GSM -> AM of 10,000 B: int(300 + 40 + 156.25 + 2) = 498; GSM ceil(10000 / 170.67) = 59,
    300 + 59 = 359 < 498: 498."""
    assert _dsp_both(_prog([[_load(("DDR", "x"), 1024, 0, "a")]], {"x": (1024,)})) == (566, 566)
    assert _dsp_both(_prog([[_load(("GSM",), 2500, 0, "a")]], {"x": (4,)})) == (498, 498)


def test_dsp_one_fmac_block():
    """Two vector loads in the two load/store slots of cycle 0, ready at 4; the first FMA at 4
    (ready 10), the second waits for it: 10 (ready 16); the store at 16 completes at 20; the
    loop exit adds 7: 27."""
    op = _fma_block(0, 64)
    assert op.cycles == 27
    assert _dsp_both(_prog([[op]], {"x": (4,)})) == (27, 27)


def _db(double: bool):
    a1 = "a1" if double else "a0"
    in0, in1 = _load(("DDR", "x"), 1024, 0, "a0"), _load(("DDR", "x"), 1024, 1024, a1, 2048 if double else 0)
    f0 = _fma_block(0, 4096, ("a0",), ("o0",))
    f1 = _fma_block(2048 if double else 0, 4096 + 1024, (a1,), ("o1",))
    out0, out1 = _store(32, 2048, "o0", 4096), _store(32, 2080, "o1", 4096 + 1024)
    order = [in0, in1, f0, out0, f1, out1] if double else [in0, f0, out0, in1, f1, out1]
    return _prog([order], {"x": (4096,)})


def test_dsp_double_buffered_loop():
    """Two tiles: in (DDR -> AM 4 KiB, 566), a 27-cycle FMA pass, out (AM -> DDR of 128 B:
    300 + 200 + 2 + 2 = 504; DDR 300 + 6 < 504). Two buffers, the next tile's load issued before
    this tile's pass: in0 0-566, in1 566-1132, pass0 566-593, out0 1132-1636, pass1 1132-1159,
    out1 1636-2140: the DMA engine never waits, the passes hide under it.
    One buffer: in0 0-566, pass0 566-593, out0 593-1097, in1 1097-1663 (the engine is busy, and
    pass0 must have read a0), pass1 1663-1690, out1 1690-2194: 54 cycles more."""
    assert _dsp_both(_db(True)) == (2140, 2140)
    assert _dsp_both(_db(False)) == (2194, 2194)


def test_dsp_multi_core_split_with_a_barrier():
    """Two cores load 4 KiB and 8 KiB of x from DDR at once, wait at a barrier, then run a
    27-cycle pass. Core 0: engine 566, DDR channel 300-473. Core 1: engine 300 + 200 + 128 + 2 =
    630, its 346 channel cycles (8192 / 23.72) queue behind core 0's: 473-819, so it ends at
    819 (not 630). The barrier holds both until 819: the passes run 819-846."""
    c0 = [_load(("DDR", "x"), 1024, 0, "a"), Op("barrier", "sync"), _fma_block(0, 4096, ("a",), ("o",))]
    c1 = [_load(("DDR", "x"), 2048, 1024, "a"), Op("barrier", "sync"), _fma_block(0, 4096, ("a",), ("o",))]
    assert _dsp_both(_prog([c0, c1], {"x": (3072,)})) == (846, 846)


def test_dsp_epilogue():
    """Bias + ReLU on one vector: loads of x and the bias at cycle 0 (ready 4), vadd on an FMAC
    at 4 (ready 10), vmax on the vector ALU at 10 (ready 12), the store at 12 (done 16), loop
    exit 7: 23."""
    op = _pass(vx.Nest(outer=(1,), post=(
        vx.VI("vld", "x", (vx.Mem("AM", 0, (0,)),)), vx.VI("vld", "b", (vx.Mem("AM", 32, (0,)),)),
        vx.VI("vadd", "y", ("x", "b")), vx.VI("vmax", "y", ("y", 0.0)), vx.VI("vst", vx.Mem("AM", 64, (0,)), ("y",)))),
        (), ("o",))
    assert op.cycles == 23
    assert _dsp_both(_prog([[op]], {"x": (4,)})) == (23, 23)


def _mk_pass(sig: tuple) -> Op:
    """A VPU pass of one register-blocked micro-kernel call, as a lowering emits it."""
    c = {"out": tm.mk_out, "ws": tm.mk_ws, "ew": tm.mk_ew}[sig[0]](DM, *sig[1:])
    return Op("vpu", "vpu", cycles=c.cycles, cost=c, fn=lambda mem: 1)


def test_dsp_register_block_call():
    """One output-stationary register block (`timing.mk_out`; the functional clock issues the
    same block itself) over 50 reduction steps. 1 pixel x 1 vector: each step loads a weight
    vector and broadcasts an input scalar (ready 4 after issue), the FMA into the one
    accumulator waits for the previous one (6): step i's FMA at 4 + 6i, the last ready at
    4 + 6 * 49 + 6 = 304; the store at 304 is done at 308; loop exit 7: 315.
    With bias + ReLU: the bias vector is loaded before the loop; after the last FMA the bias
    add (FMAC) at 304 ready 310, the max (vector ALU) ready 312, the store done 316: 323.
    2 pixels x 3 vectors: 3 weight loads take cycles 0, 0, 1 (two load/store slots), so the six
    FMAs of a step issue at 4, 4, 5, 4, 5, 5 (three FMACs) + 6i; the last ready at 305; the six
    stores take two a cycle from each accumulator's ready time: 304, 304, 305, 305, 306, 306,
    done 310: 317."""
    for sig, want in [(("out", 1, 1, 50, ()), 315), (("out", 1, 1, 50, ("bias", "relu")), 323),
                      (("out", 2, 3, 50, ()), 317)]:
        op = _mk_pass(sig)
        assert (op.cycles, DFC.call(sig)) == (want, want), sig
    assert _dsp_both(_prog([[_mk_pass(("out", 1, 1, 50, ()))]], {"x": (4,)})) == (315, 315)


def test_dsp_host_share():
    """The host's share of a copy-mode call: launch 650 us x 1.8 GHz = 1,170,000; a CPU <-> DSP
    copy costs 100 us (179,999: the product 179,999.99... truncated) + bytes at 1.4 GB/s /
    1.8 GHz = 0.7778 B/cycle: 5184 B in, int(179,999 + 6,665.14) = 186,664; 4096 B out,
    int(179,999 + 5,266.29) = 185,265. The device part here is one 566-cycle DMA."""
    m = dataclasses.replace(DM, data_mode="copy")
    pre, post = host_ops(m, [("x", 5184)], [("out", 4096)], [])
    assert [c for _, c, _ in pre + post] == [1170000, 186664, 185265]
    assert [DFC.host(w, b) for w, _, b in pre + post] == [1170000, 186664, 185265]
    prog = _prog([[_load(("DDR", "x"), 1024, 0, "a")]], {"x": (1024,)})
    prog.host_pre, prog.host_post = pre, post
    want = 566 + 1170000 + 186664 + 185265
    assert tm.timing(m, prog).cycles == dfc.replay(m, prog, [])[2].cycles == want
