"""conv2d_bias_hardswish on dsp-sim: the HardSwish step (`opcompiler.ops.steps`: x * (clip(x + 3, 0, 6)
* 1/6)) lowered in the direct convolution's epilogue (groups=1: `schedules/dsp/direct.py`, costed by
`timing.mk_out` / `mk_ew` and their twins in `fclock`) and the grouped / depthwise convolution's
(`schedules/dsp/grouped.py` -> `lower/gconv.py`: vector instructions on the accumulators, the clip
chain in one temporary register). Values against the op's numpy reference; cycles against
conv2d_bias_relu's on the same shape and config, by hand where the model makes it computable."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp import execute as ex, fclock, timing as tm
from opcompiler.backend.dsp.lower import lower as dsp_lower
from opcompiler.backend.dsp.machine import machine
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

DT = load_target("dsp-sim")
DSP = get_backend(DT)
DM = machine(DT)
# fp32 tolerance: the kernel and numpy sum the C/groups*R*S <= 216 products of a conv output in
# different orders (outputs of magnitude ~10: a few ulp each); HardSwish itself is the reference's
# operations in its order (x + 3, min 6, max 0, * float32(1/6), * x)
ATOL = 1e-4

SHAPES = [
    "n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1",  # groups=1: the direct convolution, NCHW relaid by DMA
    "n=1,c=16,h=14,w=14,k=16,r=3,s=3,pad=1,groups=16",  # depthwise (groups = c = k)
    "n=2,c=24,h=15,w=13,k=40,r=3,s=3,pad=2,stride=2,layout=NHWC",  # strided, padded, ragged tiles, kv=2
    "n=1,c=8,h=9,w=11,k=16,r=3,s=3,pad=2,stride=2,groups=4",  # grouped (4 groups of 2), strided, padded
]
WS = {"pw": 1, "kv": 1, "rows": 2, "cols": 8, "order": "ws", "dbuf": 1, "w_path": "gsm", "out_path": "ddr",
      "split": "items"}  # seed 004's weight-stationary order: the epilogue is its own pass (`mk_ew`)


def _run(op: str, shape: str, config=None):
    """(workload, timing-mode kernel, functional program, inputs, output, counters, functional clock's
    Timing, the timing model's Timing of the same program, the vector kernels the run executed)."""
    wl = workload(op, shape, dtype="float32")
    k = DSP.build(wl, config)
    fprog = dsp_lower(get_template("conv2d", "dsp").apply(wl, DT, k.config), DT, True)
    inputs = get_op(op).make_inputs(wl)
    kernels: list = []
    ex.OBSERVERS.append(kernels.append)
    try:
        out, counters, fun = fclock.replay(DM, fprog, inputs)
    finally:
        ex.OBSERVERS.remove(kernels.append)
    return wl, k, inputs, out, counters, fun, tm.timing(DM, fprog), kernels


@pytest.mark.parametrize("shape,config", [(s, None) for s in SHAPES] + [(SHAPES[0], WS)])
def test_values_match_the_reference(shape, config):
    wl, k, inputs, out, _, fun, tim, _ = _run("conv2d_bias_hardswish", shape, config)
    ref = get_op("conv2d_bias_hardswish").reference(wl, inputs)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert np.abs(out.astype(np.float64) - ref).max() <= ATOL
    # every regime of HardSwish is exercised: 0 (x <= -3), the curve (-3 < x < 3, negative outputs
    # among them), the identity (x >= 3)
    assert (ref == 0).any() and (ref < 0).any() and (ref > 3).any()
    assert fun.cycles == tim.cycles  # the two clocks on the same per-core program


def test_direct_conv_pays_exactly_the_extra_chain_latency():
    """One image, one stage (rows x cols = the whole 8 x 8 output), one buffer, register blocks of one
    pixel x one vector of 16 channels: the stage's VPU pass is 64 `mk_out` calls, each ending in its
    epilogue on one accumulator, a chain of dependent instructions after the last FMA. ReLU's is
    bias (FMAC) -> vmax (ALU) -> store; HardSwish's is bias -> vadd 3 (FMAC) -> vmin 6 -> vmax 0
    (ALU) -> vmul 1/6 -> vmul x (FMAC) -> store: 3 FMAC latencies and 1 vector-ALU latency more.
    The pass sits between its input's and its output's DMA, so the kernel is slower by exactly
    64 x (3 * 6 + 2) = 1280 cycles, on the timing model and on the functional clock."""
    cfg = {"pw": 1, "kv": 1, "rows": 8, "cols": 8, "order": "out", "dbuf": 0, "w_path": "gsm", "out_path": "ddr",
           "split": "items"}
    shape = "n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1,layout=NHWC"
    got = {op: _run(op, shape, cfg) for op in ("conv2d_bias_relu", "conv2d_bias_hardswish")}
    (_, kr, _, _, cr, fr, tr, _), (_, kh, _, _, ch, fh, th, _) = got.values()
    fc = fclock.clock(DT)
    assert (DM.fmac_latency, DM.valu_latency) == (fc.latency["fmac"], fc.latency["valu"]) == (6, 2)  # the target's
    blocks = 8 * 8  # output pixels x one vector of channels
    per = 3 * DM.fmac_latency + DM.valu_latency
    assert per == 20
    # one micro-kernel call, both clocks
    steps = 16 * 3 * 3
    hs, relu = tm.mk_out(DM, 1, 1, steps, ("bias", "hswish")), tm.mk_out(DM, 1, 1, steps, ("bias", "relu"))
    assert hs.cycles - relu.cycles == per == fc.call(hs.calls[0]) - fc.call(relu.calls[0])
    # the kernel: VPU busy and end-to-end, timing model (functional program and timing program) and
    # functional clock alike
    assert th.busy["vpu"] - tr.busy["vpu"] == fh.busy["vpu"] - fr.busy["vpu"] == blocks * per
    assert th.cycles - tr.cycles == fh.cycles - fr.cycles == blocks * per
    assert DSP.measure(kh).cycles - DSP.measure(kr).cycles == blocks * per
    # the work issued: per output vector 3 more FMAC instructions (vadd, vmul, vmul) and 2 vector-ALU
    # ones (vmin, vmax) instead of ReLU's 1
    assert (ch.fmas - cr.fmas, ch.valu - cr.valu, ch.vldst - cr.vldst) == (3 * blocks, blocks, 0)


def test_weight_stationary_epilogue_pass():
    """order=ws: the epilogue is one `mk_ew` pass over the tile; HardSwish's chain adds a temporary
    register per vector (the pass's register window) and is costed alike by both clocks."""
    hs = tm.mk_ew(DM, 16, 1, 1, 0, 1, 1)
    relu = tm.mk_ew(DM, 16, 1, 1, 1, 1)
    assert relu.calls == (("ew", 16, 1, 1, 1, 1),)  # ReLU's call signature is as it was
    assert hs.calls == (("ew", 16, 1, 1, 0, 1, 1),)
    fc = fclock.clock(DT)
    assert fc.call(hs.calls[0]) == hs.cycles > relu.cycles == fc.call(relu.calls[0])
    assert (hs.fmas - relu.fmas, hs.valu - relu.valu) == (3 * 16, 16)


def test_grouped_conv_emits_the_hardswish_instructions():
    """Depthwise, one core, one buffer (every stage's VPU pass on the critical path): the nest's
    epilogue per accumulator is vadd bias, then vadd tmp <- acc + 3, vmin tmp 6, vmax tmp 0,
    vmul tmp 1/6, vmul acc <- acc * tmp (ReLU's: vadd bias, vmax acc 0), then the store; the
    kernel is slower by exactly its VPU passes' extra cycles, on both clocks."""
    cfg = {"planes": 1, "rows": 14, "rb": 4, "w_path": "resident", "dbuf": 0, "cores": 1}
    shape = "n=1,c=16,h=14,w=14,k=16,r=3,s=3,pad=1,groups=16"
    got = {op: _run(op, shape, cfg) for op in ("conv2d_bias_relu", "conv2d_bias_hardswish")}
    (_, kr, _, _, cr, fr, tr, kern_r), (_, kh, _, _, ch, fh, th, kern_h) = got.values()

    def epilogue(kernels) -> list[tuple]:  # the first accumulator's instructions, up to its store
        post = next(k for k in kernels if k.label == "grouped conv").nests[0].post
        ins = [(i.op, i.dst, i.srcs) for i in post if i.op != "sld"]
        return ins[:[i[0] for i in ins].index("vst")]

    assert epilogue(kern_r) == [("vadd", "acc0", ("acc0", "p0")), ("vmax", "acc0", ("acc0", 0.0))]
    assert epilogue(kern_h) == [("vadd", "acc0", ("acc0", "p0")), ("vadd", "tmp", ("acc0", 3.0)),
                                ("vmin", "tmp", ("tmp", 6.0)), ("vmax", "tmp", ("tmp", 0.0)),
                                ("vmul", "tmp", ("tmp", pytest.approx(1 / 6))), ("vmul", "acc0", ("acc0", "tmp"))]
    vectors = 16 * 14  # channels x rows x one vector of 14 columns
    assert (ch.fmas - cr.fmas, ch.valu - cr.valu, ch.vldst - cr.vldst) == (3 * vectors, vectors, 0)
    extra = th.busy["vpu"] - tr.busy["vpu"]
    assert extra > 0 and extra == fh.busy["vpu"] - fr.busy["vpu"]
    assert th.cycles - tr.cycles == fh.cycles - fr.cycles == extra
    assert fh.cycles == th.cycles and DSP.measure(kh).cycles - DSP.measure(kr).cycles == extra


def test_capacity_counts_the_temporary_register():
    """The grouped convolution's register block holds rb accumulators, the R x S weights, 4 input
    vectors in flight, the bias and, with HardSwish, its temporary: 4 + 55 + 4 + 1 = 64 registers fit
    ReLU's block exactly, HardSwish's needs 65. The direct convolution's epilogue takes its temporary
    from the registers the loop's weights and inputs free (its count is unchanged)."""
    from opcompiler.schedules.dsp.direct import DirectConfig, footprint

    tmpl = get_template("conv2d", "dsp")
    shape = "n=1,c=4,h=12,w=16,k=4,r=5,s=11,pad=2,groups=4"
    cfg = {"planes": 1, "rows": 4, "rb": 4, "w_path": "resident", "dbuf": 0, "cores": 8}
    assert DM.registers == 64
    assert tmpl.check(workload("conv2d_bias_relu", shape, dtype="float32"), DT, cfg) is None
    why = tmpl.check(workload("conv2d_bias_hardswish", shape, dtype="float32"), DT, cfg)
    assert why is not None and "65 vector registers > 64" in why
    sp = {op: tmpl.spec(workload(op, "n=1,c=16,h=8,w=8,k=16", dtype="float32"), DT)
          for op in ("conv2d_bias_relu", "conv2d_bias_hardswish")}
    cf = DirectConfig.of({"pw": 10, "kv": 1, "rows": 1, "cols": 8, "order": "out", "dbuf": 1, "w_path": "gsm",
                          "out_path": "ddr", "split": "items"})
    assert sp["conv2d_bias_hardswish"].epi == ("bias", "hswish")
    assert footprint(DM, sp["conv2d_bias_hardswish"], cf) == footprint(DM, sp["conv2d_bias_relu"], cf)
