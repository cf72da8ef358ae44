"""conv2d's one route (groups 1): an implicit-GEMM s_tir schedule whose blocks
become Load3D / FRACTAL_Z loads / MMAD / UB epilogue instructions, compiled by LLVM, run once
to record the trace, then simulated. Correctness is checked against numpy (run_op's
reference, fp16 tolerance from opcompiler.verify)."""
from __future__ import annotations

import pytest

from opcompiler.api import run_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.verify import compare

TIR = {"double_buffer": 1, "block_dim": 4, "w_resident": 0}


def _cfg(mt: int, kt: int, nt: int, **kw) -> dict:
    return {**TIR, "m_tile": mt, "k_tile": kt, "n_tile": nt, **kw}


@pytest.mark.parametrize("op,shape,tiles", [
    ("conv2d", "n=2,c=16,h=9,w=9,k=32,r=3,s=3,stride=2,pad=1", (16, 32, 16)),  # stride 2, K padded to k_tile
    ("conv2d", "n=1,c=3,h=10,w=10,k=20,r=3,s=3,pad=1", (32, 16, 16)),  # C=3 and K=20 pad to 16 / 32
    ("conv2d", "n=1,c=13,h=11,w=11,k=16,r=3,s=3,pad=2,dilation=2", (64, 64, 16)),  # dilation 2, C=13
    ("conv2d", "n=1,c=16,h=8,w=8,k=16,r=1,s=1", (16, 16, 16)),  # 1x1, no padding block in the compute
    ("conv2d", "n=1,c=20,h=7,w=9,k=17,r=1,s=3,stride=2", (16, 32, 16)),  # 1x3 stride 2, no pad, C=20
    ("conv2d_bias_relu", "n=1,c=13,h=9,w=9,k=24,r=3,s=3,pad=1", (32, 32, 32)),
    ("conv2d_bn_relu", "n=2,c=16,h=8,w=8,k=32,r=3,s=3,pad=1,stride=2", (16, 64, 32)),
    ("conv2d_bn", "n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1", (16, 16, 16)),
])
def test_tir_conv_matches_numpy(op, shape, tiles):
    rep = run_op(op, "ascend-sim", shape=shape, dtype="float16", config=_cfg(*tiles))
    assert rep["correct"], rep["max_abs_err"]
    assert rep["lowering"].startswith("TVM s_tir schedule (implicit GEMM)")


def test_tir_conv_trace_is_the_schedules_loop_nest(backend):
    """n=2, 9x9 -> 5x5 (stride 2), C=16, K=32: M = 25 pixels per image in 16-pixel
    tiles -> 2 pixel tiles per image (pad_einsum pads 25 to 32) and 2 n tiles
    -> 8 output tiles (2 images x 2 x 2); K = 16*3*3 = 144 in 32-deep steps -> 5 steps, the last one holding one
    real fractal (K padded to 160 is zero on both operands and not issued)."""
    from opcompiler.backend.ascend.program import DataMove, Load3D, Mmad

    wl = workload("conv2d", "n=2,c=16,h=9,w=9,k=32,r=3,s=3,stride=2,pad=1", dtype="float16")
    kern = backend.build(wl, _cfg(16, 32, 16))
    plan = kern.artifact.plan
    assert plan.info["tir_tiles"] == 2 * 2 * 2
    progs = [plan.make_program(c) for c in range(plan.active_cores)]
    mmads = [i for p in progs for i in p.instrs if isinstance(i, Mmad)]
    assert len(mmads) == 8 * 5 and sum(i.init for i in mmads) == 8
    assert sorted({i.k1 for i in mmads}) == [1, 2]  # 144 = 4 steps of 2 fractals + 1
    l3d = [i for p in progs for i in p.instrs if isinstance(i, Load3D)]
    assert len(l3d) == 40 and {(i.geom.stride, i.geom.pad_top) for i in l3d} == {(2, 1)}
    outs = [i for p in progs for i in p.instrs if isinstance(i, DataMove) and i.path == ("UB", "GM")]
    assert len(outs) == 8
    fun = backend.run(kern, get_op("conv2d").make_inputs(wl))
    assert fun.cycles == backend.measure(kern).cycles  # functional and timing modes agree


@pytest.mark.parametrize("op,kw,tiles,retired", [
    ("conv2d", {"preset": "resnet50.res2_3x3", "batch": 1}, (128, 64, 64), 4774),
    ("conv2d", {"shape": "n=1,c=64,h=14,w=14,k=64,r=3,s=3,pad=1"}, (64, 64, 64), 4314),
])
def test_tir_cycles_match_the_retired_direct_path_for_the_same_tiles(pinned_backend, op, kw, tiles, retired):
    """When the tiles fit L0 whole and divide the shape, the TIR schedule issues the
    instructions the retired TIK-style template did (its cycles measured at d3ba5e6)."""
    wl = workload(op, dtype="float16", **kw)
    base = {"double_buffer": 1, "block_dim": 32, "w_resident": 0, "m_tile": tiles[0], "k_tile": tiles[1],
            "n_tile": tiles[2]}
    assert pinned_backend.measure(pinned_backend.build(wl, base)).cycles == retired  # conftest.PINNED_FIGURES


