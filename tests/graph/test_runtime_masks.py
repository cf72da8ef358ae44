"""Masks given at run time, and Softmax / LogSoftmax on any axis (issue 33), against onnxruntime on
cpu, ascend-sim and dsp-sim with no fallback and no host node.

A bool / int graph input that only mask ops read (Cast, Equal, Not, Where's condition, views,
Expand) is a mask: the plan stores it as floats when it is fed, Where(c, a, b) is b + c (a - b)
(masked_fill's -inf kept finite at -3e4; on scores that a softmax reads, an additive mask, so the
attention kernel keeps it) and a runtime operand broadcast to the scores is copied by `concat`
kernels. LogSoftmax is the softmax then the `ln` chain step; a softmax over another axis than the
last runs between two transposes."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opcompiler.errors import OpcError
from opcompiler.graph import compare, load
from opcompiler.graph.executor import make_inputs
from opcompiler.graph.translate import mask_values, translate
from opcompiler.graph.plan import make_plan

torch = pytest.importorskip("torch")
nn = torch.nn

TARGETS = ("cpu", "ascend-sim", "dsp-sim")
B, S, D = 2, 8, 32


class PaddedEncoder(nn.Module):  # nn.TransformerEncoderLayer with src_key_padding_mask (bool, True: padding)
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)

    def forward(self, x, pad):
        return self.layer(x, src_key_padding_mask=pad)


class MaskedFill(nn.Module):  # scores.masked_fill(mask == 0, -inf): Equal, Cast, Where -> softmax (attention)
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x, mask):
        s = self.q(x) @ self.k(x).transpose(1, 2) / D ** 0.5
        return torch.softmax(s.masked_fill(mask == 0, float("-inf")), -1) @ x


class HfMask(nn.Module):  # HF's extended mask: (1 - mask[:, None, :].float()) * -10000 added to the scores
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)

    def forward(self, x, mask):
        ext = (1.0 - mask[:, None, :].to(torch.float32)) * -10000.0
        return torch.softmax(self.q(x) @ x.transpose(1, 2) + ext, -1)


class FillZero(nn.Module):  # x.masked_fill(~keep, 0) with keep (B, 1, S) broadcast: Not, Where's general form
    def forward(self, x, keep):
        return torch.relu(x.transpose(1, 2)).masked_fill(~keep, 0.0) * 2.0


class LogSoftmaxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, 10)

    def forward(self, x):
        return torch.log_softmax(self.fc(x), -1)


class SoftmaxAxis1(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, 1)


def _feeds(name):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    if name == "padded_encoder":
        pad = np.zeros((B, S), bool)
        pad[0, 5:] = True
        return PaddedEncoder(), {"x": x, "pad": pad}
    if name == "masked_fill":
        mask = np.ones((B, S, S), np.int64)
        mask[1, :, 6:] = 0
        mask[0, 3, :2] = 0
        return MaskedFill(), {"x": x, "mask": mask}
    if name == "hf_mask":
        mask = np.ones((B, S), np.int64)
        mask[0, 6:] = 0
        return HfMask(), {"x": x, "mask": mask}
    if name == "fill_zero":
        keep = np.ones((B, 1, S), bool)
        keep[1, 0, 3:] = False
        return FillZero(), {"x": x, "keep": keep}
    if name == "log_softmax":
        return LogSoftmaxHead(), {"x": x}
    return SoftmaxAxis1(), {"x": x}


MODELS = ("padded_encoder", "masked_fill", "hf_mask", "fill_zero", "log_softmax", "softmax_axis1")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("masks")
    out = {}
    for name in MODELS:
        torch.manual_seed(0)
        model, feeds = _feeds(name)
        path = d / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model.eval(), tuple(torch.from_numpy(v) for v in feeds.values()), str(path),
                              dynamo=False, opset_version=17, input_names=list(feeds))
        out[name] = path
    return out


CASES = [(m, t) for m in MODELS for t in TARGETS]


@pytest.mark.parametrize("model,target", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_matches_onnxruntime_with_no_host_node(exported, model, target):
    c = compare(load(exported[model]), target, cost_plan=False)  # make_inputs: masks keep and mask in every row
    assert c.fused.correct and c.unfused.correct, (c.fused.max_abs_err, c.unfused.max_abs_err)
    assert not c.fused.on_host() and not c.unfused.on_host()
    ops = [k.op for k in c.fused.kernels]
    if model in ("padded_encoder", "masked_fill"):  # the runtime mask is the attention kernel's mask input
        assert ops.count("attention") == 1
        attn = next(g for g in c.fused.plan.groups if g.op == "attention")
        assert attn.params["mask"] == 2
    if model == "log_softmax":
        assert "softmax" in ops and "ew_chain" in ops
    if model == "softmax_axis1":
        assert ops.count("transpose") == 2 and ops.count("softmax") == 1


def test_explicit_masks_match_and_are_stored_as_floats(exported):
    """The feeds torch was exported with (a padded sequence, a fully kept one): the mask inputs
    are recognised as masks and the outputs match on the fp16 target."""
    from opcompiler.graph.executor import run_plan
    for name in ("padded_encoder", "masked_fill", "hf_mask"):
        g = load(exported[name])
        _, feeds = _feeds(name)
        mask = [n for n in feeds if n != "x"][0]
        assert mask in mask_values(g)
        run = run_plan(make_plan(g, "ascend-sim"), feeds)
        assert run.correct, (name, run.max_abs_err)


def test_random_masks_keep_and_mask_a_position_in_every_row(exported):
    plan = make_plan(load(exported["masked_fill"]), "cpu")
    m = make_inputs(plan, seed=2)["mask"]
    assert m.dtype == np.int64 and set(np.unique(m)) == {0, 1}
    assert (m.max(-1) == 1).all() and (m.min(-1) == 0).all()


def _onnx(tmp_path, name, nodes, ins, out_shape, opset, inits=()):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in ins],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializer=list(inits))
    p = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(p))
    return p


@pytest.mark.parametrize("op,axis,opset", [("LogSoftmax", 1, 11), ("Softmax", 0, 11), ("LogSoftmax", 0, 13),
                                           ("Softmax", -2, 13), ("LogSoftmax", 1, 13)])
def test_softmax_and_log_softmax_on_any_axis(tmp_path, op, axis, opset):
    """Opset < 13 flattens at `axis` ((2, 3*5) rows for axis 1); from 13 on one axis (moved last)."""
    p = _onnx(tmp_path, f"{op}{axis}_{opset}", [helper.make_node(op, ["x"], ["y"], axis=axis)],
              [("x", TensorProto.FLOAT, [2, 3, 5])], [2, 3, 5], opset)
    for target in ("ascend-sim", "dsp-sim"):
        c = compare(load(p), target, cost_plan=False)
        assert c.fused.correct and c.unfused.correct, (target, c.fused.max_abs_err)
        assert not c.fused.on_host()


def test_integer_mask_chain_equal_not_cast(tmp_path):
    """Equal(m, 2) of an int mask, Not, Cast int -> bool (any nonzero is true), and Where with a
    runtime value in both branches, on dsp-sim and ascend-sim."""
    nodes = [helper.make_node("Equal", ["m", "two"], ["e"]), helper.make_node("Not", ["e"], ["ne"]),
             helper.make_node("Cast", ["m"], ["mb"], to=TensorProto.BOOL),
             helper.make_node("Where", ["ne", "x", "z"], ["w"]),
             helper.make_node("Where", ["mb", "w", "x"], ["y"])]
    p = _onnx(tmp_path, "intmask", nodes, [("x", TensorProto.FLOAT, [2, 6]), ("z", TensorProto.FLOAT, [2, 6]),
                                           ("m", TensorProto.INT64, [2, 6])], [2, 6], 17,
              [onnx.numpy_helper.from_array(np.array(2, np.int64), "two")])
    g = load(p)
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(2, 6) - 5, "z": np.full((2, 6), 7.0, np.float32),
             "m": np.array([[0, 1, 2, 3, -2, 2], [2, 0, 0, 5, 2, 1]], np.int64)}
    from opcompiler.graph.executor import run_plan
    for target in ("ascend-sim", "dsp-sim"):
        run = run_plan(make_plan(g, target), feeds)
        assert run.correct and not run.on_host(), (target, run.max_abs_err)


def test_what_is_still_refused_is_one_line(tmp_path):
    """An int input that a Gather also reads is token ids, not a mask: the Equal reading it stays on
    the host (`--fallback cpu`); Where choosing between integer tensors is refused too."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("Equal", ["ids", "zero"], ["pad"], name="is_pad"),
             helper.make_node("Unsqueeze", ["pad", "ax"], ["pad3"]),
             helper.make_node("Where", ["pad3", "ninf", "e"], ["y"])]
    p = _onnx(tmp_path, "idsmask", nodes, [("ids", TensorProto.INT64, [2, 4])], [2, 4, 8], 17,
              [onnx.numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table"),
               onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
               onnx.numpy_helper.from_array(np.array([[[-np.inf]]], np.float32), "ninf"),
               onnx.numpy_helper.from_array(np.array([2], np.int64), "ax")])
    g = load(p)
    assert "ids" not in mask_values(g)
    with pytest.raises(OpcError, match=r"node 'is_pad' \(Equal\): Equal of the integer tensor 'ids'") as e:
        translate(g)
    assert "\n" not in str(e.value)
    prims, _, _ = translate(g, fallback="cpu")
    assert [p.onnx_op for p in prims if p.kind == "host"] == ["Equal", "Unsqueeze", "Where"]
