"""The simulator against the published Ascend 910 behaviour (seed 000), read from the
repository's opcompiler/calibration/published.json (fixture `published`). Tolerances are stated
beside each assertion; the simulator has never seen a real chip, so trends are asserted tightly
and levels loosely."""
from __future__ import annotations

import pytest

from opcompiler.ops import get_op, workload

from .conftest import measure

FIG14 = "matmul tile sweep A[16,256] x B[256,1024], Algorithm Y"
K_TILES = (16, 32, 64, 128, 256)
N_TILES = (16, 32, 64, 128, 256, 512, 1024)


@pytest.fixture(scope="module")
def fig14(backend):
    """Algorithm Y as the seed ran it: one core, no double buffering, m_tile 16."""
    wl = workload("matmul", preset="seed.matmul_16x256x1024", dtype="float16")
    out = {}
    for kt in K_TILES:
        for nt in N_TILES:
            cfg = {"m_tile": 16, "k_tile": kt, "n_tile": nt, "double_buffer": 0, "block_dim": 1}
            out[kt, nt] = backend.measure(backend.build(wl, cfg)).cycles
    return out


def test_fig14_time_falls_as_tiles_grow(fig14, published):
    assert "time falls" in published[FIG14]["trend"]
    # below the knee every doubling of k_tile or n_tile saves at least 10 % of the time
    for kt in (16, 32, 64):
        for nt in (16, 32, 64, 128):
            assert fig14[kt, 2 * nt] < 0.9 * fig14[kt, nt]
            assert fig14[2 * kt, nt] < 0.9 * fig14[kt, nt]
    assert fig14[16, 16] > 10 * min(fig14.values())


def test_fig14_no_gain_past_the_knee(fig14, published):
    """'no further gain once k_tile > 64 and n_tile > 256': past the knee every point is within
    10 % of the best of the whole sweep (bigger tiles need more inner L0 loops)."""
    assert "k_tile > 64" in published[FIG14]["trend"] and "n_tile > 256" in published[FIG14]["trend"]
    best = min(fig14.values())
    past = [fig14[kt, nt] for kt in K_TILES if kt > 64 for nt in N_TILES if nt > 256]
    assert max(past) <= 1.10 * best
    assert min(past) >= 0.95 * best or min(past) == best


@pytest.mark.parametrize("what,op,shape,configs", [
    ("best fully-connected throughput", "matmul", "m=2048,k=2048,n=2048",
     [None, {"k_tile": 256}, {"m_tile": 128, "n_tile": 256}]),
    ("best conv2d throughput", "conv2d", "n=128,c=256,h=28,w=28,k=256,r=3,s=3,pad=1",
     [None, {"m_tile": 512, "n_tile": 128}]),
])
def test_large_kernels_reach_published_share_of_peak(backend, published, what, op, shape, configs):
    """Best of a few configs lands within [-8, +8] points of the published % of peak (82 / 84.7)."""
    target = published[what]["percent_of_peak"]
    best = max(measure(backend, op, shape, config=c).metrics["percent_of_peak"] for c in configs)
    assert target - 8 <= best <= target + 8, best


@pytest.mark.parametrize("op,shape", [("matmul", "m=16,k=1024,n=1024"), ("matmul", "m=32,k=4096,n=4096"),
                                      ("conv2d", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1"),
                                      ("conv2d", "n=1,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3")])
def test_small_or_thin_kernels_reach_far_less(backend, op, shape):
    """Thin (RNN-like) matmuls are memory bound, batch-1 convs leave cores idle: under 25 %."""
    res = measure(backend, op, shape)
    assert res.metrics["percent_of_peak"] < 25


def test_batchnorm_fp32_runs_at_half_the_fp16_throughput(backend, published):
    """Table 6: fp32/fp16 = 0.498 for the network; 'the BN kernel alone should show at least
    this gap'. ResNet-50 res2-sized BN at batch 32: ratio within [0.40, 0.60]."""
    row = published["ResNet-50 with BatchNorm in fp32 vs fp16"]
    shape = "n=32,c=256,h=56,w=56"
    c16 = measure(backend, "batch_norm", shape, dtype="float16").cycles
    c32 = measure(backend, "batch_norm", shape, dtype="float32").cycles
    ratio = c16 / c32
    assert abs(ratio - row["ratio"]) <= 0.10, ratio


@pytest.mark.parametrize("preset,batch", [("resnet50.res2_3x3", 1), ("resnet50.res3_3x3", 8)])
def test_fused_conv_bn_relu_beats_the_unfused_sequence(backend, preset, batch):
    """§6.1: unfused sends the conv result out of the core and back; fused keeps it in UB."""
    wl = workload("conv2d_bn_relu", preset=preset, batch=batch, dtype="float16")
    fused = backend.measure(backend.build(wl))
    steps = [backend.measure(backend.build(workload(s.op, dict(s.params), dtype="float16")))
             for s in get_op(wl.op).unfused(wl)]
    assert [s.op for s in get_op(wl.op).unfused(wl)] == ["conv2d", "batch_norm", "relu"]
    un_bytes = sum(s.metrics["gm_bytes"] for s in steps)
    un_cycles = sum(s.cycles for s in steps)
    out_bytes = 2 * batch * 64 * 56 * 56 if preset.endswith("res2_3x3") else 2 * batch * 128 * 28 * 28
    # the unfused sequence moves the conv result out and back twice more (BN, ReLU): >= 3.5x its size extra
    assert un_bytes - fused.metrics["gm_bytes"] >= 3.5 * out_bytes
    assert fused.cycles < 0.85 * un_cycles


def test_percent_of_peak_rises_with_batch_and_width(backend):
    """Fig. 8: throughput grows with batch size and layer width (strictly, at each step)."""
    by_batch = [measure(backend, "conv2d", preset="resnet50.res3_3x3", batch=b).metrics["percent_of_peak"]
                for b in (1, 2, 8, 32)]
    assert by_batch == sorted(by_batch) and by_batch[-1] > 3 * by_batch[0]
    by_width = [measure(backend, "conv2d", f"n=8,c={c},h=28,w=28,k={c},r=3,s=3,pad=1").metrics["percent_of_peak"]
                for c in (16, 32, 64, 128, 256)]
    assert by_width == sorted(by_width) and by_width[-1] > 3 * by_width[0]
    by_fc = [measure(backend, "matmul", f"m={m},k=1024,n=1024").metrics["percent_of_peak"] for m in (16, 64, 256, 1024)]
    assert by_fc == sorted(by_fc)
