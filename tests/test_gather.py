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
from opcompiler.ops.catalogue.gather import rows_read
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
    from opcompiler.backend.dsp import fclock, timing as dsp_timing
    from opcompiler.backend.dsp.lower import lower
    from opcompiler.backend.dsp.machine import machine
    from opcompiler.template import get_template

    tgt = TARGETS["dsp-sim"]
    wl, be, k, ins, res = _run("dsp-sim", shape, "float32", config)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])
    assert res.cycles == be.measure(k).cycles == res.metrics["functional_cycles"] == res.metrics["timing_cycles"]
    fprog = lower(get_template("gather", "dsp").apply(wl, tgt, k.config), tgt, True)
    out, _, fun = fclock.replay(machine(tgt), fprog, ins)
    tim = dsp_timing.timing(machine(tgt), fprog)
    assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    assert fun.cycles == res.cycles  # each core timed on its own: the call's timing is the same program's
    assert np.array_equal(out, ins[0][ins[1]])


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_config_runs(target):
    dtype = "float16" if target == "ascend-sim" else "float32"
    wl, be, k, ins, res = _run(target, "rows=1000,cols=64,n=128,idx=int64", dtype)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][ins[1]])


# -- per-field offsets (`fields`: DeepFM's ids + offsets folded into the lookup) --------------------

OFFSET_CASES = [(t, dt, shape) for t, dt in (("cpu", "float32"), ("ascend-sim", "float16"), ("dsp-sim", "float32"))
                for shape in ("rows=37,cols=33,n=13,idx=int32,fields=3", "rows=1000,cols=16,n=80,idx=int64,fields=10")]


def _with_offsets(wl):
    """The op's own inputs (each id in its field's vocabulary) and the rows they address."""
    ins = get_op("gather").make_inputs(wl, 1)
    rows = ins[1].astype(np.int64) + ins[2].astype(np.int64)[np.arange(wl["n"]) % wl["fields"]]
    return ins, rows


@pytest.mark.parametrize("target,dtype,shape", OFFSET_CASES, ids=lambda v: str(v))
def test_offsets_values_match_numpy(target, dtype, shape):
    """fields=3 with n=13: the last field's period is cut short (13 = 4 x 3 + 1)."""
    wl = workload("gather", shape, dtype=dtype)
    ins, rows = _with_offsets(wl)
    assert rows.max() >= wl["rows"] // wl["fields"]  # the offsets do move the reads
    *_, res = _run(target, shape, dtype, ins=ins)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][rows])


@pytest.mark.parametrize("target,dtype", [("ascend-sim", "float16"), ("dsp-sim", "float32")])
def test_an_offset_index_outside_the_table_is_one_line(target, dtype):
    """The bound is on index + offset: id 30 of field 2 (offset 24) is row 54 of 37."""
    shape = "rows=37,cols=33,n=13,idx=int64,fields=3"
    wl = workload("gather", shape, dtype=dtype)
    ins, _ = _with_offsets(wl)
    ins[1][5] = 30  # field 5 % 3 = 2
    with pytest.raises(OpcFailure) as e:
        _run(target, shape, dtype, ins=ins)
    msg = str(e.value)
    assert "\n" not in msg and "index 54 " in msg and "table of 37 rows" in msg


@pytest.mark.parametrize("config", [{"rows_tile": 4, "double_buffer": 1, "block_dim": 4},
                                    {"rows_tile": 8, "double_buffer": 0, "block_dim": 2}])
def test_ascend_offsets_clocks_agree(config):
    shape = "rows=1000,cols=16,n=80,idx=int64,fields=10"
    wl = workload("gather", shape, dtype="float16")
    ins, rows = _with_offsets(wl)
    _, be, k, _, res = _run("ascend-sim", shape, "float16", config, ins=ins)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][rows])
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == be.measure(k).cycles


@pytest.mark.parametrize("config", [{"tile": 8, "path": "am", "dbuf": 1, "cores": 8},
                                    {"tile": 8, "path": "ddr", "dbuf": 0, "cores": 4}])
def test_dsp_offsets_clocks_agree(config):
    shape = "rows=1000,cols=16,n=80,idx=int64,fields=10"
    wl = workload("gather", shape, dtype="float32")
    ins, rows = _with_offsets(wl)
    _, be, k, _, res = _run("dsp-sim", shape, "float32", config, ins=ins)
    assert np.array_equal(np.asarray(res.outputs[0]), ins[0][rows])
    assert res.cycles == be.measure(k).cycles == res.metrics["functional_cycles"] == res.metrics["timing_cycles"]


# -- cost: what one more row costs on ascend-sim (benchmarks/gather_bandwidth.py) -------------------

