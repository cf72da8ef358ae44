"""ONNX LSTM and GRU nodes in every direction and layout lower to one `lstm` / `gru` kernel per
direction (bidirectional: a forward and a reverse kernel, their outputs concatenated on the
direction axis), and torch's multi-layer exports (Squeeze / Transpose / Reshape between the
layers) run through: values against onnxruntime on cpu, for the test-owned recurrent models
(tests/zoo/recurrent.py) and one-node models built by hand (reverse, layout=1, runtime and constant
initial states, GRU's linear_before_reset 0). On the simulators, the models import and their
plans build wherever the target declares no limit (`opcompiler.ops.limits`) on their kernels."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan, run_plan
from opcompiler.graph.executor import compile_plan
from opcompiler.ops.limits import unsupported

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from zoo.recurrent import MODELS, export, one_node  # noqa: E402

RECURRENT = ("lstm", "gru")
# per zoo model: (op, reverse) of its recurrent kernels, in plan order
KERNELS = {"sentiment_lstm": [("lstm", 0), ("lstm", 0)],
           "sentiment_gru": [("gru", 0), ("gru", 1), ("gru", 0), ("gru", 1)],
           "bilstm_tagger": [("lstm", 0), ("lstm", 1)]}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("rzoo")
    return {m: export(m, d) for m in MODELS}


def _recurrent_groups(plan):
    return [g for g in plan.groups if g.op in RECURRENT]


@pytest.mark.parametrize("model", MODELS)
def test_zoo_on_cpu_matches_onnxruntime(zoo, model):
    path, feeds = zoo[model]
    run = run_plan(make_plan(load(path), "cpu"), feeds)
    assert run.correct, run.max_abs_err
    assert "host" not in [k.where for k in run.kernels]
    assert [(g.op, g.params["reverse"]) for g in _recurrent_groups(run.plan)] == KERNELS[model]
    if model == "sentiment_gru":  # torch writes linear_before_reset=1
        assert {g.params["lbr"] for g in _recurrent_groups(run.plan)} == {1}


def test_compare_cli_on_cpu(zoo, capsys, tmp_path, monkeypatch):
    from opcompiler.cli import main
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path))
    rc = main(["compare", str(zoo["bilstm_tagger"][0]), "--target", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err.strip().splitlines()[-1:]
    d = json.loads(out)
    assert all(d["correct"].values()), d["correct"]
    assert [k["op"] for k in d["fused"]["kernels"]].count("lstm") == 2


@pytest.mark.parametrize("target", ["ascend-sim", "dsp-sim"])
@pytest.mark.parametrize("model", MODELS)
def test_zoo_plans_build_on_simulators(zoo, model, target):
    plan = make_plan(load(zoo[model][0]), target)
    family = plan.target.family
    for g in _recurrent_groups(plan):
        lim = unsupported(g.op, family, dict(g.params), plan.dtype)
        if lim is not None:
            pytest.skip(f"{g.op} on {target}: {lim.text} ({lim.why})")
    built, _ = compile_plan(plan)
    assert [b.where for g, b in built if b is not None and g.op in RECURRENT] == \
        [plan.target.name] * len(KERNELS[model])


# -- one-node models ----------------------------------------------------------------------------

def _weights(op: str, nd: int, i: int, h: int, bias: bool, seed: int = 0) -> list:
    gates = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(seed)
    u = lambda *s: rng.uniform(-0.4, 0.4, s).astype(np.float32)  # noqa: E731
    return [u(nd, gates * h, i), u(nd, gates * h, h), u(nd, 2 * gates * h) if bias else None]


def _states(op: str, nd: int, b: int, h: int, layout: int, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    shape = (b, nd, h) if layout else (nd, b, h)
    return [rng.standard_normal(shape).astype(np.float32) * 0.5 for _ in range(2 if op == "LSTM" else 1)]


CASES = [  # op, direction, layout, initial states (absent | const | runtime), attrs
    ("LSTM", "reverse", 0, "absent", {}),
    ("LSTM", "bidirectional", 0, "const", {}),
    ("LSTM", "bidirectional", 0, "runtime", {}),
    ("LSTM", "forward", 1, "runtime", {}),
    ("LSTM", "bidirectional", 1, "const", {}),
    ("GRU", "forward", 0, "absent", {"linear_before_reset": 1}),
    ("GRU", "forward", 0, "const", {}),  # linear_before_reset 0, ONNX's default
    ("GRU", "reverse", 0, "runtime", {"linear_before_reset": 1}),
    ("GRU", "bidirectional", 0, "runtime", {"linear_before_reset": 0}),
    ("GRU", "bidirectional", 1, "runtime", {"linear_before_reset": 1}),
    ("GRU", "reverse", 1, "absent", {}),
]


@pytest.mark.parametrize("op,direction,layout,states,attrs", CASES,
                         ids=[f"{c[0]}-{c[1]}-layout{c[2]}-{c[3]}-{'lbr' + str(c[4].get('linear_before_reset', 0))}"
                              if c[0] == "GRU" else f"{c[0]}-{c[1]}-layout{c[2]}-{c[3]}" for c in CASES])
def test_one_node_on_cpu(tmp_path, monkeypatch, op, direction, layout, states, attrs):
    import onnx
    from opcompiler.graph import executor
    t, b, i, h = 5, 3, 6, 7
    nd = 2 if direction == "bidirectional" else 1
    x = np.zeros((b, t, i) if layout else (t, b, i), np.float32)
    ins = [x, *_weights(op, nd, i, h, bias=states != "absent"), None]
    runtime = ("X",)
    if states != "absent":
        ins += _states(op, nd, b, h, layout)
        if states == "runtime":
            runtime += ("initial_h", "initial_c")
    p = tmp_path / "rnn.onnx"
    node_attrs = {"direction": direction, **attrs}
    onnx.save(one_node(op, {**node_attrs, "layout": layout}, ins, runtime=runtime, outputs=("Y", "Y_h")), str(p))
    if layout:  # onnxruntime runs no layout=1 node: the reference is the layout-0 node on transposed values
        swap = lambda a: None if a is None or a.ndim != 3 else a.transpose(1, 0, 2)  # noqa: E731
        seq_first = one_node(op, node_attrs, [swap(ins[0]), *ins[1:4], None, *map(swap, ins[5:])], runtime=runtime,
                             outputs=("Y", "Y_h"))

        def reference(plan, feeds):
            sess = executor.ort_session(seq_first)
            y, yh = sess.run(["Y", "Y_h"], {k: swap(np.asarray(v, np.float32)) for k, v in feeds.items()})
            return {"Y": y.transpose(2, 0, 1, 3), "Y_h": yh.transpose(1, 0, 2)}
        monkeypatch.setattr(executor, "reference", reference)
    run = run_plan(make_plan(load(p), "cpu"))
    assert run.correct, run.max_abs_err
    assert [(g.op, g.params["reverse"]) for g in _recurrent_groups(run.plan)] == \
        [(op.lower(), int(direction == "reverse")), (op.lower(), 1)][:nd]
    if op == "GRU":
        assert {g.params["lbr"] for g in _recurrent_groups(run.plan)} == {attrs.get("linear_before_reset", 0)}


@pytest.mark.parametrize("op,attrs,extra,match", [
    ("GRU", {"clip": 1.0}, {}, "GRU with clip or non-default activations"),
    ("GRU", {"activations": ["Relu", "Tanh"]}, {}, "GRU with clip or non-default activations"),
    ("LSTM", {"input_forget": 1}, {}, "LSTM with clip, input_forget or non-default activations"),
    ("GRU", {}, {"seq": True}, "GRU with sequence_lens"),
    ("LSTM", {}, {"seq": True}, "LSTM with sequence_lens or peepholes"),
])
def test_refusals_are_one_line(tmp_path, op, attrs, extra, match):
    import onnx
    t, b, i, h = 3, 2, 4, 5
    ins = [np.zeros((t, b, i), np.float32), *_weights(op, 1, i, h, bias=True)]
    ins.append(np.full((b,), t, np.int32) if extra.get("seq") else None)
    p = tmp_path / "rnn.onnx"
    m = one_node(op, {"direction": "forward", **attrs}, ins, outputs=("Y",))
    onnx.save(m, str(p))
    with pytest.raises(OpcError, match=match) as e:
        make_plan(load(p), "cpu")
    assert "\n" not in str(e.value)
