"""The reduction-split fully connected layer (`split=k`) lowered from TVM's TIR: the K axis of the
op's compute split into one part per core and rfactored, partial tiles in GSM, one core per block
reducing them (schedules/dsp/ksplit.py, lowered by opcompiler/backend/dsp/lower/ksplit.py).

RETIRED: what the direct emitter (schedules/dsp/ksplit.py's core_ops, measured at abb07b1) reported,
(cycles, dma_transfers, mk_calls). That emitter cached its pass cost per row count only, so every
core was charged the pass of the first core built (core 0's part, c*K//P: floor(K/P) rows when P does
not divide K) -- cores with one more reduction step ran for free. CORRECTED: the same emitter with
the cost computed per core (its part's own length). The lowered program must take no more cycles
than the corrected emitter on every config, and than the retired figure where the two agree."""
import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp.execute import execute
from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import View
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template

from dsp_lowering import func, program

KS = {"split": "k", "w_path": "ddr", "out_path": "ddr", "order": "out", "dbuf": 1, "cols": 1}

# (op, shape, knobs, retired (cycles, dma_transfers, mk_calls), corrected cycles)
PINNED = [
    ("matmul_bias_relu", "m=1,k=722,n=362", {"kv": 8, "pw": 1, "rows": 1}, (1220697, 68, 18), 1220709),
    ("matmul_bias_relu", "m=1,k=722,n=362", {"kv": 4, "pw": 1, "rows": 1, "dbuf": 0}, (1223741, 102, 27), 1223759),
    ("matmul", "m=3,k=5,n=70", {"kv": 1, "pw": 1, "rows": 1}, (1187602, 123, 54), 1187602),  # K < P: empty parts
    ("matmul", "m=3,k=5,n=70", {"kv": 3, "pw": 2, "rows": 2}, (1174254, 29, 12), 1174254),
    ("matmul_bias_relu", "m=2,k=37,n=33,trans_b=1", {"kv": 1, "pw": 1, "rows": 1}, (1182306, 105, 36), 1182330),
    ("matmul_bias", "m=1,k=200,n=40", {"kv": 2, "pw": 1, "rows": 1}, (1174119, 34, 9), 1174119),
    ("matmul_bias", "m=7,k=100,n=65", {"kv": 2, "pw": 3, "rows": 4}, (1181085, 104, 52), 1181121),
    ("matmul", "m=96,k=131,n=50", {"kv": 2, "pw": 4, "rows": 8}, (1201491, 224, 204), 1201635),  # batch 96
    ("matmul_bias_relu", "m=96,k=64,n=100", {"kv": 4, "pw": 6, "rows": 12}, (1199083, 160, 136), 1199083),
    ("matmul_bias_relu", "m=5,k=19,n=31,trans_a=1", {"kv": 1, "pw": 2, "rows": 4}, (1175347, 57, 26), 1175365),
]
# lowered cycles at conversion, recorded from the code's own output (all <= corrected; 4 configs above the retired figure by 12-36 cycles,
# the under-charged part of the emitter's pass)
LOWERED = [1220709, 1223759, 1187542, 1174173, 1182330, 1174105, 1181121, 1199798, 1197365, 1175287]


@pytest.fixture(scope="module")
def t():
    return load_target("dsp-sim")


@pytest.mark.parametrize("case", range(len(PINNED)))
def test_split_k_matches_numpy_and_the_retired_emitter(t, case):
    op, shape, knobs, (cyc, dmas, calls), corrected = PINNED[case]
    be = get_backend(t)
    wl = workload(op, shape=shape)
    k = be.build(wl, {**KS, **knobs})
    assert k.info["lowering"] == "tir"
    timed = be.measure(k)
    assert timed.cycles <= corrected
    assert timed.cycles == LOWERED[case]
    cnt = timed.metrics["counters"]
    assert (cnt["dma_transfers"], cnt["mk_calls"]) == (dmas, calls)
    d = get_op(op)
    xs = d.make_inputs(wl, 3)
    res = be.run(k, xs)
    ref = d.reference(wl, xs)
    np.testing.assert_allclose(res.outputs[0], ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))
    assert res.cycles == timed.cycles  # run reports the timing clock ...
    assert res.metrics["functional_cycles"] == LOWERED[case]  # ... and the functional replay's own agrees
    assert res.metrics["functional_counters"] == cnt
    assert res.metrics["bytes_by_level"]["GSM"] > 0