@pytest.mark.parametrize("fields", [0, 4])
def test_ascend_one_more_row_costs_one_row_dma_and_its_copy_out(fields):
    """One core, one tile, no ping-pong: the rows' DMAs run back to back on MTE2, then one copy
    out on MTE3. A tenth row adds one row DMA, ceil(latency + B / GM->UB rate), and B / UB->GM rate
    to the copy out: for 1 KiB rows on the 910 file ceil(200 + 1024 / 110) + 1024 / 64 = 226
    cycles. The offset add (a scalar op) is off that path: the same with offsets. This per-DMA
    latency, paid once per row on each core's in-order MTE2, is what bounds a gather of short
    rows (benchmarks/gather_bandwidth.py: 10.5 % of the HBM figure for 4,096 rows of 1 KiB)."""
    from math import ceil

    from opcompiler.backend.ascend.machine import _machine

    m = _machine(TARGETS["ascend-sim"])
    cfg = {"rows_tile": 16, "double_buffer": 0, "block_dim": 1}
    cyc = {}
    for n in (9, 10):
        wl = workload("gather", f"rows=100000,cols=512,n={n},idx=int64,fields={fields}", dtype="float16")
        be = get_backend(TARGETS["ascend-sim"])
        cyc[n] = be.measure(be.build(wl, cfg)).cycles
    rd, wr = m.path("GM", "UB"), m.path("UB", "GM")
    want = ceil(rd.latency_cycles + 1024 / rd.bytes_per_cycle) + ceil(1024 / wr.bytes_per_cycle)
    assert want == 226  # the 910 file's figures: 200 cycles, 110 and 64 B / cycle
    assert cyc[10] - cyc[9] == want


# -- bags: each output row the sum of `bag` looked-up rows (EmbeddingBag's sum, `emb(ids).sum(1)`) -----

BAG_CASES = [(t, dt, shape) for t, dt in (("cpu", "float32"), ("ascend-sim", "float16"))
             for shape in ("rows=37,cols=33,n=12,bag=2,idx=int32", "rows=1000,cols=200,n=96,bag=3",
                           "rows=1000,cols=64,n=128,bag=8,fields=8", "rows=300,cols=512,n=40,bag=4")]
# fp32: sums of up to 8 normal values, in order vs once-rounded; fp16: the kernel rounds each add
BAG_TOL = {"float32": 1e-5, "float16": 2e-2}


