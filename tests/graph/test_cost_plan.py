"""Fusion decided by cost: a fused group stays only where its kernel is no slower than its parts,
so the cost-chosen plan is never slower than fusing everything or fusing nothing."""
from __future__ import annotations

import pytest

from opcompiler.errors import OpcError
from opcompiler.graph import load
from opcompiler.graph.compare import compare
from opcompiler.graph.partition import fusion_patterns
from opcompiler.graph.plan import choose, make_plan
from opcompiler.target import load_target


def _costs(table):
    def cost(op, params):
        if table.get(op) == "fail":
            raise OpcError(f"no template for {op}")
        return table[op]
    return cost


def test_choose_keeps_what_pays_and_splits_what_does_not(models):
    g = load(models["resnet_block"], batch=1)
    fused = make_plan(g, "cpu", mode="fused")
    ops = {grp.op for grp in fused.groups}
    assert "conv2d_bn_relu" in ops
    prims = {p.kind for grp in fused.groups for p in grp.prims}
    # the fused conv2d_bn_relu costs more than conv2d + batch_norm + relu; every other fusion pays
    table = {op: 1.0 for op in ops | prims}
    table.update({"conv2d_bn_relu": 10.0, "conv2d": 3.0, "batch_norm": 3.0, "relu": 3.0})
    table.update({op: 1.0 for op, _ in fusion_patterns() if op not in table})
    chosen = choose(list(fused.groups), _costs(table), load_target("cpu"))
    assert "conv2d_bn_relu" not in {c.op for c in chosen}
    # split, it is partitioned again without its op: conv2d_bn (which pays) + relu, not three kernels
    why = "split: fused conv2d_bn_relu 1e+07 us > 9e+06 us for its 3 parts"
    assert [c.op for c in chosen if why in c.why] == ["conv2d_bn", "relu"]
    kept = [c for c in chosen if len(c.prims) > 1]
    assert kept and all(c.why.startswith("fused: ") for c in kept)

    def total(groups):
        return sum(table[grp.op] for grp in groups if grp.op not in ("view", "host"))
    unfused = make_plan(g, "cpu", mode="unfused")
    assert total(chosen) <= total(fused.groups) and total(chosen) <= total(unfused.groups)
    # outputs still come out in an executable order
    produced = set(g.constants) | {n for n, _ in g.inputs}
    for grp in chosen:
        assert all(v in produced or v in fused.constants for v in grp.inputs), grp
        produced.update(grp.outputs)


def test_a_fused_kernel_the_target_cannot_build_is_split(models):
    g = load(models["resnet_block"], batch=1)
    fused = make_plan(g, "cpu", mode="fused")
    table = {op: 1.0 for grp in fused.groups for op in [grp.op, *(p.kind for p in grp.prims)]}
    table.update({op: 1.0 for op, _ in fusion_patterns() if op not in table})
    table["conv2d_bn_relu"] = "fail"
    chosen = choose(list(fused.groups), _costs(table), load_target("cpu"))
    assert [c.op for c in chosen if "split: the fused conv2d_bn_relu cannot be built for cpu (no template" in c.why
            ] == ["conv2d_bn", "relu"]


@pytest.mark.parametrize("target, model, batch", [("ascend-sim", "resnet_block", 1), ("ascend-sim", "minigo", 2),
                                                  ("dsp-sim", "resnet_block", 1)])
def test_cost_plan_never_slower_on_the_simulators(models, target, model, batch):
    """Simulated cycles are deterministic and add up per kernel: the guarantee is exact there."""
    c = compare(load(models[model], batch=batch), target, check=False, config="default")
    cyc = {k: r.totals()["cycles"] for k, r in c.runs.items()}
    assert cyc["cost"] <= cyc["fused"] and cyc["cost"] <= cyc["unfused"], cyc
    for grp in c.cost.plan.groups:
        assert len(grp.prims) < 2 or grp.why.startswith("fused: ")
