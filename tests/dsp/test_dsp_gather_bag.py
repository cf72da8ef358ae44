"""gather with `bag` > 1 (EmbeddingBag's sum) on dsp-sim: one kernel whose rows are fetched by a row
DMA per index into an AM row tile, each bag's rows added in order on the VPU (vld / vadd / vst),
and only the sums written to DDR (`backend/dsp/lower/gather.py`, `schedules/dsp/gather.py`).

Values are checked two ways: bit for bit against the same adds in fp32 in order (rows[q*b] +
rows[q*b+1], then += rows[q*b+r]: what the VPU executes), and against the op's numpy reference
(summed in float64, rounded once) within the fp32 bound of that order: |out - ref| <= bag * 2^-24
* sum_r |rows[q*b+r]| (bag - 1 in-order fp32 roundings plus the reference's one), elementwise."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.dsp import fclock, timing as dsp_timing
from opcompiler.backend.dsp.lower import lower
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcFailure
from opcompiler.ops import get_op, workload
from opcompiler.ops.catalogue.gather import rows_read
from opcompiler.target import load_target
from opcompiler.template import get_template

T = load_target("dsp-sim")
BE = get_backend(T)
M = machine(T)
OP = get_op("gather")
U = 2.0 ** -24  # fp32's unit roundoff


def _run(shape: str, config="default", ins=None):
    wl = workload("gather", shape, dtype="float32")
    k = BE.build(wl, config)
    ins = ins if ins is not None else OP.make_inputs(wl, 1)
    return wl, k, ins, BE.run(k, ins)


def _looked_up(wl, ins) -> np.ndarray:
    """(bags, bag, cols): the rows each bag sums."""
    rows = np.asarray(ins[0])[rows_read(wl, ins[1], ins[2] if wl["fields"] else None)]
    return rows.reshape(-1, wl["bag"], wl["cols"])


def _check_values(wl, ins, out) -> None:
    rows = _looked_up(wl, ins)
    in_order = rows[:, 0] + rows[:, 1]  # fp32, in the VPU's order
    for r in range(2, wl["bag"]):
        in_order = in_order + rows[:, r]
    assert out.shape == (wl["n"] // wl["bag"], wl["cols"])
    assert np.array_equal(out, in_order)
    ref = OP.reference(wl, ins)
    bound = wl["bag"] * U * np.abs(rows.astype(np.float64)).sum(axis=1)
    assert np.all(np.abs(out.astype(np.float64) - ref.astype(np.float64)) <= bound)


# bag 2; bag 3 with an odd row (200 = 6 x 32 + 8: a predicated last vector) and a last tile of
# fewer bags (51 rows in tiles of 18); bag 8 with and without per-field offsets, one and two slots
CASES = [
    ("rows=300,cols=64,n=48,idx=int64,bag=2", "default"),
    ("rows=300,cols=64,n=48,idx=int32,bag=2", {"tile": 8, "path": "am", "dbuf": 0, "cores": 4}),
    ("rows=257,cols=200,n=51,idx=int64,bag=3", {"tile": 18, "path": "am", "dbuf": 1, "cores": 8}),
    ("rows=257,cols=200,n=51,idx=int32,bag=3", {"tile": 9, "path": "am", "dbuf": 0, "cores": 2}),
    ("rows=1000,cols=40,n=64,idx=int64,bag=8", {"tile": 16, "path": "am", "dbuf": 1, "cores": 8}),
    ("rows=1000,cols=40,n=64,idx=int64,fields=4,bag=8", {"tile": 16, "path": "am", "dbuf": 1, "cores": 8}),
    ("rows=1000,cols=7,n=96,idx=int32,fields=3,bag=8", {"tile": 32, "path": "am", "dbuf": 0, "cores": 2}),
]


@pytest.mark.parametrize("shape,config", CASES, ids=lambda v: str(v))
def test_values_match_numpy_and_the_clocks_agree(shape, config):
    wl, k, ins, res = _run(shape, config)
    if wl["fields"]:
        assert rows_read(wl, ins[1], ins[2]).max() >= wl["rows"] // wl["fields"]  # the offsets move the reads
    _check_values(wl, ins, np.asarray(res.outputs[0]))
    # the call's functional clock (fclock), its timing program's model, and `measure` (timing only)
    assert res.cycles == BE.measure(k).cycles == res.metrics["functional_cycles"] == res.metrics["timing_cycles"]
    # the two clocks on the same (functional) program
    fprog = lower(get_template("gather", "dsp").apply(wl, T, k.config), T, True)
    out, _, fun = fclock.replay(M, fprog, ins)
    tim = dsp_timing.timing(M, fprog)
    assert fun.cycles == tim.cycles and fun.dsp_cycles == tim.dsp_cycles
    assert np.array_equal(out, np.asarray(res.outputs[0]))


def _program(wl, config, functional=False):
    k = BE.build(wl, config)
    return lower(get_template("gather", "dsp").apply(wl, T, k.config), T, functional)


@pytest.mark.parametrize("shape", ["rows=257,cols=200,n=51,idx=int64,bag=3",
                                   "rows=1000,cols=40,n=64,idx=int64,fields=4,bag=8"])
def test_only_the_sums_reach_ddr(shape):
    """Every DDR write is the output's, n / bag rows of it, each once; the rows stay in AM."""
    wl = workload("gather", shape, dtype="float32")
    b, cols = wl["bag"], wl["cols"]
    prog = _program(wl, "default")
    written: dict[str, int] = {}
    vpu = []
    for ops in prog.cores:
        for op in ops:
            if op.kind == "dma" and op.path.endswith("->DDR"):
                assert op.path == "AM->DDR"
                written[op.views[1].space[1]] = written.get(op.views[1].space[1], 0) + op.nbytes
            elif op.pipe == "vpu":
                vpu.append(op)
    assert written == {"out": wl["n"] // b * cols * 4}
    assert prog.out_shape == (wl["n"] // b, cols)
    # the rows: one DMA each, DDR -> AM
    rows = [op for ops in prog.cores for op in ops if op.kind == "dma" and op.label == "gather row"]
    assert len(rows) == wl["n"] and {op.path for op in rows} == {"DDR->AM"}
    # the bag sums are the VPU's vector instructions: per output vector bag loads, bag - 1 adds, one store
    vecs = -(-cols // M.lanes)
    assert sum(op.cost.fmas for op in vpu) == wl["n"] // b * vecs * (b - 1)
    assert sum(op.cost.vldst for op in vpu) == wl["n"] // b * vecs * (b + 1)
    # the run's counters: DDR bytes are the rows read, the sums written, the indices (and each working
    # core's offsets), in both clocks' runs
    _, _, _, res = _run(shape)
    ddr = (wl["n"] * cols + wl["n"] // b * cols + wl["n"] + wl["fields"] * res.metrics["cores_used"]) * 4
    for c in (res.metrics["counters"], res.metrics["functional_counters"]):
        assert c["bytes_by_level"]["DDR"] == ddr and c["fmas"] == wl["n"] // b * vecs * (b - 1)


def test_bag_sum_instructions():
    """The pass is real VPU code: vld, vadd, vst (the row's last vector predicated to its lanes)."""
    wl = workload("gather", "rows=257,cols=200,n=51,idx=int64,bag=3", dtype="float32")
    from opcompiler.backend.dsp.lower import lowered_func
    from opcompiler.backend.dsp.lower.gather import GatherLowerer

    sched = get_template("gather", "dsp").apply(wl, T, {"tile": 18, "path": "am", "dbuf": 1, "cores": 8})
    low = GatherLowerer(M, lowered_func(sched, T), dict(sched.params), {}, False)
    assert low.bag == 3
    kern = low._bag_kernel(0, 10_000, 6)
    ops = {ins.op for n in kern.nests for ins in n.pre + n.body + n.post}
    assert ops == {"vld", "vadd", "vst"}
    full, tail = kern.nests
    assert full.outer == (6, 200 // M.lanes) and full.inner == (2,)
    assert tail.outer == (6,) and tail.post[0].lanes == 200 % M.lanes


@pytest.mark.parametrize("bad", [37, -1])
def test_an_index_outside_the_table_is_one_line(bad):
    shape = "rows=37,cols=33,n=12,idx=int64,bag=4"
    wl = workload("gather", shape, dtype="float32")
    ins = OP.make_inputs(wl, 1)
    ins[1][5] = bad
    with pytest.raises(OpcFailure) as e:
        _run(shape, ins=ins)
    msg = str(e.value)
    assert "\n" not in msg and f"index {bad} " in msg and "table of 37 rows" in msg


def test_tiles_hold_whole_bags_and_am_counts_the_sums():
    tmpl = get_template("gather", "dsp")
    wl = workload("gather", "rows=100,cols=16,n=60,bag=3", dtype="float32")
    space = {kn.name: kn.values for kn in tmpl.space(wl, T)}
    assert space["path"] == ("am",) and all(t % 3 == 0 for t in space["tile"])
    assert "whole bags" in tmpl.check(wl, T, {"tile": 8, "path": "am", "dbuf": 1, "cores": 8})
    assert "path=am" in tmpl.check(wl, T, {"tile": 9, "path": "ddr", "dbuf": 1, "cores": 8})
    # two row tiles of 16 x 5000 fp32 fit AM (640,000 B); with their sums tiles (8 x 5000) they do not
    wl = workload("gather", "rows=100,cols=5000,n=64,bag=2", dtype="float32")
    assert 2 * 16 * 5000 * 4 <= M.cap("AM") < 2 * (16 + 8) * 5000 * 4
    why = tmpl.check(wl, T, {"tile": 16, "path": "am", "dbuf": 1, "cores": 8})
    assert why and "AM" in why and "sums" in why
    cfg = tmpl.default(wl, T)
    assert tmpl.check(wl, T, cfg) is None and cfg["tile"] < 16
