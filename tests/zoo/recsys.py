"""Recommender models as users write them in torch.nn, owned by the tests (issue 34's Criteo-style
click-through models), small enough for CI.

    deepfm       DeepFM: 10 sparse fields (vocabulary 100 each) through one shared nn.Embedding
                 with per-field id offsets (`ids + offsets`), embedding dim 16; a first-order term
                 (a one-wide nn.Embedding summed over the fields), the FM second-order term
                 0.5 * sum_d((sum_f e)^2 - sum_f e^2), an MLP 160-64-32-1 on the flattened
                 embeddings, and a sigmoid (int64 ids (batch, fields))
    wide_deep    wide & deep: the same sparse fields and offsets plus 13 dense float features; the
                 wide part the first-order embedding sum plus a Linear of the dense features, the
                 deep part an MLP on [flattened embeddings, dense] (two inputs: ids, dense)

`export(name, out_dir, batch)` writes the ONNX file (torch.onnx, TorchScript exporter, opset 17)
and returns (path, feeds): the ids in every field's vocabulary [0, VOCAB), so ids + offsets
address the field's own rows of the shared table.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

FIELDS, VOCAB, DIM, DENSE = 10, 100, 16, 13


class _Sparse(nn.Module):
    """The fields' ids into one shared table (and a one-wide first-order table) by offsets."""

    def __init__(self, fields: int, vocab: int, dim: int):
        super().__init__()
        self.emb = nn.Embedding(fields * vocab, dim)
        self.lin = nn.Embedding(fields * vocab, 1)
        self.register_buffer("offsets", torch.arange(fields, dtype=torch.int64)[None] * vocab)

    def forward(self, x):
        ids = x + self.offsets  # (batch, fields): field f's ids start at row f * vocab
        return self.emb(ids), self.lin(ids).sum(1)  # (batch, fields, dim), (batch, 1)


class DeepFM(nn.Module):
    def __init__(self, fields: int = FIELDS, vocab: int = VOCAB, dim: int = DIM):
        super().__init__()
        self.sparse = _Sparse(fields, vocab, dim)
        self.bias = nn.Parameter(torch.zeros(1))
        self.mlp = nn.Sequential(nn.Linear(fields * dim, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                 nn.Linear(32, 1))

    def forward(self, x):
        e, first = self.sparse(x)
        square_of_sum = e.sum(1).pow(2)  # (batch, dim)
        sum_of_squares = e.pow(2).sum(1)
        fm = 0.5 * (square_of_sum - sum_of_squares).sum(1, keepdim=True)  # (batch, 1)
        return torch.sigmoid(first + self.bias + fm + self.mlp(e.flatten(1)))


class WideDeep(nn.Module):
    def __init__(self, fields: int = FIELDS, vocab: int = VOCAB, dim: int = DIM, dense: int = DENSE):
        super().__init__()
        self.sparse = _Sparse(fields, vocab, dim)
        self.wide = nn.Linear(dense, 1)
        self.mlp = nn.Sequential(nn.Linear(fields * dim + dense, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                 nn.Linear(32, 1))

    def forward(self, x, dense):
        e, first = self.sparse(x)
        deep = self.mlp(torch.cat([e.flatten(1), dense], 1))
        return torch.sigmoid(first + self.wide(dense) + deep)


MODELS = {"deepfm": DeepFM, "wide_deep": WideDeep}


def build(name: str, batch: int = 8, seed: int = 0) -> tuple[nn.Module, dict[str, np.ndarray]]:
    """The model (eval, seeded weights; the tables scaled as trained CTR embeddings are, small)
    and its feeds."""
    torch.manual_seed(seed)
    model = MODELS[name]().eval()
    with torch.no_grad():
        model.sparse.emb.weight.mul_(0.1)
        model.sparse.lin.weight.mul_(0.1)
    rng = np.random.default_rng(seed)
    feeds = {"ids": rng.integers(0, VOCAB, size=(batch, FIELDS)).astype(np.int64)}
    if name == "wide_deep":
        feeds["dense"] = rng.standard_normal((batch, DENSE)).astype(np.float32)
    return model, feeds


def export(name: str, out_dir: str | Path, batch: int = 8, opset: int = 17) -> tuple[Path, dict[str, np.ndarray]]:
    model, feeds = build(name, batch)
    path = Path(out_dir) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), dynamo=False,
                          opset_version=opset, input_names=list(feeds), output_names=["ctr"])
    return path, feeds
