"""batch_matmul, C[b] = op(A[b]) @ op(B[b]) (B shared by every batch with bcast_b): the catalogue
entry (`opcompiler/ops/catalogue/batched.py`) and its templates on cpu, ascend-sim (the cube GEMM
under a batch loop) and dsp-sim (the blocked GEMM with the batch in its C blocks), each checked
against numpy over shapes with odd sizes, both transpose flags, a shared B and a batch of one.
On the simulators a batch of one is matmul's kernel to the cycle, and functional and timing
modes count the same cycles."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.ops.limits import unsupported
from opcompiler.target import load_target

SHAPES = ["b=3,m=7,k=33,n=5", "b=2,m=17,k=40,n=33,trans_a=1,trans_b=1", "b=3,m=20,k=24,n=18,bcast_b=1",
          "b=2,m=9,k=16,n=40,trans_b=1,bcast_b=1", "b=1,m=16,k=16,n=16"]


def _bmm64(wl, ins) -> np.ndarray:
    a, b = (x.astype(np.float64) for x in ins)
    a = a.swapaxes(-1, -2) if wl["trans_a"] else a
    b = b.swapaxes(-1, -2) if wl["trans_b"] else b
    return np.einsum("zik,zkj->zij", a, np.broadcast_to(b, (wl["b"], wl["k"], wl["n"])))


def test_the_catalogue_entry():
    wl = workload("batch_matmul", "b=3,m=7,k=33,n=5,trans_a=1,trans_b=1,bcast_b=1", dtype="float16")
    op = get_op("batch_matmul")
    assert op.family == "batch_matmul" and op.flops(wl) == 2 * 3 * 7 * 33 * 5
    assert [(n, s) for n, s, _ in op.inputs(wl)] == [("tensor_a", (3, 33, 7)), ("tensor_b", (5, 33))]
    assert op.output_spec(wl) == ((3, 7, 5), "float16")
    assert op.output_spec(workload("batch_matmul", "b=2", dtype="int8"))[1] == "int32"
    ins = op.make_inputs(wl)
    assert np.abs(op.reference(wl, ins).astype(np.float64) - _bmm64(wl, ins)).max() < 0.05
    for bad in ("b=0", "m=0", "bcast_b=2", "trans_a=3"):
        with pytest.raises(OpcError) as e:
            workload("batch_matmul", bad)
        assert "\n" not in str(e.value)
    from opcompiler.ops.index import OPS, current
    assert current() and OPS["batch_matmul"].family == "batch_matmul"


@pytest.mark.parametrize("target, dtype", [("cpu", "float32"), ("cpu", "float16"), ("ascend-sim", "float16"),
                                           ("dsp-sim", "float32")])
@pytest.mark.parametrize("shape", SHAPES)
def test_values_against_numpy(target, dtype, shape):
    rep = run_op("batch_matmul", target, shape=shape, dtype=dtype)
    assert rep["correct"] is True, rep.get("max_abs_err")


@pytest.mark.parametrize("shape, cfg", [
    ("b=3,m=7,k=33,n=5,trans_a=1", {"a_layout": "ND", "double_buffer": 0, "block_dim": 2}),
    ("b=2,m=40,k=70,n=33,bcast_b=1", {"m_tile": 32, "k_tile": 32, "n_tile": 16, "block_dim": 4})])
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_ascend_configs_and_int8(shape, cfg, dtype):
    assert run_op("batch_matmul", "ascend-sim", shape=shape, dtype=dtype, config=cfg)["correct"] is True


@pytest.mark.parametrize("shape, cfg", [
    ("b=5,m=13,k=70,n=40,trans_a=1", dict(pw=4, kv=2, rows=8, kc=32, mb=32, nb=64, dbuf=0, w_path="ddr")),
    ("b=4,m=30,k=20,n=70,bcast_b=1", dict(pw=3, kv=1, rows=6, kc=32, mb=32, nb=64, dbuf=1, w_path="gsm"))])
def test_dsp_configs(shape, cfg):
    assert run_op("batch_matmul", "dsp-sim", shape=shape, dtype="float32", config=cfg)["correct"] is True


def test_a_batch_of_one_is_matmul_to_the_cycle():
    cube = {"m_tile": 32, "k_tile": 64, "n_tile": 32, "double_buffer": 1, "block_dim": 32, "a_layout": "zZ"}
    gemm = dict(pw=6, kv=3, rows=12, kc=64, mb=64, nb=128, dbuf=1, w_path="gsm")
    for target, dtype, shape, cfg, mm_cfg in (
            ("ascend-sim", "float16", "m=40,k=100,n=70", cube, cube),
            ("dsp-sim", "float32", "m=70,k=150,n=200", gemm,
             dict(gemm, cols=1, order="out", split="items", out_path="ddr", algo="gemm"))):
        one = run_op("batch_matmul", target, shape=shape + ",b=1", dtype=dtype, config=cfg, verify=False)
        mm = run_op("matmul", target, shape=shape, dtype=dtype, config=mm_cfg, verify=False)
        assert one["cycles"] == mm["cycles"], target


@pytest.mark.parametrize("dtype, shape", [("float16", "b=5,m=40,k=100,n=70"), ("int8", "b=3,m=20,k=70,n=33,bcast_b=1")])
def test_ascend_functional_and_timing_cycles_equal(dtype, shape):
    """The run reports the functional replay's clock (what the execution read, wrote and did);
    measuring schedules the declared program without executing it."""
    be = get_backend(load_target("ascend-sim"))
    wl = workload("batch_matmul", shape, dtype=dtype)
    kern = be.build(wl)
    fun = be.run(kern, get_op(wl.op).make_inputs(wl))
    tim = be.measure(kern)
    assert fun.outputs is not None and tim.outputs is None
    assert fun.cycles == tim.cycles > 0
    assert fun.metrics["bytes_by_level"] == tim.metrics["bytes_by_level"]


@pytest.mark.parametrize("shape", ["b=3,m=20,k=40,n=50,trans_b=1", "b=5,m=40,k=70,n=100"])
def test_dsp_functional_and_timing_cycles_equal(shape):
    """The functional clock (the per-core op lists as executed, `fclock`) equals the timing model
    on the same program; the timing program (repeat blocks, core groups) is the one measured."""
    from opcompiler.backend.dsp import fclock, timing as dsp_timing
    from opcompiler.backend.dsp.lower import lower
    from opcompiler.backend.dsp.machine import machine
    from opcompiler.template import get_template

    t = load_target("dsp-sim")
    be = get_backend(t)
    wl = workload("batch_matmul", shape, dtype="float32")
    kern = be.build(wl)
    fprog = lower(get_template("batch_matmul", "dsp").apply(wl, t, kern.config), t, True)
    ins = get_op(wl.op).make_inputs(wl)
    out, _, fun = fclock.replay(machine(t), fprog, ins)
    tim = dsp_timing.timing(machine(t), fprog)
    assert fun.cycles == tim.cycles > 0 and fun.dsp_cycles == tim.dsp_cycles
    assert fun.cycles == be.measure(kern).cycles
    assert np.abs(out - _bmm64(wl, ins)).max() < 1e-4


def test_ascend_fp32_is_a_declared_limit():
    assert unsupported("batch_matmul", "ascend", {}, "float32") is not None
    with pytest.raises(OpcError, match="runs on the cube") as e:
        run_op("batch_matmul", "ascend-sim", shape="b=2,m=16,k=16,n=16", dtype="float32")
    assert "\n" not in str(e.value)
