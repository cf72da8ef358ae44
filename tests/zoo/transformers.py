"""Transformer models as users write them in torch.nn, owned by the tests (seed 000's Transformer
workload and the issue's four user models), small enough for CI at size "ci".

    bert_encoder       token + position embeddings, LayerNorm, nn.TransformerEncoder (post-norm,
                       GELU), a tanh pooler: the BERT-style encoder (int64 token ids)
    vit                patch embedding (a strided Conv), a class token, position embeddings,
                       pre-norm encoder layers, a classifier head (float image)
    encoder_decoder    nn.Transformer with source and target token embeddings and a causal target
                       mask: the WMT-style encoder-decoder (two int64 inputs)
    convnext           a ConvNeXt-style CNN: 7x7 depthwise convs, LayerNorm over channels-last
                       activations, an inverted-bottleneck MLP with GELU, residuals

`export(name, path, size)` writes the ONNX file (torch.onnx, TorchScript exporter, opset 17) and
returns the feeds used to check it.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

VOCAB = 1000


class BertEncoder(nn.Module):
    def __init__(self, d: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pool = nn.Linear(d, d)
        self.register_buffer("positions", torch.arange(seq)[None])

    def forward(self, ids):
        x = self.ln(self.tok(ids) + self.pos(self.positions))
        h = self.enc(x)
        return h, torch.tanh(self.pool(h[:, 0]))


class ViT(nn.Module):
    def __init__(self, img: int, patch: int, d: int, heads: int, layers: int, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, activation="gelu",
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1) + self.pos
        return self.head(self.ln(self.enc(t))[:, 0])


class EncoderDecoder(nn.Module):
    def __init__(self, d: int, heads: int, layers: int):
        super().__init__()
        self.src, self.tgt = nn.Embedding(VOCAB, d), nn.Embedding(VOCAB, d)
        self.tr = nn.Transformer(d, heads, layers, layers, 2 * d, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.tr(self.src(src), self.tgt(tgt), tgt_mask=mask))


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(nn.functional.gelu(self.fc1(self.ln(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, c: int, blocks: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.blocks = nn.Sequential(*[ConvNeXtBlock(c) for _ in range(blocks)])
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, classes)

    def forward(self, x):
        y = self.blocks(self.stem(x)).mean((2, 3))
        return self.head(self.ln(y))


SIZES = {  # name -> size -> (constructor kwargs, input builder)
    "bert_encoder": {"ci": dict(d=64, heads=4, layers=2, seq=32), "full": dict(d=768, heads=12, layers=12, seq=128)},
    "vit": {"ci": dict(img=32, patch=8, d=64, heads=4, layers=2), "full": dict(img=224, patch=16, d=768, heads=12,
                                                                               layers=12)},
    "encoder_decoder": {"ci": dict(d=64, heads=4, layers=1), "full": dict(d=512, heads=8, layers=6)},
    "convnext": {"ci": dict(c=32, blocks=2), "full": dict(c=96, blocks=3)},
}
MODELS = tuple(SIZES)


def build(name: str, size: str = "ci", seed: int = 0) -> tuple[nn.Module, dict[str, np.ndarray]]:
    """(model in eval mode, its example feeds by input name)."""
    torch.manual_seed(seed)
    kw = SIZES[name][size]
    rng = np.random.default_rng(seed + 1)
    if name == "bert_encoder":
        return BertEncoder(**kw).eval(), {"ids": rng.integers(0, VOCAB, (1, kw["seq"])).astype(np.int64)}
    if name == "vit":
        return ViT(**kw).eval(), {"x": rng.standard_normal((1, 3, kw["img"], kw["img"])).astype(np.float32)}
    if name == "encoder_decoder":
        return EncoderDecoder(**kw).eval(), {"src": rng.integers(0, VOCAB, (1, 12)).astype(np.int64),
                                             "tgt": rng.integers(0, VOCAB, (1, 10)).astype(np.int64)}
    return ConvNeXt(**kw).eval(), {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}


def export(name: str, out_dir: str | Path, size: str = "ci", opset: int = 17) -> tuple[Path, dict[str, np.ndarray]]:
    model, feeds = build(name, size)
    path = Path(out_dir) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), dynamo=False,
                          opset_version=opset, input_names=list(feeds), output_names=None)
    return path, feeds
