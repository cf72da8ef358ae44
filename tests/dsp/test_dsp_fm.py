"""fm_interaction (DeepFM's pairwise term) on dsp-sim: a tile of samples DMA'd into AM, one VPU pass of
vld / vadd / vfnma / vfma / vst per sample and 32-lane vector of k, the results DMA'd back
(`schedules/dsp/fm.py`, `backend/dsp/lower/fm.py`).

Values are checked two ways: bit for bit against the same fp32 operations in the VPU's order
(s = e0 + e1 + ..., q = -(e0^2) then q = q - e_r^2 as fused multiply-subtracts, out = s * s + q as
one fused multiply-add), and against the op's numpy reference (float64, rounded once) within the
fp32 bound of that order, elementwise:

    |out - ref| <= (3 f + 2) * 2^-24 * (S^2 + Q),   S = sum_f |e|,  Q = sum_f e^2

(s's f - 1 roundings enter s^2 twice, q's f roundings, the final FMA's and the reference's one; the
+2 covers the second-order terms)."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp import fclock, timing as dsp_timing
from opcompiler.backend.dsp.lower import lower, lowered_func
from opcompiler.backend.dsp.lower.fm import FmLowerer
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

T = load_target("dsp-sim")
BE = get_backend(T)
M = machine(T)
OP = get_op("fm_interaction")
TMPL = get_template("fm", "dsp")
U = 2.0 ** -24  # fp32's unit roundoff

# the four shapes (k=100: three whole vectors and a predicated one; f=1: no field loop), each with its
# default, and non-default configs (one slot, fewer cores, a last tile of fewer samples)
CASES = [
    ("b=8,f=10,k=16", "default"),
    ("b=37,f=7,k=100", "default"),
    ("b=3,f=1,k=5", "default"),
    ("b=64,f=26,k=16", "default"),
    ("b=37,f=7,k=100", {"tile": 8, "dbuf": 0, "cores": 4}),
    ("b=64,f=26,k=16", {"tile": 16, "dbuf": 1, "cores": 2}),
    ("b=37,f=3,k=64", {"tile": 4, "dbuf": 1, "cores": 8}),
]


def _in_order(e: np.ndarray) -> np.ndarray:
    """The VPU's operations in its order, in fp32 (an FMA: the exact product plus c, rounded once)."""
    f32, f64 = np.float32, np.float64

    def fma(a, b, c):
        return (a.astype(f64) * b.astype(f64) + np.asarray(c, f64)).astype(f32)
    s = e[:, 0].astype(f32)
    q = fma(-s, s, 0.0)
    for r in range(1, e.shape[1]):
        x = e[:, r].astype(f32)
        s = (s + x).astype(f32)
        q = fma(-x, x, q)
    return fma(s, s, q)


def _run(shape: str, config="default"):
    wl = workload("fm_interaction", shape, dtype="float32")
    k = BE.build(wl, config)
    ins = OP.make_inputs(wl, 1)
    return wl, k, ins, BE.run(k, ins)


@pytest.mark.parametrize("shape,config", CASES, ids=lambda v: str(v))
def test_values_match_numpy_and_the_clocks_agree(shape, config):
    wl, k, ins, res = _run(shape, config)
    out = np.asarray(res.outputs[0])
    e = np.asarray(ins[0], np.float32)
    assert out.shape == (wl["b"], wl["k"]) and out.dtype == np.float32
    assert np.array_equal(out, _in_order(e))
    e64 = e.astype(np.float64)
    bound = (3 * wl["f"] + 2) * U * (np.abs(e64).sum(axis=1) ** 2 + (e64 * e64).sum(axis=1))
    ref = OP.reference(wl, ins).astype(np.float64)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= bound)
    # the call's functional clock (fclock), its timing program's model, and `measure` (timing only)
    assert res.cycles == BE.measure(k).cycles == res.metrics["functional_cycles"] == res.metrics["timing_cycles"]
    # the two clocks on the same (functional) program
    fprog = lower(TMPL.apply(wl, T, k.config), T, True)
    fout, _, fun = fclock.replay(M, fprog, ins)
    tim = dsp_timing.timing(M, fprog)
    assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    assert np.array_equal(fout, out)


@pytest.mark.parametrize("shape,config", [("b=37,f=7,k=100", "default"), ("b=64,f=26,k=16", "default"),
                                          ("b=37,f=7,k=100", {"tile": 8, "dbuf": 0, "cores": 4})],
                         ids=lambda v: str(v))