def test_a_corrupted_instruction_offset_gives_a_wrong_result(backend):
    """The simulator runs the lowered program: point one img2col (Load3D) of the recorded trace
    at the previous k step's taps and the output is wrong; point one at another pixel tile and
    the builder refuses it (its input rows are not in L1)."""
    import opcompiler.backend.ascend.lower.cube as tl
    from opcompiler.errors import OpcFailure

    wl = workload("conv2d", "n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1", dtype="float16")
    cfg = _cfg(16, 32, 16)
    inputs = get_op("conv2d").make_inputs(wl)
    ref = get_op("conv2d").reference(wl, inputs)
    good = backend.run(backend.build(wl, cfg), inputs)
    assert compare(good.outputs[0], ref)[0]
    key = next(k for k in tl.TRACES if k[:3] == ("ascend.conv2d", "conv2d", "float16") and k[4:7] == (16, 32, 16)
               and ("h", 8) in k[3] and ("k", 16) in k[3])
    orig = tl.TRACES[key]
    k1 = next(n for n, ev in enumerate(orig) if ev[0] == "load3d" and ev[3] == 32)
    a = next(n for n, ev in enumerate(orig) if ev[0] == "load3d" and ev[2] == 16)
    try:
        tl.TRACES[key] = orig[:k1] + [orig[k1][:3] + (0,)] + orig[k1 + 1:]
        bad = backend.run(backend.build(wl, cfg), inputs)
        assert not compare(bad.outputs[0], ref)[0]
        tl.TRACES[key] = orig[:a] + [("load3d", orig[a][1], 48, orig[a][3])] + orig[a + 1:]
        with pytest.raises(OpcFailure, match="load3d needs input rows"):
            backend.run(backend.build(wl, cfg), inputs)
    finally:
        tl.TRACES[key] = orig


@pytest.mark.parametrize("op,shape,tiles", [
    ("conv2d", "n=2,c=40,h=9,w=9,k=48,r=3,s=3,pad=1,stride=2", (32, 128, 32)),  # C0 = 32: C=40 pads to 64
    ("conv2d_bias_relu", "n=1,c=64,h=12,w=12,k=40,r=3,s=3,pad=1", (128, 256, 64)),
])
def test_tir_int8_conv_matches_numpy(op, shape, tiles):
    """int8: NC1HWC0 with C0 = 32, 16x32 fractals, int32 accumulation, bias and ReLU in int32."""
    rep = run_op(op, "ascend-sim", shape=shape, dtype="int8", config=_cfg(*tiles))
    assert rep["correct"], rep["max_abs_err"]
    assert rep["lowering"].startswith("TVM s_tir schedule (implicit GEMM)")


def test_grouped_conv_takes_the_tir_route_and_the_lowering_knob_is_retired():
    """Grouped convolution is a TIR schedule too (one cube GEMM per image and group); the
    `lowering` knob itself is retired (a one-line unknown-knob error)."""
    rep = run_op("conv2d", "ascend-sim", shape="n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1,groups=2", dtype="float16",
                 config=_cfg(16, 16, 16))
    assert rep["correct"] and rep["lowering"].startswith("TVM s_tir")
    with pytest.raises(OpcError, match="unknown knob 'lowering'"):
        run_op("conv2d", "ascend-sim", shape="n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1", dtype="float16",
               config={"lowering": "tir"})


def test_check_agrees_with_what_the_tir_path_allocates(backend):
    """check() is the tuner's filter: a TIR config it accepts builds; one it rejects (not one K
    fractal of a 2048-pixel tile fits half of L0A: 64 KiB > 32 KiB per ping-pong slot) fails
    allocation the same way."""
    from opcompiler.errors import CapacityError
    from opcompiler.target import load_target
    from opcompiler.template import get_template

    target = load_target("ascend-sim")
    tmpl = get_template("conv2d", "ascend")
    wl = workload("conv2d_bias_relu", preset="resnet50.res2_3x3", batch=1, dtype="float16")
    ok = tmpl.config(wl, target, _cfg(256, 128, 64, block_dim=32))  # L0 chunks of 64 K per slot
    assert tmpl.check(wl, target, ok) is None
    assert backend.measure(backend.build(wl, ok)).cycles > 0
    big = tmpl.config(wl, target, _cfg(2048, 128, 64, block_dim=32))
    assert "L0A" in tmpl.check(wl, target, big)
    with pytest.raises(CapacityError, match="L0A"):
        backend.build(wl, big)
