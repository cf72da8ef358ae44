"""Recurrent models as users write them in torch.nn, owned by the tests, small enough for CI, and
one-node ONNX recurrent models built by hand (the directions and layouts torch never writes).

    sentiment_lstm   IMDB-style sentiment classifier: nn.Embedding(1000, 64) -> a 2-layer
                     nn.LSTM(64, 64, batch_first=True) -> the last step -> Linear -> Sigmoid
                     (int64 token ids, batch 2, 12 tokens)
    sentiment_gru    the GRU variant: nn.Embedding(1000, 32) -> a 2-layer bidirectional
                     nn.GRU(32, 32) (sequence first) -> both directions' final hidden states
                     concatenated -> Linear (int64 token ids, 10 tokens, batch 3)
    bilstm_tagger    a float-input bidirectional nn.LSTM(16, 24) tagger: every step's two hidden
                     states -> Linear per step, and the final hidden states as a second output
                     (sequence first, 8 steps, batch 2)

`export(name, path)` writes the ONNX file (torch.onnx, TorchScript exporter, opset 14) and returns
(path, feeds). `one_node(op_type, attrs, ins, ...)` builds a single LSTM / GRU node model;
`one_node_y` runs one in onnxruntime.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

VOCAB = 1000


class SentimentLSTM(nn.Module):
    def __init__(self, d: int = 64, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return torch.sigmoid(self.fc(out[:, -1]))


class SentimentGRU(nn.Module):
    def __init__(self, d: int = 32, hidden: int = 32, layers: int = 2, classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.gru = nn.GRU(d, hidden, num_layers=layers, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, ids):  # ids (seq, batch)
        _, h = self.gru(self.emb(ids))
        return self.fc(torch.cat([h[-2], h[-1]], dim=1))


class BiLSTMTagger(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 24, tags: int = 5):
        super().__init__()
        self.lstm = nn.LSTM(d, hidden, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, x):  # x (seq, batch, d)
        out, (h, _) = self.lstm(x)
        return self.fc(out), h


MODELS = ("sentiment_lstm", "sentiment_gru", "bilstm_tagger")


def build(name: str, seed: int = 0) -> tuple[nn.Module, dict[str, np.ndarray]]:
    """(model in eval mode, its example feeds by input name)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed + 1)
    if name == "sentiment_lstm":
        return SentimentLSTM().eval(), {"ids": rng.integers(0, VOCAB, (2, 12)).astype(np.int64)}
    if name == "sentiment_gru":
        return SentimentGRU().eval(), {"ids": rng.integers(0, VOCAB, (10, 3)).astype(np.int64)}
    if name == "bilstm_tagger":
        return BiLSTMTagger().eval(), {"x": rng.standard_normal((8, 2, 16)).astype(np.float32)}
    raise KeyError(f"no recurrent zoo model {name!r} (have: {', '.join(MODELS)})")


def export(name: str, out_dir: str | Path, opset: int = 14) -> tuple[Path, dict[str, np.ndarray]]:
    model, feeds = build(name)
    path = Path(out_dir) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), dynamo=False,
                          opset_version=opset, input_names=list(feeds), output_names=None)
    return path, feeds


def one_node(op_type: str, attrs: dict, ins: list[np.ndarray | None], *, runtime: tuple[str, ...] = ("X",),
             outputs: tuple[str, ...] = ("Y",), opset: int = 14):
    """A model of one `op_type` (LSTM or GRU) node: inputs in ONNX order (None: absent; X, W, R,
    B, sequence_lens, initial_h[, initial_c]), those named in `runtime` graph inputs, the rest
    initializers; `outputs` among Y, Y_h (, Y_c), typed with the shapes ONNX gives them."""
    from onnx import TensorProto, helper, numpy_helper
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"][:len(ins)]
    names = [n if a is not None else "" for n, a in zip(names, ins)]
    while names and not names[-1]:
        names.pop()
    arrays = dict(zip(names, ins))
    h = int(arrays["R"].shape[-1])
    nd = int(arrays["W"].shape[0])
    batch_first = int(attrs.get("layout", 0)) == 1
    x = arrays["X"]
    t, b = (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
    shapes = {"Y": (b, t, nd, h) if batch_first else (t, nd, b, h),
              "Y_h": (b, nd, h) if batch_first else (nd, b, h)}
    shapes["Y_c"] = shapes["Y_h"]
    node = helper.make_node(op_type, names, list(outputs), hidden_size=h, **attrs)
    g = helper.make_graph(
        [node], op_type.lower(),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, arrays[n].shape) for n in names if n in runtime],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs],
        [numpy_helper.from_array(arrays[n] if n == "sequence_lens" else np.asarray(arrays[n], np.float32), n)
         for n in names if n and n not in runtime])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def one_node_y(op_type: str, attrs: dict, ins: list[np.ndarray | None]) -> np.ndarray:
    """Y of a one-direction node run in onnxruntime, without its direction axis: (t, b, h)."""
    import onnxruntime as ort
    m = one_node(op_type, attrs, ins)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": np.asarray(ins[0], np.float32)})[0][:, 0]
