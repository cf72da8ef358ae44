"""gather (embedding lookup): rows of a table by runtime int32 / int64 indices, on cpu, ascend-sim
(indirect row DMAs through UB) and dsp-sim (a row DMA per index): values against numpy (odd
sizes, repeated indices), an index outside the table is a one-line error naming it and the table
size, and the simulators' two clocks agree."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.errors import OpcFailure
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

TARGETS = {t: load_target(t) for t in ("cpu", "ascend-sim", "dsp-sim")}


def _run(target, shape, dtype, config=None, ins=None):
    wl = workload("gather", shape, dtype=dtype)
    be = get_backend(TARGETS[target])
    k = be.build(wl, config or "default")
    ins = ins if ins is not None else get_op("gather").make_inputs(wl, 1)
    return wl, be, k, ins, be.run(k, ins)


def _repeated(wl, seed=3):
    """Indices with repeats (the first index again at the end, one run of equal ids)."""
    idx = np.random.default_rng(seed).integers(0, wl["rows"], size=wl["n"])
    idx[-1] = idx[0]
    idx[1:4] = idx[1]
    return idx.astype(wl["idx"])


CASES = [(t, dt, shape) for t, dts in (("cpu", ("float32", "float16")), ("ascend-sim", ("float16", "float32")),
                                       ("dsp-sim", ("float32",)))
         for dt in dts for shape in ("rows=37,cols=33,n=13,idx=int32", "rows=1000,cols=64,n=128,idx=int64",
                                     "rows=5,cols=1,n=7,idx=int64")]


@pytest.mark.parametrize("target,dtype,shape", CASES, ids=lambda v: str(v))
def test_values_match_numpy(target, dtype, shape):
    wl = workload("gather", shape, dtype=dtype)
    table = get_op("gather").make_inputs(wl, 1)[0]
    ins = [table, _repeated(wl)]
    *_, res = _run(target, shape, dtype, ins=ins)
    assert np.array_equal(np.asarray(res.outputs[0]), table[ins[1]])


@pytest.mark.parametrize("target,dtype", [("ascend-sim", "float16"), ("dsp-sim", "float32")])
@pytest.mark.parametrize("bad", [37, -1, 1000])
def test_an_index_outside_the_table_is_one_line(target, dtype, bad):
    wl = workload("gather", "rows=37,cols=33,n=13,idx=int64", dtype=dtype)
    ins = get_op("gather").make_inputs(wl, 1)
    ins[1][5] = bad
    with pytest.raises(OpcFailure) as e:
        _run(target, "rows=37,cols=33,n=13,idx=int64", dtype, ins=ins)
    msg = str(e.value)
    assert "\n" not in msg and f"index {bad} " in msg and "table of 37 rows" in msg


@pytest.mark.parametrize("shape,dtype,config", [
    ("rows=37,cols=33,n=13,idx=int32", "float16", {"rows_tile": 4, "double_buffer": 1, "block_dim": 4}),
    ("rows=37,cols=33,n=13,idx=int64", "float32", {"rows_tile": 1, "double_buffer": 0, "block_dim": 2}),
    ("rows=300,cols=768,n=40,idx=int64", "float16", {"rows_tile": 8, "double_buffer": 1, "block_dim": 2})])
def test_ascend_functional_and_timing_clocks_agree(shape, dtype, config):
    wl, be, k, ins, res = _run("ascend-sim", shape, dtype, config)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == be.measure(k).cycles


def test_ascend_a_row_longer_than_ub_moves_in_chunks():
    """A 100,000-element fp32 row (400 kB) does not fit UB: one index per tile, the row in chunks."""
    wl, be, k, ins, res = _run("ascend-sim", "rows=3,cols=100000,n=3,idx=int32", "float32",
                               {"rows_tile": 1, "double_buffer": 1, "block_dim": 1})
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"]


@pytest.mark.parametrize("shape,config", [
    ("rows=37,cols=33,n=29,idx=int64", {"tile": 8, "path": "am", "dbuf": 1, "cores": 8}),
    ("rows=37,cols=33,n=29,idx=int32", {"tile": 8, "path": "ddr", "dbuf": 0, "cores": 4}),
    ("rows=500,cols=64,n=128,idx=int64", {"tile": 16, "path": "am", "dbuf": 1, "cores": 8})])
def test_dsp_functional_and_timing_clocks_agree(shape, config):
    from opcompiler.backend.dsp import engine, fclock
    from opcompiler.backend.dsp.lower import lower
    from opcompiler.backend.dsp.machine import machine
    from opcompiler.template import get_template

    tgt = TARGETS["dsp-sim"]
    wl, be, k, ins, res = _run("dsp-sim", shape, "float32", config)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])
    assert res.cycles == be.measure(k).cycles == res.metrics["functional_cycles"] == res.metrics["timing_cycles"]
    fprog = lower(get_template("gather", "dsp").apply(wl, tgt, k.config), tgt, True)
    out, _, fun = fclock.replay(machine(tgt), fprog, ins)
    tim = engine.timing(machine(tgt), fprog)
    assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    assert fun.cycles == res.cycles  # each core timed on its own: the call's timing is the same program's
    assert np.array_equal(out, ins[0][ins[1]])


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_config_runs(target):
    dtype = "float16" if target == "ascend-sim" else "float32"
    wl, be, k, ins, res = _run(target, "rows=1000,cols=64,n=128,idx=int64", dtype)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])
