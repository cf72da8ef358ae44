"""The gru op: its numpy reference against torch.nn.GRU (linear_before_reset=1, forward and the
reverse half of a bidirectional GRU) and against onnxruntime's GRU node (linear_before_reset 0
and 1, forward and reverse), the cpu template against the reference, workload validation."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

OP = get_op("gru")
TOL = dict(atol=1e-5, rtol=1e-5)  # fp32 reference vs fp32 torch / onnxruntime / the cpu kernel


def _inputs(wl, seed=1):
    return [(a * 0.5).astype(wl.dtype) for a in OP.make_inputs(wl, seed=seed)]


def _torch_rows(a: np.ndarray, h: int) -> np.ndarray:
    """ONNX's z, r, n gate rows (axis 0) in torch's r, z, n order."""
    return np.concatenate([a[h:2 * h], a[:h], a[2 * h:]])


@pytest.mark.parametrize("reverse", [0, 1])
def test_reference_matches_torch_gru(reverse):
    torch = pytest.importorskip("torch")
    t, b, i, h = 5, 3, 7, 6
    wl = workload("gru", f"t={t},b={b},i={i},h={h},reverse={reverse}", dtype="float32")
    x, w, r, bias, h0 = _inputs(wl)
    m = torch.nn.GRU(i, h, bidirectional=bool(reverse))
    sfx = "_l0_reverse" if reverse else "_l0"
    with torch.no_grad():
        getattr(m, "weight_ih" + sfx).copy_(torch.from_numpy(_torch_rows(w[0], h)))
        getattr(m, "weight_hh" + sfx).copy_(torch.from_numpy(_torch_rows(r[0], h)))
        getattr(m, "bias_ih" + sfx).copy_(torch.from_numpy(_torch_rows(bias[0, :3 * h], h)))
        getattr(m, "bias_hh" + sfx).copy_(torch.from_numpy(_torch_rows(bias[0, 3 * h:], h)))
        hx = torch.from_numpy(np.concatenate([h0, h0]) if reverse else h0)
        y, _ = m(torch.from_numpy(x), hx)
    want = y.numpy()[..., h:] if reverse else y.numpy()  # the reverse direction's half of a bidirectional GRU
    np.testing.assert_allclose(OP.reference(wl, [x, w, r, bias, h0]), want, **TOL)


def _ort_rnn(op_type: str, attrs: dict, ins: list[np.ndarray]) -> np.ndarray:
    """Y (t, b, h) of one ONNX node in onnxruntime, on the op's inputs."""
    pytest.importorskip("onnxruntime")
    from zoo.recurrent import one_node_y
    return one_node_y(op_type, attrs, [*ins[:4], None, *ins[4:]])  # sequence_lens absent


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_reference_matches_onnxruntime_gru(lbr, reverse):
    wl = workload("gru", f"t=4,b=2,i=5,h=6,reverse={reverse},lbr={lbr}", dtype="float32")
    ins = _inputs(wl, seed=2)
    got = _ort_rnn("GRU", {"linear_before_reset": lbr, "direction": "reverse" if reverse else "forward"}, ins)
    np.testing.assert_allclose(OP.reference(wl, ins), got, **TOL)


@pytest.mark.parametrize("shape", ["t=4,b=3,i=20,h=24", "t=6,b=2,i=9,h=16,lbr=0", "t=3,b=5,i=8,h=8,reverse=1",
                                   "t=5,b=2,i=12,h=10,reverse=1,lbr=0", "t=1,b=1,i=3,h=4"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cpu_template(shape, dtype):
    be = get_backend(load_target("cpu"))
    wl = workload("gru", shape, dtype=dtype)
    ins = _inputs(wl)
    got = be.run(be.build(wl), ins).outputs[0]
    tol = TOL if dtype == "float32" else dict(atol=2e-3, rtol=2e-3)  # fp16 storage of Y, fp32 gates
    np.testing.assert_allclose(got.astype(np.float32), OP.reference(wl, ins).astype(np.float32), **tol)


def test_defaults_and_validation():
    wl = workload("gru", dtype="float32")
    assert dict(wl.params) == {"t": 100, "b": 64, "i": 512, "h": 512, "reverse": 0, "lbr": 1}
    assert [n for n, _, _ in OP.inputs(wl)] == ["X", "W", "R", "B", "h0"]
    assert OP.output_spec(workload("gru", "t=3,b=2,i=4,h=5"))[0] == (3, 2, 5)
    for bad in ("reverse=2", "lbr=-1", "h=0"):
        with pytest.raises(OpcError):
            workload("gru", f"t=2,b=1,i=2,h=2,{bad}")


def test_weights_drawn_as_torch_initialises_them():
    wl = workload("gru", "t=2,b=2,i=8,h=16", dtype="float32")
    _, w, r, b, _ = OP.make_inputs(wl, seed=0)
    for a in (w, r, b):
        assert np.abs(a).max() <= 0.25 + 1e-7 and np.abs(a).max() > 0.2  # U(-1/sqrt(16), 1/sqrt(16))
