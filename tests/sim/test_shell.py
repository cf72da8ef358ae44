"""One simulator shell: both machines' backends are thin `SimBackend`s, one bound rule decides
every report's `bound`, one TIR expression evaluator gives both machines TIR's semantics."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend.lower import trace as ascend_trace
from opcompiler.backend.dsp.lower import eval as tir_eval
from opcompiler.backend.sim import SimBackend
from opcompiler.errors import CapacityError
from opcompiler.ops import get_op, workload
from opcompiler.sim import buffers, profile as prof, shell, tir_expr
from opcompiler.sim.tir_expr import Compiler, NoRule, compile_expr
from opcompiler.target import load_target

SIM = Path(shell.__file__).parent


def test_sim_never_imports_the_backends_or_the_schedules():
    for p in SIM.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [("." * node.level) + (node.module or "")] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert "backend" not in n and "schedules" not in n, (p.name, n)


@pytest.mark.parametrize("name", ["ascend-sim", "dsp-sim"])
def test_both_backends_are_thin_sim_backends(name):
    be = get_backend(load_target(name))
    assert isinstance(be, SimBackend)
    own = {k for k, v in vars(type(be)).items() if callable(v) and not k.startswith("__")}
    assert {"build", "run", "measure", "_result"}.isdisjoint(own)  # the shell's, not the machine's
    assert own <= {"load_machine", "offchip_level", "lower", "dry_run", "timing", "functional", "profile", "report_keys"}


@pytest.mark.parametrize("name,op,shape,dtype", [("ascend-sim", "matmul", "m=64,k=128,n=96", "float16"),
                                                 ("dsp-sim", "matmul", "m=64,k=128,n=96", "float32")])
def test_run_reports_both_clocks_and_the_mode(name, op, shape, dtype):
    be = get_backend(load_target(name))
    wl = workload(op, shape, dtype=dtype)
    k = be.build(wl)
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(dt) for _, s, dt in get_op(op).inputs(wl)]
    run, meas = be.run(k, ins), be.measure(k)
    m = run.metrics
    assert m["mode"] == "functional" and meas.metrics["mode"] == "timing"
    assert m["timing_cycles"] == meas.cycles and m["clocks_differ"] == (m["functional_cycles"] != m["timing_cycles"])
    assert run.cycles == m[f"{be.REPORTED_CLOCK}_cycles"]  # ascend-sim: functional; dsp-sim: timing (the records')
    assert run.seconds == be.machine.cycles_to_seconds(run.cycles)
    assert meas.metrics["bound"] == be.profile(k, be.timing(k)).bound


def test_offchip_check_names_the_largest_tensor():
    lv = buffers.Level(name="HBM", capacity=100, alignment=1)
    shell.check_offchip(lv, [("a", 40), ("output", 60)])
    shell.check_offchip(buffers.Level(name="DDR", capacity=0, alignment=1), [("a", 10 ** 12)])  # unbounded
    with pytest.raises(CapacityError, match="'b' needs 101 B in HBM"):
        shell.check_offchip(lv, [("a", 41), ("b", 60)])


def test_one_bound_rule():
    labels = {"m": "cube"}
    assert prof.bound_of({"m": 0.7, "v": 0.2}, labels) == "cube"
    assert prof.bound_of({"m": 0.49, "v": 0.2}, labels) == prof.LATENCY  # nothing busy half the run
    assert prof.bound_of({"m": 0.5, "v": 0.5}) == "m"  # the first of equal shares
    feeds = {"issue": "fmac"}
    lab = {"issue": "issue (latency / loads)"}
    assert prof.bound_of({"issue": 0.8, "fmac": 0.75}, lab, feeds) == "fmac"  # >= 90 % as busy: its work
    assert prof.bound_of({"issue": 0.8, "fmac": 0.7}, lab, feeds) == "issue (latency / loads)"


def _vars(*names):
    from tvm import tirx as T

    return [T.Var(n, "int32") for n in names]


def test_div_is_truncating_floordiv_is_floor_on_both_machines():
    """TIR's `Div` / `Mod` on integers truncate toward zero, `FloorDiv` / `FloorMod` floor; the
    evaluator both machines use agrees with TVM's own arithmetic on every sign combination."""
    import tvm
    from tvm import tirx as T

    x, y = _vars("x", "y")
    a = np.array([-7, 7, -7, 7, -6, 0])
    b = np.array([2, 2, -2, -2, 3, 5])
    E = {x.__chandle__(): a, y.__chandle__(): b}
    ana = tvm.sym.Analyzer()
    for node in (T.Div, T.Mod, T.FloorDiv, T.FloorMod):
        got = compile_expr(node(x, y))(E, None)
        want = [int(ana.simplify(node(T.IntImm("int32", int(p)), T.IntImm("int32", int(q))))) for p, q in zip(a, b)]
        assert got.tolist() == want, node.__name__
    # where the operands share a sign (every index a lowering divides), Div is FloorDiv
    pos = {x.__chandle__(): np.arange(0, 20), y.__chandle__(): np.full(20, 3)}
    assert (compile_expr(T.Div(x, y))(pos, None) == compile_expr(T.FloorDiv(x, y))(pos, None)).all()
    # float Div is true division
    two, seven = T.FloatImm("float32", 2.0), T.FloatImm("float32", 7.0)
    assert compile_expr(T.Div(seven, two))({}, None) == 3.5
    # the machines' evaluators are this one
    assert tir_eval.Compiler is Compiler
    assert ascend_trace._value(T.Div(x, y), E).tolist() == [-3, 3, 3, -3, -2, 0]


def test_integer_evaluation_falls_back_on_floats():
    from tvm import tirx as T

    (x,) = _vars("x")
    with pytest.raises(NoRule):
        Compiler(integer=True).fn(T.Cast("float32", x))
    with pytest.raises(ascend_trace._Opaque):
        ascend_trace._value(T.Cast("float32", x), {x.__chandle__(): 1})
    with pytest.raises(ascend_trace._Opaque):  # an unbound variable (a handle)
        ascend_trace._value(x + 1, {})


def test_same_shaped_expressions_share_one_compiled_function():
    from tvm import tirx as T

    x, y, u, v = _vars("x", "y", "u", "v")
    tir_expr._FACTORIES.clear()
    f = compile_expr(T.FloorDiv(x + 1, y))
    g = compile_expr(T.FloorDiv(u + 1, v))
    assert len(tir_expr._FACTORIES) == 1
    assert f({x.__chandle__(): 9, y.__chandle__(): 2}, None) == 5 and g({u.__chandle__(): 3, v.__chandle__(): 2}, None) == 2
    lt = T.Let(y, x + 1, y * 2)
    assert compile_expr(lt)({x.__chandle__(): 3}, None) == 8
