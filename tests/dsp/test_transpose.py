"""dsp-sim transpose (`schedules/dsp/transpose.py`): strided DMA descriptors, DDR -> DDR or
gathered into AM and written out contiguously.

Values: functional mode (the DMA program executed on the simulated memories) against
np.transpose, exact. Cycles: single-descriptor cases counted by hand from the machine's DMA
figures (one engine-bound by its element-granular runs, one bound by the shared DDR channel),
the ShuffleNet channel shuffle within a few % of its DDR bytes / bandwidth, the functional
program timed to the timing program's cycles, and the knobs changing the cycles."""
from __future__ import annotations

import math

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.schedules.dsp.transpose import canonical
from opcompiler.target import load_target
from opcompiler.template import get_template

from dsp_lowering import program

TGT = load_target("dsp-sim")
M = machine(TGT)
BE = get_backend(TGT)
SHUFFLE = "dims=1x2x58x28x28,perm=02134"  # ShuffleNet's channel shuffle of 1x116x28x28 in 2 groups


def _run(shape: str, config=None):
    wl = workload("transpose", shape, dtype="float32")
    ins = get_op("transpose").make_inputs(wl, 0)
    kernel = BE.build(wl, config)
    res = BE.run(kernel, ins)
    return res.outputs[0], get_op("transpose").reference(wl, ins), res, kernel


def _dsp_cycles(shape: str, config=None) -> int:
    return BE.measure(BE.build(workload("transpose", shape, dtype="float32"), config)).metrics["dsp_cycles"]


CASES = [
    (SHUFFLE, None),
    ("dims=2x4x3x9x11,perm=02134", {"path": "am", "tile": 256, "dbuf": 1, "cores": 8}),  # shuffle, many tiles
    ("dims=2x8x13x17,perm=0231", None),  # NCHW -> NHWC: the innermost axis moves (runs of one element)
    ("dims=2x13x17x8,perm=0312", {"path": "am", "tile": 256, "dbuf": 0, "cores": 4}),  # NHWC -> NCHW
    ("dims=2x3x4x5,perm=3210", {"path": "ddr", "tile": 256, "dbuf": 1, "cores": 2}),
    ("dims=3x1x4x1x5,perm=42013", None),  # unit axes dropped
    ("dims=37x45,perm=10", {"path": "am", "tile": 256, "dbuf": 1, "cores": 1}),  # the output's last axis chunked
    ("dims=6x10,perm=01", None),  # identity: one contiguous copy
    ("dims=2x3x2x3x2x3x2x2,perm=75316420", {"path": "ddr", "tile": 256, "dbuf": 1, "cores": 8}),  # 8 axes
    ("dims=5x6x7x8,perm=2301", {"path": "am", "tile": 1024, "dbuf": 1, "cores": 8}),  # two merged pairs swap
]


@pytest.mark.parametrize("shape, cfg", CASES)
def test_transpose_matches_numpy(shape: str, cfg) -> None:
    out, ref, res, _ = _run(shape, cfg)
    np.testing.assert_array_equal(out, ref)
    assert res.cycles > res.metrics["dsp_cycles"] > 0
    fc, tc = res.metrics["functional_counters"], res.metrics["counters"]
    assert fc == tc
    # bytes_by_level counts a DDR -> DDR descriptor once per level; staged, DDR is read and written
    staged = (cfg or {}).get("path") == "am"
    assert fc["bytes_by_level"]["DDR"] == (1 + staged) * ref.size * 4
    assert fc["bytes_by_level"].get("AM", 0) == 2 * staged * ref.size * 4
    assert fc["fmas"] == fc["vldst"] == 0  # data movement only


def test_canonical_form() -> None:
    assert canonical((1, 2, 58, 28, 28), (0, 2, 1, 3, 4)) == ((2, 58, 784), (1, 0, 2))
    assert canonical((1, 64, 56, 56), (0, 2, 3, 1)) == ((64, 3136), (1, 0))
    assert canonical((2, 3, 4, 5), (2, 3, 0, 1)) == ((6, 20), (1, 0))
    assert canonical((2, 3, 4), (0, 1, 2)) == ((24,), (0,))
    assert canonical((1, 1), (1, 0)) == ((1,), (0,))


