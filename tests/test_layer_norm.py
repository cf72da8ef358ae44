"""layer_norm and add_layer_norm (y = LN(x + r), SkipLayerNorm) on cpu, ascend-sim and dsp-sim.

Values against numpy in float64 (max abs error 1e-2 in fp16, ~1e-5 in fp32), rows whose mean is
large against their spread (x ~ 1000 + N(0, 1): the statistics in fp32 and two passes keep them),
the two clocks of both simulators agreeing, the default config of every template, and what the
lowerings emit (ascend: the statistics once per row tile, gamma / beta once per core; dsp: the
variance fused as one FMA a vector, the tail lanes masked)."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

TARGETS = {t: load_target(t) for t in ("cpu", "ascend-sim", "dsp-sim")}


def _ref64(wl, ins) -> np.ndarray:
    f = [a.astype(np.float64) for a in ins]
    s = f[0] + f[1] if wl.op == "add_layer_norm" else f[0]
    d = s - s.mean(axis=1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + float(wl["eps"])) * f[-2] + f[-1]


def _run(op, target, shape, dtype, config=None, ins=None):
    wl = workload(op, shape, dtype=dtype)
    be = get_backend(TARGETS[target])
    k = be.build(wl, config or "default")
    ins = ins if ins is not None else get_op(op).make_inputs(wl, 1)
    return wl, be, k, ins, be.run(k, ins)


def _check(wl, ins, out, tol: float | None = None) -> None:
    tol = tol or (1e-2 if wl.dtype == "float16" else 2e-5)
    np.testing.assert_allclose(np.asarray(out, np.float64), _ref64(wl, ins), rtol=tol / 10, atol=tol)


CASES = [(op, t, dt, shape) for op in ("layer_norm", "add_layer_norm")
         for t, dts in (("cpu", ("float32", "float16")), ("ascend-sim", ("float16", "float32")),
                        ("dsp-sim", ("float32",)))
         for dt in dts for shape in ("rows=3,cols=33", "rows=16,cols=256")] + \
        [("layer_norm", t, "float32", "rows=5,cols=1") for t in TARGETS]


@pytest.mark.parametrize("op,target,dtype,shape", CASES, ids=lambda v: str(v))
def test_values_match_numpy(op, target, dtype, shape):
    wl, be, k, ins, res = _run(op, target, shape, dtype)
    _check(wl, ins, res.outputs[0])


@pytest.mark.parametrize("target,dtype", [("cpu", "float16"), ("ascend-sim", "float16"), ("dsp-sim", "float32")])
def test_a_large_mean_keeps_its_spread(target, dtype):
    """x ~ 1000 + N(0, 1): fp16 holds x to 0.5; E[x^2] - mean^2 in fp32 would lose the variance
    (1e6 against 1: errors of several %), the two-pass statistics in fp32 do not (fp32: what is
    left is the mean's rounding, 2^-14 of 1000)."""
    wl = workload("add_layer_norm", "rows=8,cols=256", dtype=dtype)
    rng = np.random.default_rng(7)
    ins = [(1000 + rng.standard_normal((8, 256))).astype(dtype), rng.standard_normal((8, 256)).astype(dtype),
           rng.uniform(0.5, 1.5, 256).astype(dtype), rng.standard_normal(256).astype(dtype)]
    *_, res = _run("add_layer_norm", target, "rows=8,cols=256", dtype, ins=ins)
    _check(wl, ins, res.outputs[0], 1e-2 if dtype == "float16" else 1e-3)


@pytest.mark.parametrize("op,shape,dtype,config", [
    ("layer_norm", "rows=37,cols=100", "float16", {"rows_tile": 4, "double_buffer": 1, "block_dim": 4}),
    ("add_layer_norm", "rows=9,cols=33", "float32", {"rows_tile": 2, "double_buffer": 0, "block_dim": 2}),
    ("layer_norm", "rows=4,cols=1", "float16", {"rows_tile": 4, "double_buffer": 1, "block_dim": 1})])
def test_ascend_functional_and_timing_clocks_agree(op, shape, dtype, config):
    wl, be, k, ins, res = _run(op, "ascend-sim", shape, dtype, config)
    _check(wl, ins, res.outputs[0])
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == be.measure(k).cycles


@pytest.mark.parametrize("op,shape,config", [
    ("layer_norm", "rows=16,cols=256", {"rows": 2, "acc": 4, "dbuf": 1, "cores": 8}),
    ("add_layer_norm", "rows=7,cols=65", {"rows": 2, "acc": 2, "dbuf": 1, "cores": 4}),
    ("add_layer_norm", "rows=3,cols=33", {"rows": 1, "acc": 1, "dbuf": 0, "cores": 8})])
def test_dsp_functional_and_timing_clocks_agree(op, shape, config):
    """The functional clock (`fclock.replay`: what executed) equals the timing model on the same
    per-core program; the timing program (identical cores as one group) within 3 % of the call."""
    from opcompiler.backend.dsp import fclock, timing as dsp_timing
    from opcompiler.backend.dsp.lower import lower
    from opcompiler.backend.dsp.machine import machine
    from opcompiler.template import get_template

    tgt = TARGETS["dsp-sim"]
    wl, be, k, ins, res = _run(op, "dsp-sim", shape, "float32", config)
    _check(wl, ins, res.outputs[0])
    assert res.cycles == be.measure(k).cycles
    fprog = lower(get_template("norm", "dsp").apply(wl, tgt, k.config), tgt, True)
    out, _, fun = fclock.replay(machine(tgt), fprog, ins)
    tim = dsp_timing.timing(machine(tgt), fprog)
    assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    assert fun.cycles == pytest.approx(res.cycles, rel=0.03)
    _check(wl, ins, out)


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_config_fits_and_runs(target):
    """No record: every template derives its config (cols = 768, BERT's rows)."""
    from opcompiler.template import get_template

    tgt = TARGETS[target]
    dt = "float16" if target == "ascend-sim" else "float32"
    wl = workload("layer_norm", "rows=128,cols=768", dtype=dt)
    tm = get_template("norm", tgt.family)
    cfg = tm.default(wl, tgt)
    assert tm.check(wl, tgt, cfg) is None
    *_, res = _run("layer_norm", target, "rows=128,cols=768", dt)
    assert res.outputs[0].shape == (128, 768)


def test_ascend_statistics_per_tile_and_gamma_once_per_core():
    """Per row tile: vcadd folds per row, the mean / var / + eps / sqrt / 1 / x once over the
    tile's rows; gamma and beta GM -> UB once per core; the capacity check lists what the
    lowering allocates."""
    from opcompiler.backend.ascend.program import DataMove, Vec
    from opcompiler.template import get_template

    wl, be, k, ins, res = _run("layer_norm", "ascend-sim", "rows=32,cols=256", "float16",
                               {"rows_tile": 4, "double_buffer": 1, "block_dim": 2})
    prog = k.artifact.program
    vec = [i for i in prog.instrs if isinstance(i, Vec)]
    tiles = 32 // 4 // 2  # this core's
    assert sum(v.op == "sqrt" for v in vec) == sum(v.op == "rec" for v in vec) == tiles
    assert sum(v.op == "cadd" for v in vec) >= 2 * 4 * tiles
    gm_in = [i for i in prog.instrs if isinstance(i, DataMove) and i.src.level == "GM"]
    assert [i.src.name for i in gm_in].count("gamma") == 1 and len(gm_in) == 2 + tiles
    tgt = TARGETS["ascend-sim"]
    listed = sum(b for _, _, b in get_template("norm", "ascend").buffers(wl, tgt, k.config))
    assert abs(prog.high_water["UB"] - listed) <= 32 * 40  # the same buffers, each 32 B aligned


def test_dsp_tail_mask_and_capacity(monkeypatch):
    """A row whose pitch runs past its end gets the tail mask (a host table DMAed once per core),
    one that fills its vectors none; the template's AM check counts what the lowering places."""
    from opcompiler.backend.dsp import program
    from opcompiler.backend.dsp.intrin import machine
    from opcompiler.backend.dsp.lower import lower
    from opcompiler.schedules.dsp.norm import _Geo
    from opcompiler.template import get_template

    ends: list[int] = []
    alloc = program.Allocator.alloc
    monkeypatch.setattr(program.Allocator, "alloc",
                        lambda a, name, n: ends.append(alloc(a, name, n) + n) or ends[-1] - n)
    tgt = TARGETS["dsp-sim"]
    tm = get_template("norm", "dsp")
    for op, cols, masked in (("layer_norm", 256, False), ("add_layer_norm", 33, True), ("layer_norm", 129, True)):
        wl = workload(op, {"rows": 7, "cols": cols}, dtype="float32")
        cfg = {"rows": 2, "acc": 4, "dbuf": 1, "cores": 1}  # (the listing shows core 0)
        ends.clear()
        text = lower(tm.apply(wl, tgt, cfg), tgt, True).listing()
        assert ("row_mask0 DDR->AM" in text) == masked
        assert max(ends) == _Geo(machine(tgt), wl, cfg).am_elems()
