"""An internal error in one kernel (a bug of ours inside a template or a simulator, never bad
input) does not take down a graph command (issue 37 item 4): `compare`, `graph plan` and
`graph run` split the failing fused kernel into its parts and go on, and say so in the kernel's
note; a single primitive that fails runs on the host with `--fallback cpu`, else the command
stops with one line naming the node and offering `--fallback cpu` (exit 2, no traceback).

The bug is injected: the CPU backend raises IndexError (the class of the dsp functional run's
out-of-range load) for one op, at build time or at run time."""
from __future__ import annotations

import pytest

from opcompiler.backend.cpu import CpuBackend
from opcompiler.errors import OpcError
from opcompiler.graph import compare, load, make_plan, run_plan
from opcompiler.graph import cost as graph_cost


@pytest.fixture(autouse=True)
def fresh_kernels():
    graph_cost.clear()
    yield
    graph_cost.clear()


def _break(monkeypatch, where: str, op: str):
    real = getattr(CpuBackend, where)

    def broken(self, kernel_or_wl, *a, **kw):
        wl = kernel_or_wl if where == "build" else kernel_or_wl.workload
        if wl.op == op:
            raise IndexError("index 16384 is out of bounds for axis 0 with size 16384")
        return real(self, kernel_or_wl, *a, **kw)
    monkeypatch.setattr(CpuBackend, where, broken)


@pytest.mark.parametrize("where", ["build", "run"])
def test_a_fused_kernel_that_crashes_is_split_and_the_run_goes_on(models, monkeypatch, where):
    _break(monkeypatch, where, "conv2d_bn_relu")
    run = run_plan(make_plan(load(models["resnet_block"], batch=1), "cpu"))
    assert run.correct, run.max_abs_err
    ops = [k.op for k in run.kernels]
    assert "conv2d_bn_relu" not in ops and ops[:2] == ["conv2d_bn", "relu"]  # settled: the largest fusion left
    notes = [k.note for k in run.kernels if "split" in k.note]
    assert notes and all("IndexError" in n for n in notes), notes


def test_compare_survives_a_crashing_fused_kernel(models, monkeypatch):
    _break(monkeypatch, "run", "conv2d_bn_relu")
    c = compare(load(models["resnet_block"], batch=1), "cpu")
    assert c.fused.correct and c.unfused.correct and c.cost.correct
    assert any("failed on cpu at run time" in k.note for k in c.fused.kernels)


def test_the_cost_plan_splits_a_fused_kernel_that_crashes(models, monkeypatch):
    _break(monkeypatch, "build", "conv2d_bn_relu")
    p = make_plan(load(models["resnet_block"], batch=1), "cpu", mode="cost")
    assert "conv2d_bn_relu" not in [g.op for g in p.groups]
    assert any("internal error: IndexError" in g.why for g in p.groups), [g.why for g in p.groups]


def test_a_crashing_primitive_names_its_node_and_offers_the_fallback(models, monkeypatch):
    _break(monkeypatch, "run", "conv2d")
    plan = make_plan(load(models["resnet_block"], batch=1), "cpu", mode="unfused")
    with pytest.raises(OpcError, match=r"node '.*' \(Conv as conv2d\) cannot be built for cpu: internal error"
                                       r" \(a bug in opcompiler\): IndexError") as e:
        run_plan(plan)
    assert "--fallback cpu" in str(e.value.expected)


def test_the_cli_exits_2_with_one_line(models, monkeypatch, capsys):
    from opcompiler.cli import main
    _break(monkeypatch, "run", "conv2d")
    rc = main(["graph", "run", str(models["resnet_block"]), "--target", "cpu", "--batch", "1", "--unfused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "IndexError" in err[0] and "--fallback cpu" in err[0], err
