"""ONNX LSTM (as torch.onnx writes nn.LSTM(batch_first=True): a Transpose, the LSTM node with its
initial states, Y_h read for the last hidden state) lowers to one `lstm` kernel: values against
onnxruntime on cpu and ascend-sim; dsp-sim has no lstm template and says so in one line, and runs
it on the host with --fallback cpu."""
from __future__ import annotations

import pytest

from opcompiler.errors import OpcError
from opcompiler.graph import load, make_plan, run_plan


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


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_lstm_is_one_kernel(lstm_model, target):
    run = run_plan(make_plan(lstm_model, target))
    assert run.correct, run.max_abs_err
    ops = [k.op for k in run.kernels if k.op != "view"]
    assert ops.count("lstm") == 1 and "host" not in [k.where for k in run.kernels]
    (g,) = [g for g in run.plan.groups if g.op == "lstm"]
    assert dict(g.params) == {"t": 6, "b": 2, "i": 16, "h": 24}


def test_dsp_refuses_in_one_line_and_falls_back(lstm_model):
    with pytest.raises(OpcError, match="no dsp template for the recurrent family") as e:
        run_plan(make_plan(lstm_model, "dsp-sim"))
    assert "\n" not in str(e.value)
    assert run_plan(make_plan(lstm_model, "dsp-sim", fallback="cpu")).correct