@pytest.mark.parametrize("op,shape,knobs", [
    ("matmul_bias_relu", "m=3,k=9,n=1", {"kv": 1, "pw": 2, "rows": 2}),  # one output feature, K = P + 1
    ("matmul", "m=1,k=1,n=40", {"kv": 2, "pw": 1, "rows": 1}),  # one reduction step: seven empty parts
    ("matmul_bias", "m=16,k=17,n=64,trans_a=1,trans_b=1", {"kv": 1, "pw": 6, "rows": 6}),
])
def test_split_k_odd_shapes(t, op, shape, knobs):
    be = get_backend(t)
    wl = workload(op, shape=shape)
    k = be.build(wl, {**KS, **knobs})
    d = get_op(op)
    xs = d.make_inputs(wl, 5)
    res = be.run(k, xs)
    ref = d.reference(wl, xs)
    np.testing.assert_allclose(res.outputs[0], ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))
    timed = be.measure(k)  # run reports the timing clock, and beside it the functional replay's own:
    assert res.cycles == timed.cycles  # equal without core groups, else within 15 % of the device cycles
    fun = res.metrics["functional_cycles"]  # (identical cores timed as one group, tests/sim/test_crosscheck.py)
    assert fun == timed.cycles if max(k.artifact["program"].multiplicity) == 1 else \
        abs(fun - timed.cycles) <= 0.15 * timed.metrics["dsp_cycles"], (fun, timed.cycles)


def test_the_lowered_program_is_what_runs(t):
    """Shifting the partial tiles' copy into GSM by one element breaks the output."""
    tm = get_template("matmul", "dsp")
    wl = workload("matmul_bias_relu", shape="m=2,k=37,n=33")
    cfg = tm.config(wl, t, {**KS, "kv": 1, "pw": 1, "rows": 1})
    d = get_op(wl.op)
    xs = d.make_inputs(wl, 1)
    ref = d.reference(wl, xs)
    good, _ = execute(machine(t), program(tm, wl, t, cfg, True), xs)
    np.testing.assert_allclose(good, ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))

    def shift(name, v):
        return View(v.space, v.offset + 1, v.shape, v.strides) if name.endswith("rf_local.GSM") else v
    bad, _ = execute(machine(t), program(tm, wl, t, cfg, True, tamper=shift), xs)
    assert not np.allclose(bad, ref, rtol=1e-3)


def test_split_k_balanced_parts_and_bad_configs(t):
    """The K parts are c*K//P (sizes differ by one at most); split=k keeps its capacity and path errors."""
    wl = workload("matmul", shape="m=1,k=19,n=32")
    tm = get_template("matmul", "dsp")
    text = func(tm, wl, t, tm.config(wl, t, {**KS, "kv": 1, "pw": 1, "rows": 1})).script()
    assert "* 19 // 8" in text and "+ 1) * 19 // 8" in text
    be = get_backend(t)
    with pytest.raises(OpcError, match="split=k"):
        be.build(wl, {**KS, "w_path": "gsm", "kv": 1, "pw": 1, "rows": 1})
    big = workload("matmul", shape="m=1,k=100000,n=512")
    with pytest.raises(OpcError, match="AM needs"):  # algo=fc named: the default of so long a K is the blocked GEMM
        be.build(big, {**KS, "algo": "fc", "kv": 12, "pw": 1, "rows": 1})
