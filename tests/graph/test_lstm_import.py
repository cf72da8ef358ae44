"""ONNX LSTM (as torch.onnx writes nn.LSTM(batch_first=True): a Transpose, the LSTM node with its
initial states, Y_h read for the last hidden state) lowers to one `lstm` kernel: values against
onnxruntime on cpu, ascend-sim and dsp-sim (skipped where `opcompiler.ops.limits` declares the
target cannot run it). Directions, layouts, GRU and multi-layer models: test_recurrent_import.py."""
from __future__ import annotations

import pytest

from opcompiler.graph import load, make_plan, run_plan
from opcompiler.ops.limits import unsupported


@pytest.fixture(scope="module")
def lstm_model(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Sentiment(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = torch.nn.LSTM(16, 24, batch_first=True), torch.nn.Linear(24, 1)

        def forward(self, x):
            _, (h, _) = self.lstm(x)
            return torch.sigmoid(self.fc(h[-1]))

    p = tmp_path_factory.mktemp("lstm") / "lstm.onnx"
    torch.onnx.export(Sentiment().eval(), (torch.randn(2, 6, 16),), str(p), opset_version=17, input_names=["x"],
                      output_names=["y"], dynamo=False)
    return load(p)


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_lstm_is_one_kernel(lstm_model, target):
    plan = make_plan(lstm_model, target)
    (g,) = [g for g in plan.groups if g.op == "lstm"]
    assert dict(g.params) == {"t": 6, "b": 2, "i": 16, "h": 24, "reverse": 0}
    if (lim := unsupported("lstm", plan.target.family, dict(g.params), plan.dtype)) is not None:
        pytest.skip(f"lstm on {target}: {lim.text} ({lim.why})")
    run = run_plan(plan)
    assert run.correct, run.max_abs_err
    ops = [k.op for k in run.kernels if k.op != "view"]
    assert ops.count("lstm") == 1 and "host" not in [k.where for k in run.kernels]
