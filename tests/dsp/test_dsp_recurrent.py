"""The fused LSTM / GRU cell on dsp-sim (schedules/dsp/recurrent.py, lowered by
opcompiler/backend/dsp/lower/recurrent.py): values against numpy (sizes off the 32 lanes, hidden and
batch splits, reverse, single- and double-buffered, weights resident or streamed from GSM / DDR,
gru with lbr 1 and 0), the two clocks, cycles linear in the steps, no gate byte in DDR, the knob
space and its default, capacity and fp32 refused in one line."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp.timing import timing
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.ops.limits import unsupported
from opcompiler.schedules.dsp.recurrent import DspRecurrent, plan
from opcompiler.target import load_target

from dsp_lowering import program

T = load_target("dsp-sim")
M = machine(T)
BE = get_backend(T)
TM = DspRecurrent()
TOL = dict(atol=2e-6, rtol=2e-5)  # fp32 throughout (the products contract in float64, rounded once)


def _cfg(**k):
    return {"hsplit": 1, "kc": 16, "w_path": "gsm", "dbuf": 1, "cores": 8, **k}


LSTM_CASES = [
    ("t=3,b=4,i=8,h=8", None),  # the derived default
    ("t=5,b=8,i=20,h=40", _cfg(hsplit=2, cores=4)),  # 20 + 20 units: h exchanged through GSM a step
    ("t=4,b=5,i=32,h=32", _cfg(hsplit=4, kc=32)),  # 4 hidden x 2 batch groups, 8 units a core
    ("t=6,b=7,i=13,h=27", _cfg(cores=2, dbuf=0)),  # batch split, single-buffered, nothing a multiple of 32
    ("t=4,b=3,i=17,h=20,reverse=1", _cfg(hsplit=2)),  # reverse; 3 rows over 4 batch groups: one idles
    ("t=6,b=8,i=32,h=32,reverse=1", _cfg(hsplit=8, kc=32)),
]
GRU_CASES = [
    ("t=4,b=5,i=20,h=24,lbr=1", _cfg(hsplit=2, cores=4)),
    ("t=4,b=5,i=20,h=24,lbr=0", _cfg(hsplit=2, cores=4)),  # r h exchanged too: two barriers a step
    ("t=5,b=6,i=9,h=33,lbr=0,reverse=1", _cfg(cores=2, dbuf=0)),
    ("t=3,b=8,i=32,h=32,lbr=1", None),
]
STREAMED = [  # weights past AM: K chunks streamed each step
    ("lstm", "t=3,b=3,i=256,h=128", _cfg(kc=64, cores=1)),
    ("lstm", "t=3,b=3,i=256,h=128", _cfg(kc=64, cores=1, w_path="ddr", dbuf=0)),
    ("lstm", "t=3,b=5,i=256,h=128,reverse=1", _cfg(kc=64, cores=4)),  # GSM chunks dealt over 4 cores
    ("gru", "t=3,b=3,i=300,h=160,lbr=0", _cfg(kc=64, cores=2)),
    ("gru", "t=3,b=3,i=300,h=160,lbr=1", _cfg(kc=64, cores=2, w_path="ddr")),
]


def _has_gru() -> bool:
    try:
        get_op("gru")
        return True
    except Exception:
        return False


def _run(op: str, shape: str, cfg, seed: int = 3):
    wl = workload(op, shape, dtype="float32")
    kern = BE.build(wl, cfg)
    ins = get_op(op).make_inputs(wl, seed=seed)
    return wl, kern, ins, BE.run(kern, ins)


def _check(op, shape, cfg):
    wl, kern, ins, res = _run(op, shape, cfg)
    np.testing.assert_allclose(res.outputs[0], get_op(op).reference(wl, ins), **TOL)
    assert res.metrics["functional_counters"] == res.metrics["counters"]  # what executed is what timing counts
    return wl, kern, res


@pytest.mark.parametrize("shape,cfg", LSTM_CASES)
def test_lstm_values_against_numpy(shape, cfg):
    _check("lstm", shape, cfg)


@pytest.mark.skipif(not _has_gru(), reason="op gru not registered yet")
@pytest.mark.parametrize("shape,cfg", GRU_CASES)
def test_gru_values_against_numpy(shape, cfg):
    _check("gru", shape, cfg)


@pytest.mark.parametrize("op,shape,cfg", STREAMED)
def test_streamed_weights_values_against_numpy(op, shape, cfg):
    if op == "gru" and not _has_gru():
        pytest.skip("op gru not registered yet")
    wl = workload(op, shape, dtype="float32")
    assert plan(wl, cfg, M)["streamed"] > 0  # the case streams
    _check(op, shape, cfg)


def test_a_dropped_exchange_gives_wrong_values(monkeypatch):
    """The simulator executes what the lowering issued: without the barrier after h reaches GSM
    each core runs ahead and reads the other cores' h before it is there (fresh GSM: NaN)."""
    from opcompiler.backend.dsp.lower import recurrent as tr

    shape, cfg = LSTM_CASES[1]
    wl = workload("lstm", shape, dtype="float32")
    ins = get_op("lstm").make_inputs(wl, seed=3)
    monkeypatch.setattr(tr.RecurrentLowerer, "n_barriers", lambda self: (self.gsm_w, False, False))
    out = BE.run(BE.build(wl, cfg), ins).outputs[0]
    assert not np.allclose(out, get_op("lstm").reference(wl, ins), atol=1e-3, equal_nan=False)


