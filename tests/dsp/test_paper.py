"""dsp-sim against seed 004 (figures from the package's `opcompiler.calibration`)."""
import dataclasses
from types import MappingProxyType

import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.calibration import figure


def _figure(what_prefix: str) -> dict:
    return figure("ft_m7032", what_prefix, use="fit")  # calibration checks read fit figures only


@pytest.fixture(scope="module")
def t8():
    return load_target("dsp-sim")


def _measure(target, op, preset, batch, config="paper"):
    be = get_backend(target)
    return be.measure(be.build(workload(op, preset=preset, batch=batch), config))


@pytest.mark.parametrize("batch", [96, 768])
def test_paper_schedule_efficiency_on_conv3_res(t8, batch):
    """Table 2: 23.03 % of the 8-core peak at batch 96, 46.90 % at 768. Tolerance: 3 points."""
    pub = _figure(f"CONV3_RES forward, 8 DSP cores, batch {batch}")
    r = _measure(t8, "conv2d", "minigo.conv3_res", batch)
    assert r.metrics["percent_of_peak"] == pytest.approx(pub["percent_of_peak"], abs=3.0)
    if batch == 96:  # Table 3 time, same tolerance in relative terms (3 / 23 = 13 %)
        assert r.seconds * 1e3 == pytest.approx(pub["ms"], rel=0.13)


def test_efficiency_grows_with_batch_as_published(t8):
    lo = _measure(t8, "conv2d", "minigo.conv3_res", 96).metrics["percent_of_peak"]
    hi = _measure(t8, "conv2d", "minigo.conv3_res", 768).metrics["percent_of_peak"]
    pub_ratio = (_figure("CONV3_RES forward, 8 DSP cores, batch 768")["percent_of_peak"]
                 / _figure("CONV3_RES forward, 8 DSP cores, batch 96")["percent_of_peak"])
    assert hi / lo == pytest.approx(pub_ratio, rel=0.15)


def test_eight_cores_help_conv3_res_not_fc(t8):
    """§3.1.2: CONV3_RES gains most from 8 cores, the FC layers barely gain. The paper's 16-25x
    is superlinear (a different one-core baseline); the same kernel can give at most 8x, so we
    ask for a large DSP-side speedup on CONV3_RES and under 1.5x (whole call, where the fixed
    launch and data movement dominate) on the FC layers at the paper's batch of 96."""
    t1 = dataclasses.replace(t8, cores=1)
    for batch in (96, 768):
        r8, r1 = (_measure(t, "conv2d", "minigo.conv3_res", batch) for t in (t8, t1))
        assert r1.metrics["dsp_cycles"] / r8.metrics["dsp_cycles"] > 5.0
    assert _measure(t1, "conv2d", "minigo.conv3_res", 768).seconds / \
        _measure(t8, "conv2d", "minigo.conv3_res", 768).seconds > 4.5
    for fc in ("minigo.fc1", "minigo.fc2", "minigo.fc3"):
        s = _measure(t1, "matmul_bias_relu", fc, 96).seconds / _measure(t8, "matmul_bias_relu", fc, 96).seconds
        assert s < 1.5, fc


@pytest.mark.parametrize("preset,key", [("minigo.conv3_init", "conv3_init"), ("minigo.conv3_res", "conv3_res"),
                                        ("minigo.conv1_policy", "conv1_policy"), ("minigo.conv1_value", "conv1_value")])
def test_copy_mode_is_several_times_slower_for_convs(t8, preset, key):
    """Table 3: copy mode (explicit CPU<->DSP copies) is 2.5-17x slower than shared mode for the
    convolutions at batch 96; we require at least 2.5x, and CONV3_RES within 25 % of its 4.19x."""
    copy_t = dataclasses.replace(t8, extra=MappingProxyType({**t8.extra, "data_mode": "copy"}))
    shared = _measure(t8, "conv2d", preset, 96)
    copied = _measure(copy_t, "conv2d", preset, 96)
    assert copied.metrics["data_mode"] == "copy" and shared.metrics["data_mode"] == "shared"
    ratio = copied.seconds / shared.seconds
    assert ratio > 2.5
    if key == "conv3_res":
        pub = _figure("forward ms, copy mode")[key]
        assert ratio == pytest.approx(pub[0] / pub[1], rel=0.25)


@pytest.mark.parametrize("batch,min_gain", [(96, 1.5), (768, 1.6)])
def test_space_holds_schedules_beating_the_paper(t8, batch, min_gain):
    """Register blocks of 10 pixels x 2 vectors keep 20 chains in flight (the paper's pass keeps
    about 14 and re-reads partial sums); double buffering overlaps DMA with the VPU."""
    best = {"pw": 10, "kv": 2, "rows": 1, "order": "out", "dbuf": 1, "w_path": "gsm", "out_path": "ddr",
            "split": "items"}
    paper = _measure(t8, "conv2d", "minigo.conv3_res", batch)
    ours = _measure(t8, "conv2d", "minigo.conv3_res", batch, best)
    assert paper.seconds / ours.seconds > min_gain
    assert ours.metrics["fmac_utilization"] > paper.metrics["fmac_utilization"]


def test_shared_ddr_limits_multicore_speedup(t8):
    """HARDWARE.md: a bandwidth-blind model over-predicts multi-core speedup. CONV3_INIT (C=13,
    little reuse) is DDR-bound on 8 cores: its DSP-side speedup stays well under 8x (the paper
    measured 4.4x), and the same kernel with 100x the DDR bandwidth scales almost linearly."""
    wide = dataclasses.replace(t8, memories=tuple(dataclasses.replace(mm, bandwidth_gbps=mm.bandwidth_gbps * 100)
                                                  if mm.name == "DDR" else mm for mm in t8.memories))

    def speedup(t):
        one = dataclasses.replace(t, cores=1)
        return (_measure(one, "conv2d", "minigo.conv3_init", 768).metrics["dsp_cycles"]
                / _measure(t, "conv2d", "minigo.conv3_init", 768).metrics["dsp_cycles"])
    limited, blind = speedup(t8), speedup(wide)
    assert limited < 6.0 and blind > 7.0
    r = _measure(t8, "conv2d", "minigo.conv3_init", 768)
    # the DDR channel is the busiest resource of the DSP part (the paper schedule does not overlap
    # DMA with compute, so it is about half the time)
    ratios = r.metrics["busy_ratios"]
    assert ratios["DDR bandwidth"] == max(v for k, v in ratios.items() if k != "host (launch + copies)")
    assert ratios["DDR bandwidth"] * r.cycles / r.metrics["dsp_cycles"] > 0.45
