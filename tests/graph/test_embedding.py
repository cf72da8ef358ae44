"""Token-id models (nn.Embedding) import whole: the ONNX Gather of runtime int64 ids into a
constant table is one `gather` kernel on cpu, ascend-sim and dsp-sim, no --fallback; the model's
output matches onnxruntime. Any other node reading an integer tensor is still refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan, run_plan

torch = pytest.importorskip("torch")


class _Imdb(torch.nn.Module):
    """IMDB-style: token ids (batch, tokens) -> nn.Embedding(1000, 64) -> a Linear per kind."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.emb = torch.nn.Embedding(1000, 64)
        self.fc = torch.nn.Linear(64 * 32 if kind == "flatten" else 64, 2)

    def forward(self, ids):
        e = self.emb(ids)
        return self.fc(e.flatten(1) if self.kind == "flatten" else e)


@pytest.fixture(scope="module", params=["linear", "flatten"])
def imdb(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("emb") / f"imdb_{request.param}.onnx"
    torch.onnx.export(_Imdb(request.param).eval(), (torch.randint(0, 1000, (4, 32), dtype=torch.int64),), str(path),
                      opset_version=17, dynamo=False, input_names=["ids"], output_names=["logits"])
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_an_embedding_model_runs_whole_on_the_target(imdb, target):
    g = load(imdb)
    assert g.dtype("ids") == "int64"
    plan = make_plan(g, target)  # no fallback
    run = run_plan(plan)
    assert run.correct, run.max_abs_err
    assert not run.on_host()
    ops = [k.op for k in run.on_target()]
    assert ops[0] == "gather" and any(o.startswith("matmul") for o in ops[1:])  # the Linear reads the rows


def _ids_model(path, second: str):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="embed")]
    if second == "unsqueeze":  # an integer tensor computed from the ids
        nodes.append(helper.make_node("Unsqueeze", ["ids", "ax"], ["y"], name="second"))
        out = helper.make_tensor_value_info("y", TensorProto.INT64, [2, 8, 1])
    else:  # a lookup into a runtime (computed) tensor
        nodes += [helper.make_node("Relu", ["e"], ["r"], name="relu"),
                  helper.make_node("Gather", ["r", "ids"], ["y"], axis=0, name="second")]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 8, 16])
    table = numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table")
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 8])], [out],
                          initializer=[table, numpy_helper.from_array(np.array([2], np.int64), "ax")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("second,op", [("unsqueeze", "Unsqueeze"), ("gather", "Gather")])
def test_other_nodes_reading_integer_tensors_stay_refused(tmp_path, second, op):
    """Only a Gather of a constant table takes the ids; any other reader is refused in one line."""
    with pytest.raises(OpcError, match=rf"node 'second' \({op}\): {op} of the integer tensor 'ids'"):
        make_plan(load(_ids_model(tmp_path / "ids.onnx", second)), "ascend-sim")


class _Bag(torch.nn.Module):
    """A bag-of-words classifier as users write it: nn.Embedding, then the sum (or mean) over the
    tokens (EmbeddingBag written out: `emb(ids).sum(1)`), a Linear."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.emb = torch.nn.Embedding(1000, 64)
        self.fc = torch.nn.Linear(64, 3)

    def forward(self, ids):
        e = self.emb(ids)
        return self.fc(e.sum(1) if self.kind == "sum" else e.mean(dim=1))


@pytest.fixture(scope="module", params=["sum", "mean"])
def bag_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("bag") / f"bag_{request.param}.onnx"
    torch.onnx.export(_Bag(request.param).eval(), (torch.randint(0, 1000, (8, 12), dtype=torch.int64),), str(path),
                      opset_version=17, dynamo=False, input_names=["ids"], output_names=["logits"])
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_a_summed_bag_fuses_with_its_lookup(bag_model, target):
    """The sum over the tokens folds into the lookup: one `gather` kernel with bag=12 writes one row per
    sample (no transpose, no reduction kernel); the unfused plan runs the lookup, a transpose and a row
    reduction, and both match onnxruntime."""
    g = load(bag_model)
    fused = run_plan(make_plan(g, target))
    assert fused.correct, fused.max_abs_err
    gathers = [k for k in fused.on_target() if k.op == "gather"]
    assert len(gathers) == 1 and not [k for k in fused.on_target() if k.op in ("transpose", "reduce_sum")]
    plan = make_plan(g, target)
    bag = [grp for grp in plan.groups if grp.op == "gather"][0]
    assert dict(bag.params)["bag"] == 12 and dict(bag.params)["n"] == 96
    unfused = run_plan(make_plan(g, target, fused=False))
    assert unfused.correct, unfused.max_abs_err
    ops = [k.op for k in unfused.on_target()]
    assert ops[:3] == ["gather", "transpose", "reduce_sum"]


class _EmbBag(torch.nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        torch.manual_seed(0)
        self.eb = torch.nn.EmbeddingBag(300, 16, mode=mode)
        self.fc = torch.nn.Linear(16, 2)

    def forward(self, ids, offsets=None):
        return self.fc(self.eb(ids, offsets))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_nn_embeddingbag_imports_and_sums_fuse_into_the_lookup(tmp_path, mode, target):
    """torch exports nn.EmbeddingBag over a (batch, bag) id tensor as an ONNX Loop over the bags; with
    bags of one length the importer rewrites it as the lookup of the (batch, bag) ids and a reduction
    over axis 1, so sum and mean fold into one gather kernel with `bag`; max runs as a lookup and a
    row reduction. Checked against onnxruntime running the exported Loop."""
    path = tmp_path / f"eb_{mode}.onnx"
    torch.onnx.export(_EmbBag(mode).eval(), (torch.randint(0, 300, (8, 5)),), str(path), opset_version=17,
                      dynamo=False, input_names=["ids"])
    g = load(path)
    assert "Loop" not in [n.op_type for n in g.nodes]
    run = run_plan(make_plan(g, target))
    assert run.correct, run.max_abs_err
    gathers = [k for k in make_plan(g, target).groups if k.op == "gather"]
    assert len(gathers) == 1 and dict(gathers[0].params).get("bag", 1) == (1 if mode == "max" else 5)


def test_nn_embeddingbag_with_runtime_offsets_is_refused_in_one_line(tmp_path):
    """Bags whose bounds come from an offsets input (different lengths) stay a Loop: refused in one
    line naming the node and saying what imports."""
    path = tmp_path / "eb_off.onnx"
    torch.onnx.export(_EmbBag("sum").eval(), (torch.randint(0, 300, (20,)), torch.tensor([0, 3, 9, 15])), str(path),
                      opset_version=17, dynamo=False, input_names=["ids", "offsets"])
    with pytest.raises(OpcError) as e:
        load(path)
    msg = str(e.value)
    assert "\n" not in msg and "(Loop)" in msg and "EmbeddingBag" in msg and "offsets" in msg