@pytest.mark.parametrize("op,shape,cfg", [("lstm", "t=3,b=8,i=32,h=32", _cfg(hsplit=2, kc=32, cores=2)),
                                          ("lstm", "t=3,b=3,i=256,h=128", _cfg(kc=64, cores=1)),
                                          ("lstm", "t=4,b=6,i=20,h=40,reverse=1", _cfg(hsplit=2, cores=4, dbuf=0))])
def test_timing_and_functional_clocks_agree(op, shape, cfg):
    """The timing model's cycles and the functional replay's own clock (`fclock`): equal on the
    same per-core program, and the reported run equal too (no core group merged here)."""
    wl, kern, _, res = _run(op, shape, cfg)
    fun = res.metrics["functional_cycles"]
    assert fun == timing(M, program(TM, wl, T, kern.config, True)).cycles
    assert fun == res.metrics["timing_cycles"] == BE.measure(kern).cycles > 0


@pytest.mark.parametrize("op,shape,cfg", [
    ("lstm", "b=8,i=24,h=40", _cfg(hsplit=2)),  # a barrier a step
    ("lstm", "b=8,i=24,h=40", _cfg(cores=4)),  # no barrier: the pipeline runs on across steps
    ("lstm", "b=8,i=24,h=40,reverse=1", _cfg(cores=1, dbuf=0)),
    ("lstm", "b=3,i=256,h=128", _cfg(kc=64, cores=1)),  # streamed from GSM
    ("gru", "b=8,i=24,h=40,lbr=0", _cfg(hsplit=2))])
def test_cycles_grow_linearly_with_the_steps(op, shape, cfg):
    """Every step issues the same copies and passes (only addresses move): past the first step
    each one costs the same, so cycles(4) - cycles(2) == cycles(6) - cycles(4) == cycles(8) - cycles(6)."""
    if op == "gru" and not _has_gru():
        pytest.skip("op gru not registered yet")
    c = {t: BE.measure(BE.build(workload(op, f"t={t},{shape}", dtype="float32"), cfg)).cycles for t in (2, 4, 6, 8)}
    assert c[4] - c[2] == c[6] - c[4] == c[8] - c[6] > 0


