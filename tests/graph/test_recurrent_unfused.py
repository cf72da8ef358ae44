"""The unfused plan of a recurrent layer runs it op by op (`opcompiler.ops.opbyop`): the input
projection once, then per step the h R^T matmul and the gate kernels through GM; every plan's
values match onnxruntime and the fused cell is the faster on the simulators."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from opcompiler.graph.compare import compare
from opcompiler.graph.importer import load
from opcompiler.graph.plan import make_plan
from opcompiler.ops import workload
from opcompiler.ops.opbyop import decompose

torch = pytest.importorskip("torch")


def _export(kind: str, path, t=4, b=3, i=8, h=16):
    import warnings

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(i, h)

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(One().eval(), (torch.randn(t, b, i),), str(path), dynamo=False, opset_version=14,
                          input_names=["x"])
    return load(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rnn")
    return {k: _export(k, d / f"{k}.onnx") for k in ("lstm", "gru")}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_unfused_plan_is_the_op_by_op_decomposition(models, kind):
    g = models[kind]
    fused = make_plan(g, "cpu", mode="fused")
    assert [x.op for x in fused.groups if x.op not in ("view",)] == [kind]
    unfused = make_plan(g, "cpu", mode="unfused")
    ops = Counter(x.op for x in unfused.groups if x.op != "view")
    params = dict(next(x for x in fused.groups if x.op == kind).params)
    want = Counter(k.op for k in decompose(kind, params).kernels)
    assert ops == want
    assert ops["matmul"] == 1 + 4  # the input projection, then one h R^T per step


@pytest.mark.parametrize("kind,target", [("lstm", "ascend-sim"), ("gru", "ascend-sim"), ("lstm", "dsp-sim"),
                                         ("gru", "cpu")])
def test_every_plan_matches_onnxruntime(models, kind, target):
    c = compare(models[kind], target, cost_plan=False)
    assert c.fused.correct and c.unfused.correct
    if target != "cpu":
        assert c.summary()["speedup"] > 2.0  # the fused cell: no GM round trip per step, one launch


def test_reverse_decomposition_runs_the_steps_backwards():
    d = decompose("lstm", workload("lstm", "t=3,b=2,i=4,h=4,reverse=1").params)
    hr = [k for k in d.kernels if k.op == "matmul"][1:]
    assert [k.output for k in hr] == ["hr2", "hr1", "hr0"]
    assert hr[0].inputs[0] == "h_init" and hr[1].inputs[0] == "h_2"
    assert np.all([k.shape == (2, 16) for k in hr])


@pytest.mark.parametrize("name,target", [("sentiment_gru", "ascend-sim"), ("bilstm_tagger", "dsp-sim")])
def test_zoo_recurrent_models_on_the_simulators(tmp_path, name, target):
    """Models users write (tests/zoo/recurrent.py): every plan correct, nothing on the host, the
    fused cells faster than their op-by-op kernels."""
    from zoo.recurrent import export

    path, _ = export(name, tmp_path)
    c = compare(load(path), target, cost_plan=False)
    assert c.fused.correct and c.unfused.correct
    assert not c.fused.on_host() and not c.unfused.on_host()
    assert c.summary()["speedup"] > 5.0
