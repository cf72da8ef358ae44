"""Criteo-style recommenders (tests/zoo/recsys.py: DeepFM, wide & deep) run whole on cpu,
ascend-sim and dsp-sim with no --fallback, fused and unfused, matching onnxruntime.

What they need: the integer Add of per-field id offsets (`x + offsets`, read only by the
embedding lookups) folds into each `gather` (its `fields` key: the kernel adds offsets[i % F] to
the index it reads); the FM term's ReduceSum over the field axis (axis 1 of (batch, fields, dim))
is a transpose and a row reduction. An integer Add that cannot fold is still refused in one line.

Tolerances (absolute, on the sigmoid output in (0, 1)): cpu and dsp-sim compute in fp32, 1e-5;
ascend-sim stores every tensor in fp16 (the embeddings, the FM sums, the MLP activations), 2e-3.
The graph's own check (`GraphRun.correct`, GRAPH_TOLERANCE per dtype) must pass as well."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan, run_plan

torch = pytest.importorskip("torch")
from zoo.recsys import FIELDS, VOCAB, export  # noqa: E402  (needs torch)

TARGETS = ("cpu", "ascend-sim", "dsp-sim")
ATOL = {"cpu": 1e-5, "ascend-sim": 2e-3, "dsp-sim": 1e-5}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("recsys")
    return {name: export(name, d) for name in ("deepfm", "wide_deep")}


def _ort(path, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["deepfm", "wide_deep"])
def test_runs_whole_on_the_target(models, name, target, fused):
    path, feeds = models[name]
    plan = make_plan(load(path), target, fused=fused)  # no fallback
    assert not [g for g in plan.groups if g.op == "host"]
    run = run_plan(plan, feeds)
    assert run.correct, run.max_abs_err
    assert not run.on_host()
    got, want = run.outputs["ctr"].astype(np.float64), _ort(path, feeds).astype(np.float64)
    assert got.shape == want.shape == (8, 1)
    assert np.abs(got - want).max() <= ATOL[target]
    gathers = [k for k in run.on_target() if k.op == "gather"]
    assert len(gathers) == 2  # the field embeddings and the first-order weights, each one kernel
    ops = [k.op for k in run.on_target()]
    if name == "deepfm":  # the FM term: one fused reduction chain (`fm_interaction`); unfused, its two sums
        # over the fields are a transpose and a row reduction each (and the first-order bag sum a third)
        assert ops.count("fm_interaction") == (1 if fused else 0)
        assert ops.count("transpose") == (0 if fused else 3)
    views = {g.outputs[0]: g.inputs[0] for g in plan.groups if g.op == "view"}
    bags = []
    for g in plan.groups:
        if g.op == "gather":  # the offsets folded in: ten fields, the ids (flat) as the model takes them
            assert dict(g.params)["fields"] == FIELDS and views[g.inputs[1]] == "ids"
            bags.append(dict(g.params).get("bag", 1))
    # the first-order term `lin(ids).sum(1)` is an EmbeddingBag: its sum over the fields folds into
    # the lookup (one row of 1 value per sample leaves the kernel); unfused it is its own kernels
    assert sorted(bags) == ([1, FIELDS] if fused else [1, 1])


def test_the_offsets_are_the_models(models):
    """The folded offsets are the model's buffer (field f starts at row f * VOCAB) and the ids
    reach the kernel unchanged: no integer arithmetic on the host."""
    path, _ = models["deepfm"]
    plan = make_plan(load(path), "ascend-sim")
    g = next(g for g in plan.groups if g.op == "gather")
    off = plan.constants[g.inputs[2]]
    assert off.dtype == np.int64 and off.tolist() == [f * VOCAB for f in range(FIELDS)]


def test_compare_cli_no_fallback(models, capsys, tmp_path, monkeypatch):
    """`opcompiler compare deepfm.onnx --target ascend-sim`: both plans on the target, correct."""
    from opcompiler.cli import main

    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path))
    rc = main(["compare", str(models["deepfm"][0]), "--target", "ascend-sim", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err.strip().splitlines()[-1:]
    d = json.loads(out)
    assert d["correct"] == {"fused": True, "unfused": True, "cost": True}
    for plan in ("fused", "unfused"):
        assert d[plan]["totals"]["host_nodes"] == 0


# -- hand-made graphs: what folds, what is refused ---------------------------------------------------

def _ids_add(path, readers: str, offsets=None):
    """ids (2, 4) int64 + a constant, read by a Gather of a constant table (and, per `readers`, by
    something else)."""
    rng = np.random.default_rng(0)
    off = np.array([[0, 10, 20, 30]], np.int64) if offsets is None else offsets
    nodes = [helper.make_node("Add", ["ids", "off"], ["s"], name="offset"),
             helper.make_node("Gather", ["table", "s"], ["e"], axis=0, name="embed")]
    outs = [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4, 8])]
    if readers == "output":  # the shifted ids are also a graph output
        outs.append(helper.make_tensor_value_info("s", TensorProto.INT64, [2, 4]))
    elif readers == "unsqueeze":  # another reader of the shifted ids
        nodes.append(helper.make_node("Unsqueeze", ["s", "ax"], ["u"], name="other"))
        outs.append(helper.make_tensor_value_info("u", TensorProto.INT64, [2, 4, 1]))
    elif readers == "runtime":  # ids + ids: nothing constant to fold
        nodes[0] = helper.make_node("Add", ["ids", "ids"], ["s"], name="offset")
    inits = [numpy_helper.from_array(rng.standard_normal((40, 8)).astype(np.float32), "table"),
             numpy_helper.from_array(off, "off"), numpy_helper.from_array(np.array([2], np.int64), "ax")]
    g = helper.make_graph(nodes, "ids_add", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 4])], outs,
                          initializer=inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("offsets,fields", [(None, 4), (np.array(5, np.int64), 1),
                                            (np.array([[0], [20]], np.int64), 8)],
                         ids=["per-field", "scalar", "per-row"])
@pytest.mark.parametrize("target", TARGETS)
def test_an_id_offset_add_folds_into_the_gather(tmp_path, target, offsets, fields):
    """Any constant the ids broadcast with: its flattened pattern's period is the `fields` key
    (per field: 4; a scalar: 1; one offset per row of ids: the whole (2, 4), 8)."""
    g = load(_ids_add(tmp_path / "f.onnx", "gather", offsets))
    plan = make_plan(g, target)
    (k,) = [x for x in plan.groups if x.op == "gather"]
    assert dict(k.params)["fields"] == fields
    feeds = {"ids": np.random.default_rng(1).integers(0, 10, size=(2, 4)).astype(np.int64)}
    run = run_plan(plan, feeds)
    assert run.correct and not run.on_host()


@pytest.mark.parametrize("readers", ["output", "unsqueeze", "runtime"])
def test_an_integer_add_that_cannot_fold_is_refused_in_one_line(tmp_path, readers):
    with pytest.raises(OpcError) as e:
        make_plan(load(_ids_add(tmp_path / "r.onnx", readers)), "ascend-sim")
    msg = str(e.value)
    assert "\n" not in msg and "node 'offset' (Add): Add of the integer tensor 'ids'" in msg


def _reduce_model(path, op: str, axes: list[int], keepdims: int, shape=(3, 5, 6, 4)):
    out_shape = [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims, name="red") if op == "ReduceSum" else \
        helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims, name="red")
    g = helper.make_graph([node], "red", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          initializer=[numpy_helper.from_array(np.array(axes, np.int64), "axes")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("op,axes,keepdims", [("ReduceSum", [1], 0), ("ReduceSum", [1, 2], 1),
                                              ("ReduceMean", [0], 0), ("ReduceMax", [2], 1)])
@pytest.mark.parametrize("target", TARGETS)
def test_a_reduction_over_middle_axes_runs_on_the_target(tmp_path, target, op, axes, keepdims):
    plan = make_plan(load(_reduce_model(tmp_path / "m.onnx", op, axes, keepdims)), target)
    assert [g.op for g in plan.groups if g.op != "view"][:1] == ["transpose"]
    run = run_plan(plan)
    assert run.correct and not run.on_host()


def test_a_reduction_over_scattered_axes_is_refused_in_one_line(tmp_path):
    with pytest.raises(OpcError) as e:
        make_plan(load(_reduce_model(tmp_path / "s.onnx", "ReduceSum", [0, 2], 0)), "ascend-sim")
    msg = str(e.value)
    assert "\n" not in msg and "ReduceSum over axes [0, 2] of a 4-D tensor" in msg


class _Fm(torch.nn.Module):
    """The FM term as users write it, in three spellings: pow, products, keepdim sums (+ a variant
    whose field sum is also read by another node: no fold, the chain runs as it is written)."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.emb = torch.nn.Embedding(200, 8)

    def forward(self, ids):
        e = self.emb(ids)  # (batch, fields, 8)
        if self.kind == "pow":
            return 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1, keepdim=True)
        if self.kind == "mul":
            s = e.sum(dim=1, keepdim=True)
            return (s * s - (e * e).sum(dim=1, keepdim=True)).sum(2)
        s = e.sum(1)
        return (s.pow(2) - e.pow(2).sum(1)) + s  # s read twice


@pytest.mark.parametrize("kind,folded", [("pow", True), ("mul", True), ("shared", False)])
@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_fm_spellings(tmp_path, kind, folded, target):
    path = tmp_path / f"fm_{kind}.onnx"
    torch.onnx.export(_Fm(kind).eval(), (torch.randint(0, 200, (6, 5), dtype=torch.int64),), str(path),
                      opset_version=17, dynamo=False, input_names=["ids"], output_names=["y"])
    for fused in (True, False):
        run = run_plan(make_plan(load(path), target, fused=fused))
        assert run.correct, run.max_abs_err
        assert [k.op for k in run.on_target()].count("fm_interaction") == int(folded and fused)