def test_a_step_costs_at_least_its_products_at_the_fmac_rate():
    """h=512 over 8 hidden groups: per core per step 64 rows x 8 gate vectors x K=1024 FMAs on
    3 FMACs (174,763 cycles); a step of the default config stays within 15 % of that."""
    cfg = TM.default(workload("lstm", "t=2,b=64,i=512,h=512", dtype="float32"), T)
    assert cfg["hsplit"] == 8 and cfg["cores"] == 8
    c = {t: BE.measure(BE.build(workload("lstm", f"t={t},b=64,i=512,h=512", dtype="float32"), cfg)).metrics[
        "dsp_cycles"] for t in (2, 4)}
    step = (c[4] - c[2]) / 2
    floor = 64 * 8 * 1024 / 3
    assert floor <= step <= 1.15 * floor


def _ddr_writes(op, shape, cfg) -> dict[str, int]:
    out: dict[str, int] = {}
    wl = workload(op, shape, dtype="float32")
    for ops in program(TM, wl, T, cfg, True).cores:
        for o in ops:
            if o.kind == "dma" and o.path.endswith("->DDR"):
                name = o.views[1].space[1]
                out[name] = out.get(name, 0) + o.nbytes
    return out


def test_no_gate_byte_reaches_ddr():
    """DDR receives Y and the relaid W^T / R^T (once), nothing of the gates or of c."""
    t, b, i, h = 4, 5, 20, 40
    got = _ddr_writes("lstm", f"t={t},b={b},i={i},h={h}", _cfg(hsplit=2))
    assert got == {"out": t * b * h * 4, "WT": i * 4 * h * 4, "RT": h * 4 * h * 4}
    assert BE.build(workload("lstm", f"t={t},b={b},i={i},h={h}", dtype="float32"), _cfg()).info[
        "gates_in_ddr_bytes"] == 0


@pytest.mark.parametrize("op,shape", [("lstm", "t=2,b=4,i=8,h=8"), ("lstm", "t=100,b=64,i=512,h=512"),
                                      ("lstm", "t=3,b=1,i=5,h=3"), ("lstm", "t=2,b=128,i=1024,h=1024"),
                                      ("gru", "t=100,b=64,i=512,h=512,lbr=0"), ("gru", "t=2,b=2,i=7,h=45")])
def test_knob_space_is_not_empty_and_the_default_is_valid(op, shape):
    if op == "gru" and not _has_gru():
        pytest.skip("op gru not registered yet")
    wl = workload(op, shape, dtype="float32")
    space = TM.space(wl, T)
    assert space and all(k.values for k in space)
    cfg = TM.default(wl, T)
    assert {k.name for k in space} == set(cfg) and all(cfg[k.name] in k.values for k in space)
    assert TM.check(wl, T, cfg) is None
    TM.apply(wl, T, cfg)  # the default schedules
    if op == "lstm" and shape.startswith("t=100,"):  # the weights' columns split over the cores, on chip
        assert cfg["hsplit"] == 8


def test_the_headline_default_splits_the_hidden_units():
    wl = workload("lstm", "t=100,b=64,i=512,h=512", dtype="float32")
    kern = BE.build(wl)
    assert kern.config["hsplit"] == 8 and kern.config["cores"] == 8
    assert kern.info["gates_in_ddr_bytes"] == 0


def test_capacity_is_refused_in_one_line():
    wl = workload("lstm", "t=2,b=64,i=512,h=512", dtype="float32")
    bad = {"hsplit": 8, "kc": 256, "w_path": "gsm", "dbuf": 1, "cores": 8}  # A slots 2 x 64 x 256 x 4 B > SM
    why = TM.check(wl, T, bad)
    assert why.startswith("SM needs")
    with pytest.raises(OpcError) as e:
        BE.build(wl, bad)
    assert "\n" not in str(e.value)
    assert "does not divide" in TM.check(wl, T, {**bad, "kc": 64, "cores": 4, "hsplit": 8})


def test_fp16_is_a_declared_limit_refused_in_one_line():
    wl = workload("lstm", "t=2,b=2,i=8,h=8", dtype="float16")
    assert unsupported("lstm", "dsp", dict(wl.params), "float16") is not None
    assert unsupported("lstm", "dsp", dict(wl.params), "float32") is None
    with pytest.raises(OpcError, match="fp32") as e:
        BE.build(wl)
    assert "\n" not in str(e.value)