def test_single_descriptor_cycles_by_hand() -> None:
    """One tile on one core. Engine: start-up + DDR latency + bytes / port width + row_cycles
    per contiguous run; the DDR channel: the bytes read and written at the cluster's DDR
    bandwidth, from the end of the start-up; the transfer ends when both are done."""
    assert (M.dma_startup, M.ddr_latency, M.dma_bytes_per_cycle, M.dma_row_cycles) == (300, 200, 64, 2)
    assert M.ddr_bytes_per_cycle == pytest.approx(42.7 / 1.8)
    # 64x64 swap: 4096 runs of one element -> engine-bound: 300 + 200 + 16384/64 + 4096*2
    assert 300 + math.ceil(2 * 16384 / M.ddr_bytes_per_cycle) == 1682  # the DDR channel finishes earlier
    assert _dsp_cycles("dims=64x64,perm=10", {"path": "ddr", "tile": 4096, "dbuf": 1, "cores": 1}) == 8948
    # 2x64x128 -> 64x2x128: 128 runs of 128 elements -> DDR-bound: 300 + ceil(2 * 65536 B / 23.72 B/cycle)
    assert 300 + 200 + 65536 // 64 + 128 * 2 == 1780  # the engine finishes earlier
    cfg = {"path": "ddr", "tile": 16384, "dbuf": 1, "cores": 1}
    assert _dsp_cycles("dims=2x64x128,perm=102", cfg) == 300 + 5526 == 5826
    # staged through AM: gather DDR -> AM (DDR 2763 cycles), then AM -> DDR once it landed
    # (300 + 2763 after the gather's 3063)
    assert _dsp_cycles("dims=2x64x128,perm=102", dict(cfg, path="am")) == 3063 + 300 + 2763 == 6126


def test_channel_shuffle_runs_at_ddr_bandwidth() -> None:
    """1x116x28x28 in 2 groups: 116 runs of 784 elements; every byte read and written once over the
    shared DDR channel: within 5 % of bytes / bandwidth on 8 cores."""
    ddr = 2 * 116 * 28 * 28 * 4 / M.ddr_bytes_per_cycle
    cyc = _dsp_cycles(SHUFFLE)
    assert ddr <= cyc <= 1.05 * ddr, (cyc, ddr)
    # NCHW -> NHWC of 1x64x56x56: runs of one element, 8 cores still keep the DDR channel busy
    ddr = 2 * 64 * 56 * 56 * 4 / M.ddr_bytes_per_cycle
    cyc = _dsp_cycles("dims=1x64x56x56,perm=0231")
    assert ddr <= cyc <= 1.10 * ddr, (cyc, ddr)
    # ... but on one core its engine (2 cycles per run) is the bound
    one = _dsp_cycles("dims=1x64x56x56,perm=0231", {"path": "ddr", "tile": 16384, "dbuf": 1, "cores": 1})
    assert one >= 64 * 56 * 56 * M.dma_row_cycles


@pytest.mark.parametrize("shape", [SHUFFLE, "dims=2x8x13x17,perm=0231"])
def test_functional_program_times_like_the_timing_program(shape: str) -> None:
    wl = workload("transpose", shape, dtype="float32")
    kernel = BE.build(wl)
    fprog = program(get_template("elemwise", "dsp"), wl, TGT, kernel.config, True)
    assert timing(M, fprog).dsp_cycles == pytest.approx(BE.measure(kernel).metrics["dsp_cycles"], rel=0.03)


def test_knobs_change_the_cycles() -> None:
    """Fewer cores: slower. One in-order DMA queue per core, so double buffering only changes
    how the cores' transfers interleave on the shared DDR channel (and tile sizes the share)."""
    cfgs = [{"cores": 8}, {"cores": 1}, {"path": "am", "tile": 4096}, {"path": "am", "tile": 4096, "dbuf": 0}]
    cyc = [_dsp_cycles("dims=1x64x56x56,perm=0231", c) for c in cfgs]
    assert len(set(cyc)) == len(cyc), cyc
    assert cyc[1] > cyc[0] and cyc[3] > cyc[2]


def test_config_errors_name_the_level() -> None:
    with pytest.raises(OpcError, match="AM needs"):
        BE.build(workload("transpose", "dims=512x512,perm=10", dtype="float32"),
                 {"path": "am", "tile": 131072, "dbuf": 1, "cores": 8})
    with pytest.raises(OpcError, match="float32"):
        BE.build(workload("transpose", SHUFFLE, dtype="float16"))