def test_ddr_traffic_is_e_once_in_and_the_output_once_out(shape, config):
    wl = workload("fm_interaction", shape, dtype="float32")
    b, f, kk = wl["b"], wl["f"], wl["k"]
    kern = BE.build(wl, config)
    prog = lower(TMPL.apply(wl, T, kern.config), T, False)
    reads: list[tuple[int, int]] = []
    writes: list[tuple[int, int]] = []
    for ops in prog.cores:
        for op in ops:
            if op.kind != "dma":
                continue
            src, dst = op.views
            assert op.path in ("DDR->AM", "AM->DDR") and op.nruns == 1  # one contiguous run each way
            if op.path == "DDR->AM":
                assert src.space == ("DDR", "e")
                reads.append((src.offset, src.size))
            else:
                assert dst.space == ("DDR", "out")
                writes.append((dst.offset, dst.size))
    for got, total in ((reads, b * f * kk), (writes, b * kk)):  # every element once: disjoint, covering
        pos = 0
        for off, n in sorted(got):
            assert off == pos
            pos += n
        assert pos == total
    ddr = (b * f * kk + b * kk) * 4
    _, _, _, res = _run(shape, config)
    for c in (res.metrics["counters"], res.metrics["functional_counters"]):
        assert c["bytes_by_level"]["DDR"] == ddr


def test_the_pass_is_vector_instructions():
    """Per output vector: f loads, f - 1 adds, f fused multiply-subtracts, one FMA, one store (the row's
    last vector predicated to k's remaining lanes); the two sums share one loop over the fields."""
    wl = workload("fm_interaction", "b=37,f=7,k=100", dtype="float32")
    sched = TMPL.apply(wl, T, {"tile": 8, "dbuf": 1, "cores": 8})
    low = FmLowerer(M, lowered_func(sched, T), dict(sched.params), {}, False)
    assert (low.rows, low.tiles, low.f, low.k) == (8, 5, 7, 100)
    kern = low.kernel(0, 10_000, 8)
    assert {ins.op for n in kern.nests for ins in n.pre + n.body + n.post} == {"vld", "vadd", "vfnma", "vfma", "vst"}
    full, tail = kern.nests
    assert full.outer == (8, 100 // M.lanes) and full.inner == (6,)
    assert tail.outer == (8,) and tail.post[-1].lanes == 100 % M.lanes
    vecs = -(-100 // M.lanes)
    _, _, _, res = _run("b=37,f=7,k=100", {"tile": 8, "dbuf": 1, "cores": 8})
    for c in (res.metrics["counters"], res.metrics["functional_counters"]):
        assert c["fmas"] == 37 * vecs * 2 * 7  # (f - 1) vadd + f vfnma + 1 vfma
        assert c["vldst"] == 37 * vecs * (7 + 1)


def test_fp16_is_refused_in_one_line():
    wl = workload("fm_interaction", "b=8,f=4,k=16", dtype="float16")
    with pytest.raises(OpcError) as e:
        BE.build(wl, "default")
    assert "\n" not in str(e.value) and "fp32" in str(e.value)


def test_am_counts_every_tile():
    """Per slot the e tile (one vector of slack when k is not whole vectors) and the out tile; the
    default is the largest tile that fits and still gives every core two."""
    wl = workload("fm_interaction", "b=4096,f=26,k=16", dtype="float32")
    # 256 samples: e 425,984 B + out 16,384 B per slot; two slots do not fit 768 KB, one does
    assert "AM" in TMPL.check(wl, T, {"tile": 256, "dbuf": 1, "cores": 8})
    assert TMPL.check(wl, T, {"tile": 256, "dbuf": 0, "cores": 8}) is None
    assert "AM" in TMPL.check(wl, T, {"tile": 512, "dbuf": 0, "cores": 8})
    lower(TMPL.apply(wl, T, {"tile": 256, "dbuf": 0, "cores": 8}), T, False)  # the lowering's allocation fits too
    assert TMPL.default(wl, T) == {"tile": 128, "dbuf": 1, "cores": 8}
    wl = workload("fm_interaction", "b=64,f=3000,k=33", dtype="float32")  # one sample barely fits: one slot
    cfg = TMPL.default(wl, T)
    assert cfg["dbuf"] == 0 and TMPL.check(wl, T, cfg) is None
    lower(TMPL.apply(wl, T, cfg), T, False)
