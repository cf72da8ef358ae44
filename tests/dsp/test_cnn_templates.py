"""The dsp-sim templates a common CNN needs besides the direct convolution: pool2d, ew_chain,
grouped / depthwise conv2d, concat, pad, softmax, reduce_sum / reduce_max (VPU instruction
streams, `opcompiler.backend.dsp.program`; concat is DMA only, pad DMA and fills).

Values: functional mode against the op's numpy reference (tolerances stated per test). Cycles:
hand counts for instruction streams and DDR-bound kernels, cycles growing with the work, knobs
changing the cycles, the functional program timed without the timing program's shortcuts, and
the instructions functional execution issued counted against the timing's counters."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp import execute as ex, timing as tm
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import Mem, Nest, VI
from opcompiler.cli import main
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

from dsp_lowering import program

TGT = load_target("dsp-sim")
M = machine(TGT)
BE = get_backend(TGT)


def _run(op: str, shape: str, config=None, inputs=None, seed: int = 0):
    wl = workload(op, shape, dtype="float32")
    d = get_op(op)
    ins = inputs(d.make_inputs(wl, seed)) if inputs else d.make_inputs(wl, seed)
    kernel = BE.build(wl, config)
    res = BE.run(kernel, ins)
    return res.outputs[0], d.reference(wl, ins), res, kernel


def _cycles(op: str, shape: str, config=None) -> int:
    wl = workload(op, shape, dtype="float32")
    return BE.measure(BE.build(wl, config)).metrics["dsp_cycles"]


# ---------------------------------------------------------------- values

POOL = [
    ("n=2,c=3,h=13,w=37,kernel=3,stride=2,pad=1,mode=max", None),
    ("n=2,c=3,h=13,w=37,kernel=3,stride=2,pad=1,mode=max", {"planes": 2, "rows": 2, "separable": 0, "dbuf": 0,
                                                             "cores": 4}),
    ("n=1,c=5,h=20,w=70,kernel=3,stride=1,pad=1,mode=avg", None),
    ("n=1,c=5,h=20,w=70,kernel=3,stride=1,pad=1,mode=avg", {"planes": 4, "rows": 7, "separable": 0, "dbuf": 1,
                                                             "cores": 2}),
    ("n=3,c=1,h=14,w=15,kernel=2,stride=2,pad=0,mode=avg", None),
    ("n=1,c=2,h=9,w=9,kernel=5,stride=1,pad=2,mode=max", {"planes": 1, "rows": 1, "separable": 1, "dbuf": 1,
                                                           "cores": 8}),
    ("n=1,c=7,h=7,w=7,kernel=7,stride=1,pad=0,mode=avg", None),  # global average pooling
]


@pytest.mark.parametrize("shape, cfg", POOL)
def test_pool2d_matches_reference(shape: str, cfg) -> None:
    out, ref, res, _ = _run("pool2d", shape, cfg)
    # max pooling selects inputs (exact); average: k*k adds and two multiplies by reciprocals
    tol = 0 if "max" in shape else 1e-6
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    assert res.cycles > res.metrics["dsp_cycles"] > 0


def _uniform(lo: float, hi: float):
    def f(ins):
        rng = np.random.default_rng(1)
        ins[0] = rng.uniform(lo, hi, ins[0].shape).astype(np.float32)
        return ins
    return f


CHAINS = [
    ("n=2,c=3,h=9,w=11,chain=sigmoid", None, _uniform(-100, 100)),  # exp saturates both ways
    ("n=2,c=5,h=7,w=9,chain=bn;relu", {"tile": 1024, "dbuf": 0, "cores": 4}, None),
    ("n=2,c=37,h=3,w=5,layout=NHWC,chain=scale;add;clip:-0.5:0.5", None, None),  # channels on the lanes
    ("n=1,c=3,h=50,w=50,chain=affine:0.2:0.5;clip:0:1;mul", {"tile": 2048, "dbuf": 1, "cores": 8}, None),
    ("n=3,c=6,h=1,w=1,chain=bias;sigmoid;mul", None, None),
    ("n=1,c=2,h=40,w=40,chain=scale;relu", {"tile": 1024, "dbuf": 1, "cores": 2}, None),  # planes cut in chunks
    ("n=2,c=3,h=5,w=7,chain=affine:0.5:1.0;pow:-0.75;mul", None, _uniform(0.0, 20.0)),  # LRN's denominator
]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the reference's exp(100)
@pytest.mark.parametrize("shape, cfg, inputs", CHAINS)
def test_ew_chain_matches_reference(shape: str, cfg, inputs) -> None:
    out, ref, _, kernel = _run("ew_chain", shape, cfg, inputs)
    assert kernel.template == "dsp.elemwise"  # the family's template, dispatching to the chain lowering
    # exp / log / reciprocal are polynomial + Newton sequences: a few fp32 ulps
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("cfg", [None, {"path": "am", "tile": 4096, "dbuf": 1, "cores": 8},
                                 {"path": "am", "tile": 4096, "dbuf": 0, "cores": 1}])
def test_concat_matches_reference(cfg) -> None:
    out, ref, _, _ = _run("concat", "n=2,c=3,c1=5,h=17,w=19", cfg)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shape, cfg", [
    ("n=2,c=3,h=7,w=9,pt=2,pl=1,pb=0,pr=3,fill=lowest", None),  # asymmetric, max pooling's identity
    ("n=1,c=5,h=9,w=40,pt=0,pl=0,pb=1,pr=1", {"planes": 2, "rows": 4, "dbuf": 0, "cores": 8}),
    ("n=1,c=2,h=3,w=3,pt=5,pl=0,pb=4,pr=2", {"planes": 1, "rows": 2, "dbuf": 1, "cores": 2}),  # rows of fill only
])
def test_pad_matches_reference(shape: str, cfg) -> None:
    out, ref, _, _ = _run("pad", shape, cfg)
    np.testing.assert_array_equal(out, ref)


CONVS = [
    ("conv2d", "n=2,c=6,h=13,w=37,k=6,groups=6,stride=2,pad=1", None),  # depthwise, stride 2
    ("conv2d", "n=2,c=6,h=13,w=37,k=6,groups=6,stride=2,pad=1", {"planes": 4, "rows": 2, "rb": 2, "w_path": "stage",
                                                                  "dbuf": 0, "cores": 8}),
    ("conv2d", "n=1,c=5,h=10,w=10,k=5,r=5,s=5,groups=5,pad=2", None),  # depthwise 5x5
    ("conv2d", "n=2,c=6,h=11,w=37,k=12,groups=3,stride=2,pad=1", {"planes": 2, "rows": 4, "rb": 3,
                                                                   "w_path": "resident", "dbuf": 1, "cores": 8}),
    ("conv2d", "n=1,c=4,h=12,w=12,k=8,groups=2,dilation=2,pad=2", None),
    ("conv2d_bn_relu", "n=1,c=7,h=9,w=40,k=7,groups=7,stride=2,pad=1", None),
    ("conv2d_bias_relu", "n=2,c=6,h=9,w=9,k=6,r=1,s=1,groups=6,pad=0", None),
    ("conv2d_bn", "n=1,c=8,h=10,w=20,k=16,groups=4,pad=1", {"planes": 8, "rows": 7, "rb": 8, "w_path": "stage",
                                                             "dbuf": 1, "cores": 8}),
]


@pytest.mark.parametrize("op, shape, cfg", CONVS)
def test_grouped_conv_matches_reference(op: str, shape: str, cfg) -> None:
    out, ref, _, kernel = _run(op, shape, cfg)
    assert kernel.template == "dsp.direct_conv2d"  # the family's template, dispatching on groups > 1
    # fp32 FMAs in another order than the reference's: relative to the largest output
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))


@pytest.mark.parametrize("op, shape, cfg", [
    ("softmax", "m=5,n=37", None),
    ("softmax", "m=16,n=1000", {"rows": 4, "acc": 2, "dbuf": 1, "cores": 8}),
    ("softmax", "m=3,n=2049", {"rows": 1, "acc": 1, "dbuf": 0, "cores": 1}),
    ("reduce_sum", "m=7,n=100", None),
    ("reduce_sum", "m=70,n=333", {"rows": 8, "acc": 8, "dbuf": 1, "cores": 4}),
    ("reduce_max", "m=33,n=65", None),
    ("reduce_max", "m=2,n=5000", {"rows": 1, "acc": 1, "dbuf": 0, "cores": 8}),
])
def test_softmax_and_reductions_match_reference(op: str, shape: str, cfg) -> None:
    out, ref, _, _ = _run(op, shape, cfg)
    if op == "reduce_max":
        np.testing.assert_array_equal(out, ref)
    elif op == "reduce_sum":  # sums in another order: relative to the sum of magnitudes
        x = get_op(op).make_inputs(workload(op, shape, dtype="float32"), 0)[0]
        bound = 1e-6 * np.abs(x).sum(axis=1) + 1e-6
        assert (np.abs(out - ref) <= bound).all()
    else:
        np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-8)


@pytest.mark.parametrize("op, shape, cfg", [
    ("conv2d_bn", "n=2,c=5,h=9,w=13,k=40,stride=2,pad=1,layout=NCHW", None),  # groups=1: the direct conv
    ("conv2d_bn", "n=1,c=8,h=6,w=6,k=16,pad=1,layout=NHWC", {"order": "ws"}),
    ("matmul_bias", "m=5,k=33,n=70,trans_b=1", None),  # Gemm with bias, no activation
    ("matmul_bias", "m=1,k=200,n=40", {"split": "k", "w_path": "ddr"}),
])
def test_epilogues_without_activation(op: str, shape: str, cfg) -> None:
    out, ref, _, _ = _run(op, shape, cfg)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))


def test_grouped_nhwc_and_paper_configs_fail_with_a_reason() -> None:
    from opcompiler.errors import OpcError
    with pytest.raises(OpcError, match="NCHW"):
        BE.build(workload("conv2d", "n=1,c=4,h=8,w=8,k=4,groups=4,layout=NHWC", dtype="float32"))
    with pytest.raises(OpcError, match="paper"):
        BE.build(workload("ew_chain", "n=1,c=4,h=8,w=8,chain=relu", dtype="float32"), "paper")
    with pytest.raises(OpcError, match="float32"):
        BE.build(workload("pool2d", "n=1,c=4,h=8,w=8", dtype="float16"))


# ---------------------------------------------------------------- two accountings of one kernel

@pytest.mark.parametrize("op, shape", [
    ("pool2d", "n=2,c=3,h=13,w=37,kernel=3,stride=2,pad=1,mode=avg"),
    ("conv2d_bn_relu", "n=2,c=6,h=13,w=37,k=6,groups=6,stride=2,pad=1"),
    ("ew_chain", "n=2,c=5,h=7,w=9,chain=bn;sigmoid;add"),
    ("softmax", "m=9,n=100"),
])
def test_functional_execution_issues_what_timing_counts(op: str, shape: str) -> None:
    """The instructions functional execution issued (counted as it executed them) equal the
    timing program's counters, and the functional program (one op list per core, no repeat
    compression, no core groups) schedules to the timing program's cycles: within 3 %, since the
    timing program runs identical cores as one group whose transfers hold the shared DDR channel
    as one block, where separate cores interleave theirs."""
    wl = workload(op, shape, dtype="float32")
    kernel = BE.build(wl)
    before = dict(ex.EXECUTED)
    res = BE.run(kernel, get_op(op).make_inputs(wl, 0))
    done = {u: ex.EXECUTED[u] - before.get(u, 0) for u in ("fmac", "ldst", "sld", "valu")}
    c = res.metrics["counters"]
    assert (done["fmac"], done["ldst"], done["sld"], done["valu"]) == (c["fmas"], c["vldst"], c["slds"], c["valu"])
    assert sum(done.values()) > 0
    tmpl = get_template(get_op(op).family, "dsp")
    fprog = program(tmpl, wl, TGT, kernel.config, True)
    assert timing(M, fprog).dsp_cycles == pytest.approx(res.metrics["dsp_cycles"], rel=0.03)


# ---------------------------------------------------------------- cycles by hand

def _nest_cycles(body: tuple, n: int) -> int:
    return tm.nest_cost(M, Nest(outer=(n,), post=body)).cycles


def test_instruction_stream_cycles_by_hand() -> None:
    """Issue-slot bound loops: 2 vector loads/stores, 1 vector ALU op, 3 FMAs per cycle."""
    n = 4000
    a = Mem("AM", 0, (32,))
    # load, max, store: 2 load/store slots and 1 ALU slot per iteration -> 1 cycle each
    c1 = _nest_cycles((VI("vld", "x", (a,)), VI("vmax", "x", ("x", 0.0)), VI("vst", a, ("x",))), n)
    assert n <= c1 <= n + 40
    # a stride-2 load takes 2 slots: 3 slots per iteration -> 1.5 cycles
    s2 = Mem("AM", 0, (64,), 2)
    c2 = _nest_cycles((VI("vld", "x", (s2,)), VI("vst", a, ("x",))), n)
    assert 1.5 * n <= c2 <= 1.5 * n + 40
    # 6 dependent-free FMAs on loaded data: 3 FMACs -> 2 cycles per iteration
    body = (VI("vld", "x", (a,)),) + tuple(VI("vfma", f"y{i}", ("x", 2.0, 1.0)) for i in range(6)) + \
        tuple(VI("vst", a, (f"y{i}",)) for i in range(0, 6, 3))
    c3 = _nest_cycles(body, n)
    assert 2 * n <= c3 <= 2 * n + 40
    # one accumulator carried over the inner loop: every vadd waits the 6-cycle FMAC latency
    acc = Nest(outer=(1,), inner=(n,), pre=(VI("vmov", "s", (0.0,)),),
               body=(VI("vld", "x", (Mem("AM", 0, (0, 32)),)), VI("vadd", "s", ("s", "x"))))
    assert M.fmac_latency * n <= tm.nest_cost(M, acc).cycles <= M.fmac_latency * n + 40


def test_dma_bound_kernels_run_at_ddr_bandwidth() -> None:
    """concat moves every byte DDR -> DDR (read + write on the shared DDR channel); the ResNet
    max pool reads its input once and writes its output: both within 10 % of bytes / bandwidth."""
    shape = "n=1,c=128,c1=128,h=28,w=28"
    ddr = 2 * (128 + 128) * 28 * 28 * 4 / M.ddr_bytes_per_cycle
    cyc = _cycles("concat", shape)
    assert ddr <= cyc <= 1.10 * ddr
    ddr = (64 * 112 * 112 + 64 * 56 * 56) * 4 / M.ddr_bytes_per_cycle
    cyc = _cycles("pool2d", "n=1,c=64,h=112,w=112,kernel=3,stride=2,pad=1,mode=max")
    assert ddr <= cyc <= 1.10 * ddr


@pytest.mark.parametrize("op, small, large", [
    ("pool2d", "n=1,c=16,h=56,w=56,kernel=3,stride=2,pad=1", "n=1,c=32,h=56,w=56,kernel=3,stride=2,pad=1"),
    ("conv2d", "n=1,c=32,h=28,w=28,k=32,groups=32,pad=1", "n=1,c=32,h=56,w=56,k=32,groups=32,pad=1"),
    ("ew_chain", "n=1,c=16,h=28,w=28,chain=sigmoid", "n=4,c=16,h=28,w=28,chain=sigmoid"),
    ("softmax", "m=64,n=1000", "m=256,n=1000"),
    ("reduce_sum", "m=64,n=512", "m=64,n=2048"),
    ("concat", "n=1,c=32,c1=32,h=28,w=28", "n=2,c=32,c1=32,h=28,w=28"),
])
def test_cycles_grow_with_the_work(op: str, small: str, large: str) -> None:
    a, b = _cycles(op, small), _cycles(op, large)
    assert b > 1.5 * a


# ---------------------------------------------------------------- knobs

@pytest.mark.parametrize("op, shape, cfgs", [
    ("pool2d", "n=1,c=32,h=56,w=56,kernel=3,stride=2,pad=1",
     [{"cores": 8}, {"cores": 1}, {"rows": 1, "planes": 1}, {"dbuf": 0, "planes": 1}]),
    ("conv2d", "n=1,c=32,h=56,w=56,k=32,groups=32,pad=1",
     [{"cores": 8}, {"cores": 2}, {"planes": 1, "rows": 4, "w_path": "stage"}, {"dbuf": 0}]),
    ("ew_chain", "n=1,c=32,h=28,w=28,chain=bn;sigmoid",
     [{"cores": 8}, {"cores": 1}, {"tile": 2048}, {"tile": 2048, "dbuf": 0}]),
    ("softmax", "m=64,n=1000", [{"cores": 8}, {"cores": 1}, {"rows": 1}, {"rows": 1, "dbuf": 0}]),
    ("concat", "n=1,c=64,c1=64,h=28,w=28", [{"cores": 8}, {"cores": 1}, {"path": "am", "tile": 4096}]),
])
def test_knobs_change_the_cycles(op: str, shape: str, cfgs: list[dict]) -> None:
    cyc = [_cycles(op, shape, c) for c in cfgs]
    assert len(set(cyc)) == len(cyc), cyc
    assert cyc[1] > cyc[0]  # fewer cores: slower


def test_register_blocking_and_accumulators_cut_vpu_time() -> None:
    """VPU-side knobs: taller depthwise register blocks reuse each loaded input row; more
    accumulators hide the FMAC latency of a reduction; the separable pool issues fewer ops."""
    def vpu(op, shape, cfg):
        r = BE.measure(BE.build(workload(op, shape, dtype="float32"), cfg))
        return r.metrics["busy_ratios"]["VPU issue"] * r.cycles * M.cores
    dw = "n=1,c=32,h=56,w=56,k=32,groups=32,pad=1"
    assert vpu("conv2d", dw, {"rb": 4}) < 0.8 * vpu("conv2d", dw, {"rb": 1})
    red = "m=64,n=4096"
    assert vpu("reduce_sum", red, {"acc": 8}) < 0.5 * vpu("reduce_sum", red, {"acc": 1})
    pool = "n=1,c=32,h=56,w=56,kernel=3,stride=1,pad=1"
    assert vpu("pool2d", pool, {"separable": 1}) < 0.8 * vpu("pool2d", pool, {"separable": 0})


def test_tune_pool2d_on_dsp_sim(capsys: pytest.CaptureFixture, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["tune", "pool2d", "--target", "dsp-sim", "--trials", "8", "--workers", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["template"] == "dsp.pool2d" and out["trials"] == 8 and out["invalid"] == 0
    assert out["verified"] is True and out["best_cycles"] <= out["default_cycles"]


@pytest.mark.parametrize("shape", ["dims=2x8x4x4,axis=1,start=4,end=8", "dims=3x10,axis=1,start=2,end=7",
                                   "dims=6x5x7,axis=0,start=1,end=4"])
def test_slice_by_dma_matches_numpy(shape):
    from opcompiler.api import run_op
    rep = run_op("slice", "dsp-sim", shape=shape, dtype="float32")
    assert rep["correct"] and rep["max_abs_err"] == 0.0
