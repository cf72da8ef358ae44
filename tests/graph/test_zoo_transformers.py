"""The test-owned transformer models (tests/zoo/transformers.py: a BERT-style encoder, a ViT, a
WMT-style encoder-decoder with a causal mask, a ConvNeXt-style CNN) through `opcompiler compare`
with an empty log directory, no fallback, every plan checked against onnxruntime; and where the
attention kernel is, its scores stay on chip (one attention kernel per attention block, the
head-split transposes folded into it)."""
from __future__ import annotations

import json

import pytest

from opcompiler.cli import main
from zoo.transformers import export

CASES = [("vit", "cpu"), ("vit", "ascend-sim"), ("vit", "dsp-sim"),
         ("bert_encoder", "cpu"), ("bert_encoder", "ascend-sim"), ("bert_encoder", "dsp-sim"),
         ("encoder_decoder", "ascend-sim"), ("convnext", "ascend-sim"), ("convnext", "dsp-sim")]
ATTENTION_BLOCKS = {"vit": 2, "bert_encoder": 2, "encoder_decoder": 3, "convnext": 0}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tzoo")
    return {m: export(m, d)[0] for m in ATTENTION_BLOCKS}


@pytest.mark.parametrize("model,target", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_compare_no_fallback(models, model, target, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path))  # an empty log directory: template defaults only
    rc = main(["compare", str(models[model]), "--target", target, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err.strip().splitlines()[-1:]
    d = json.loads(out)
    assert d["correct"] == {"fused": True, "unfused": True, "cost": True}
    for plan in ("fused", "unfused"):
        assert d[plan]["totals"]["host_nodes"] == 0
    fused_ops = [k["op"] for k in d["fused"]["kernels"]]
    assert fused_ops.count("attention") == ATTENTION_BLOCKS[model]
    assert "attention" not in [k["op"] for k in d["unfused"]["kernels"]]
    base = "seconds" if target == "cpu" else "cycles"
    if target != "cpu":
        assert d["fused"]["totals"][base] < d["unfused"]["totals"][base]
