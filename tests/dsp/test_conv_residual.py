"""The residual epilogue of dsp-sim's direct convolution (issue 27: TBE's conv + eltwise fusion):
conv2d_bias_add, conv2d_bias_add_relu and conv2d_bn_add_relu. The residual's tile is DMAed
DDR -> AM with each stage's input rows (double-buffered with them), counted in the capacity
check, and added in the epilogue after bias / BN and before ReLU (`core._epi_instrs`: one vector
load and one FMAC add per accumulator; in order=ws, one more input of the element-wise call).

Values: functional mode against the op's numpy reference. Cycles: the functional replay's own
clock equals the timing model on the same per-core program, and the functional run issues what
the timing program counts; the fused kernel against its parts run as separate kernels."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.verify import compare

from dsp_lowering import program

TGT = load_target("dsp-sim")
M = machine(TGT)
BE = get_backend(TGT)
TMPL = get_template("conv2d", "dsp")
WS = {"order": "ws", "pw": 1, "dbuf": 0, "w_path": "host_copies", "out_path": "gsm", "split": "batch"}

CASES = [
    # stride 2, odd C, K tail (40 = 32 + 8), column tiles of 4 with a tail, a row tail
    ("conv2d_bias_add", "n=2,c=5,h=9,w=13,k=40,r=3,s=3,stride=2,pad=1,layout=NHWC",
     {"rows": 2, "cols": 4, "pw": 3, "kv": 1}),
    ("conv2d_bias_add", "n=2,c=6,h=7,w=7,k=20,r=3,s=3,pad=1,layout=NCHW", None),  # the residual relaid to NHWC
    ("conv2d_bias_add_relu", "n=2,c=5,h=8,w=8,k=36,r=3,s=3,pad=1,layout=NCHW",
     {"rows": 3, "pw": 5, "kv": 2, "split": "batch", "dbuf": 0}),
    ("conv2d_bias_add_relu", "n=3,c=7,h=8,w=8,k=70,r=3,s=3,pad=1,layout=NHWC", None),
    ("conv2d_bias_add_relu", "n=1,c=8,h=9,w=9,k=64,r=1,s=1,stride=2,pad=0,layout=NHWC", {"w_path": "gsm"}),
    ("conv2d_bn_add_relu", "n=2,c=3,h=7,w=11,k=33,r=3,s=3,pad=1,layout=NHWC", {"rows": 1, "pw": 4, "kv": 1}),
    ("conv2d_bn_add_relu", "n=2,c=5,h=9,w=9,k=36,r=3,s=3,stride=2,pad=1,layout=NCHW", {"out_path": "gsm"}),
    # the paper's weight-stationary pass: the residual is an input of the element-wise epilogue call
    ("conv2d_bn_add_relu", "n=3,c=13,h=9,w=9,k=64,r=3,s=3,pad=1,layout=NHWC", {**WS, "rows": 4}),
    ("conv2d_bias_add", "n=2,c=5,h=9,w=11,k=40,r=3,s=3,stride=2,pad=1,layout=NCHW",
     {"order": "ws", "rows": 2, "cols": 4, "w_path": "gsm"}),
]


@pytest.mark.parametrize("op, shape, cfg", CASES)
def test_residual_epilogue_matches_numpy_and_both_clocks_agree(op: str, shape: str, cfg) -> None:
    wl = workload(op, shape, dtype="float32")
    k = BE.build(wl, cfg)
    assert k.info["lowering"] == "tir"
    d = get_op(op)
    xs = d.make_inputs(wl, 3)
    res = BE.run(k, xs)
    ok, why = compare(res.outputs[0], d.reference(wl, xs))
    assert ok, why
    # the functional run issues exactly what the timing program counts
    assert res.metrics["functional_counters"] == res.metrics["counters"]
    assert res.cycles == BE.measure(k).cycles
    # the functional replay's clock equals the timing model on the same per-core program; the
    # timing program's core groups put the reported figure within a few % of it
    fprog = program(TMPL, wl, TGT, k.config, True)
    assert timing(M, fprog).cycles == res.metrics["functional_cycles"]
    assert res.metrics["functional_cycles"] == pytest.approx(res.metrics["timing_cycles"], rel=0.03)


def test_the_residual_is_read_tile_by_tile_and_costs_its_epilogue() -> None:
    """Against conv2d_bias_relu with the same config: the residual's bytes once more through DDR
    into AM, one DMA per stage more, and per output vector one more AM load and one more FMAC."""
    shape = "n=2,c=8,h=10,w=10,k=64,r=3,s=3,pad=1,layout=NHWC"
    cfg = {"rows": 2, "cols": 10, "pw": 5, "kv": 2, "dbuf": 1, "w_path": "ddr", "out_path": "ddr", "split": "items",
           "order": "out"}
    base = BE.measure(BE.build(workload("conv2d_bias_relu", shape, dtype="float32"), cfg)).metrics
    res = BE.measure(BE.build(workload("conv2d_bias_add_relu", shape, dtype="float32"), cfg)).metrics
    b, r = base["counters"], res["counters"]
    out_bytes = 2 * 10 * 10 * 64 * 4
    stages = 2 * 5  # (image, 2-row block) items
    vectors = 2 * 10 * 10 * 2  # output pixels x 32-lane vectors
    assert r["bytes_by_level"]["DDR"] - b["bytes_by_level"]["DDR"] == out_bytes
    assert r["bytes_by_level"]["AM"] - b["bytes_by_level"]["AM"] == out_bytes
    assert r["dma_transfers"] - b["dma_transfers"] == stages
    assert r["vldst"] - b["vldst"] == vectors and r["fmas"] - b["fmas"] == vectors
    assert (r["slds"], r["valu"], r["mk_calls"]) == (b["slds"], b["valu"], b["mk_calls"])
    assert res["dsp_cycles"] > base["dsp_cycles"]


def test_the_residual_tile_is_counted_in_the_capacity_check() -> None:
    """The residual's AM tile (double-buffered like the output tile) is in `check`: a tiling that
    fits conv2d_bias_relu in AM can be refused for conv2d_bias_add_relu, with the AM figure."""
    shape = "n=1,c=4,h=56,w=56,k=128,r=1,s=1,pad=0,layout=NHWC"
    plain = workload("conv2d_bias_relu", shape, dtype="float32")
    fused = workload("conv2d_bias_add_relu", shape, dtype="float32")
    cfg = {"pw": 4, "kv": 4, "rows": 12, "cols": 56, "order": "out", "dbuf": 1, "w_path": "gsm", "out_path": "ddr",
           "split": "items"}
    from opcompiler.schedules.dsp.direct import DirectConfig, footprint
    tile = 2 * 12 * 56 * 128 * 4  # two buffers of 12 rows x 56 columns x 128 channels, fp32
    fp_plain = footprint(M, TMPL.spec(plain, TGT), DirectConfig.of(cfg))
    fp_fused = footprint(M, TMPL.spec(fused, TGT), DirectConfig.of(cfg))
    assert fp_fused["AM"] - fp_plain["AM"] == tile
    assert fp_fused["REG"] == fp_plain["REG"]
    assert TMPL.check(plain, TGT, cfg) is None
    why = TMPL.check(fused, TGT, cfg)
    assert why is not None and why.startswith("AM needs")
    with pytest.raises(OpcError):
        BE.build(fused, cfg)
    assert TMPL.check(fused, TGT, TMPL.default(fused, TGT)) is None  # the default fits


def test_fused_kernel_beats_its_parts_on_a_resnet_block_end() -> None:
    """ResNet-18's res2 block end (3x3, 64 -> 64, 56x56, NHWC): conv2d_bias_add_relu in one kernel
    against conv2d, bias_add, add and relu as four (template defaults, DSP cycles without the
    host's launch, which would add one more launch per part)."""
    shape = "n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1,layout=NHWC"
    wl = workload("conv2d_bias_add_relu", shape, dtype="float32")

    def cycles(w) -> int:
        return BE.measure(BE.build(w, None)).metrics["dsp_cycles"]
    fused = cycles(wl)
    parts = [cycles(workload(s.op, dict(s.params), dtype="float32")) for s in get_op(wl.op).unfused(wl)]
    assert len(parts) == 4
    assert fused < sum(parts)
    assert fused < parts[0] + parts[2]  # even the conv and the add alone take longer
    print(f"fused {fused} vs parts {parts} = {sum(parts)} ({sum(parts) / fused:.2f}x)")


def test_grouped_convolution_refuses_the_residual_with_a_reason() -> None:
    """The grouped template has no residual epilogue: a clear refusal, which the graph
    partitioner turns into conv2d_bias(_relu) + add(_relu) (`partition.settle`)."""
    with pytest.raises(OpcError, match="grouped"):
        BE.build(workload("conv2d_bias_add_relu", "n=1,c=8,h=8,w=8,k=8,groups=4,pad=1", dtype="float32"))


def test_values_with_a_large_residual_are_added_before_relu() -> None:
    """A residual of -1e3 everywhere drives every output below zero before ReLU: all zeros; of
    +1e3: the conv + bias + 1e3 (ReLU after the add, not before)."""
    wl = workload("conv2d_bias_add_relu", "n=1,c=4,h=6,w=6,k=32,r=3,s=3,pad=1,layout=NHWC", dtype="float32")
    k = BE.build(wl, None)
    xs = get_op(wl.op).make_inputs(wl, 1)
    xs[3] = np.full_like(xs[3], -1e3)
    assert not BE.run(k, xs).outputs[0].any()
    xs[3] = np.full_like(xs[3], 1e3)
    out = BE.run(k, xs).outputs[0]
    np.testing.assert_allclose(out, get_op(wl.op).reference(wl, xs), rtol=1e-6)
    assert out.min() > 900