@pytest.mark.parametrize("target,dtype,shape", BAG_CASES, ids=lambda v: str(v))
def test_bag_sums_match_numpy(target, dtype, shape):
    wl, _, _, ins, res = _run(target, shape, dtype)
    b = wl["bag"]
    rows = np.asarray(ins[0])[rows_read(wl, ins[1], ins[2] if wl["fields"] else None)]
    want = rows.astype(np.float64).reshape(-1, b, wl["cols"]).sum(axis=1)
    out = np.asarray(res.outputs[0]).astype(np.float64)
    assert out.shape == (wl["n"] // b, wl["cols"])
    assert np.abs(out - want).max() <= BAG_TOL[dtype] * max(1.0, np.abs(want).max() / 4)


def test_bag_must_divide_n():
    from opcompiler.errors import OpcError
    with pytest.raises(OpcError, match="bag"):
        workload("gather", "rows=10,cols=4,n=10,bag=3")


@pytest.mark.parametrize("fields", [0, 4])
def test_ascend_one_more_bag_costs_its_rows_adds_and_copy_out(fields):
    """One core, one tile, no ping-pong, bags of 4 rows of 1 KiB: the rows' DMAs run back to back on
    MTE2, the adds wait for the tile's rows on the V pipe, then one copy out of the sums. Each add
    covers every bag of the tile (a repeat per bag) for one 128-lane chunk of the row: 3 adds x 4
    chunks. A fourth bag adds 4 row DMAs (ceil(200 + 1024 / 110) = 210 each), one repeat to each
    of those 12 adds (1 cycle each), one more 1 KiB sum out (1024 / 64 = 16), and 32 more index
    bytes in the index DMA (ceil(200 + 128 / 110) - ceil(200 + 96 / 110) = 1): 869 cycles. The bag
    writes one row where the lookup wrote four."""
    from math import ceil

    from opcompiler.backend.ascend.machine import _machine

    m = _machine(TARGETS["ascend-sim"])
    rd, wr = m.path("GM", "UB"), m.path("UB", "GM")
    cfg = {"rows_tile": 16, "double_buffer": 0, "block_dim": 1}
    be = get_backend(TARGETS["ascend-sim"])
    cyc = {}
    for n in (12, 16):
        wl = workload("gather", f"rows=100000,cols=512,n={n},idx=int64,fields={fields},bag=4", dtype="float16")
        cyc[n] = be.measure(be.build(wl, cfg)).cycles
    want = (4 * ceil(rd.latency_cycles + 1024 / rd.bytes_per_cycle) + 3 * 4 * m.vec_cycles_per_repeat
            + ceil(1024 / wr.bytes_per_cycle)
            + ceil(rd.latency_cycles + 128 / rd.bytes_per_cycle) - ceil(rd.latency_cycles + 96 / rd.bytes_per_cycle))
    assert want == 869
    assert cyc[16] - cyc[12] == want


@pytest.mark.parametrize("config", [{"rows_tile": 8, "double_buffer": 1, "block_dim": 4},
                                    {"rows_tile": 4, "double_buffer": 0, "block_dim": 2}])
def test_ascend_bag_clocks_agree_and_only_sums_leave(config):
    shape = "rows=300,cols=96,n=40,bag=4,fields=4,idx=int32"
    wl, be, k, ins, res = _run("ascend-sim", shape, "float16", config)
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == be.measure(k).cycles
    plan = k.artifact.plan
    from opcompiler.backend.ascend.program import DataMove
    out_bytes = sum(x.nbytes for c in range(plan.active_cores) for x in plan.make_program(c).instrs
                    if isinstance(x, DataMove) and x.path[1] == "GM")
    assert out_bytes == wl["n"] // 4 * wl["cols"] * 2


# -- a table resident in L1 (`table_l1`): loaded once per core, rows then read L1 -> UB -------------

@pytest.mark.parametrize("shape", ["rows=37,cols=33,n=13,idx=int32", "rows=300,cols=16,n=96,fields=3,bag=3",
                                   "rows=2000,cols=1,n=64,bag=8"])
@pytest.mark.parametrize("config", [{"rows_tile": 4, "double_buffer": 1, "block_dim": 4, "table_l1": 1},
                                    {"rows_tile": 8, "double_buffer": 0, "block_dim": 2, "table_l1": 1}])
def test_ascend_l1_table_values_and_clocks(shape, config):
    wl = workload("gather", shape, dtype="float16")
    config = {**config, "rows_tile": config["rows_tile"] * wl["bag"]}  # whole bags per tile
    _, be, k, ins, res = _run("ascend-sim", shape, "float16", config)
    want = get_op("gather").reference(wl, ins).astype(np.float64)
    assert np.abs(np.asarray(res.outputs[0]).astype(np.float64) - want).max() <= BAG_TOL["float16"] * max(
        1.0, np.abs(want).max() / 4)
    assert res.metrics["functional_cycles"] == res.metrics["timing_cycles"] == be.measure(k).cycles


def test_ascend_l1_table_index_outside_is_one_line():
    wl = workload("gather", "rows=37,cols=33,n=13,idx=int64", dtype="float16")
    ins = get_op("gather").make_inputs(wl, 1)
    ins[1][3] = 37
    with pytest.raises(OpcFailure) as e:
        _run("ascend-sim", "rows=37,cols=33,n=13,idx=int64", "float16",
             {"rows_tile": 4, "double_buffer": 1, "block_dim": 2, "table_l1": 1}, ins=ins)
    assert "\n" not in str(e.value) and "index 37 " in str(e.value) and "table of 37 rows" in str(e.value)


def test_ascend_one_more_row_from_an_l1_table_costs_the_l1_path():
    """As the GM case above, but the table (500 rows of 1 KiB) resident in L1: the tenth row's
    indirect move is ceil(L1 -> UB latency + 1024 / its rate) = ceil(20 + 1024 / 128) = 28 cycles on
    MTE1, plus its copy out 1024 / 64 = 16: 44 cycles where a GM row costs 226."""
    from math import ceil

    from opcompiler.backend.ascend.machine import _machine

    m = _machine(TARGETS["ascend-sim"])
    be = get_backend(TARGETS["ascend-sim"])
    cyc = {}
    for n in (9, 10):
        wl = workload("gather", f"rows=500,cols=512,n={n},idx=int64", dtype="float16")
        cyc[n] = be.measure(be.build(wl, {"rows_tile": 16, "double_buffer": 0, "block_dim": 1, "table_l1": 1})).cycles
    l1, wr = m.path("L1", "UB"), m.path("UB", "GM")
    want = ceil(l1.latency_cycles + 1024 / l1.bytes_per_cycle) + ceil(1024 / wr.bytes_per_cycle)
    assert want == 44
    assert cyc[10] - cyc[9] == want


def test_ascend_table_l1_is_offered_when_the_table_fits_and_chosen_when_it_pays():
    from opcompiler.template import get_template

    tgt = TARGETS["ascend-sim"]
    tmpl = get_template("gather", "ascend")
    space = lambda shape: {k.name: k.values for k in tmpl.space(workload("gather", shape, dtype="float16"), tgt)}  # noqa: E731
    assert space("rows=1048576,cols=512,n=4096")["table_l1"] == (0,)  # 1 GiB: never in L1
    assert space("rows=26000,cols=16,n=53248")["table_l1"] == (1, 0)  # 832 KB of 1 MB
    big = workload("gather", "rows=26000,cols=16,n=53248,fields=26", dtype="float16")
    small = workload("gather", "rows=26000,cols=16,n=64", dtype="float16")
    assert tmpl.default(big, tgt)["table_l1"] == 1  # 1,664 rows per core: 300k cycles of latency saved
    assert tmpl.default(small, tgt)["table_l1"] == 0  # 2 rows per core: loading 832 KB does not pay
