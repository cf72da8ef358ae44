"""The lstm op: its numpy reference against torch.nn.LSTM (forward, and the reverse half of a
bidirectional LSTM) and onnxruntime's LSTM node (forward and reverse), the cpu template and the fused
ascend-sim kernel against the reference, the two clocks, and the kernel's GM traffic."""
from __future__ import annotations

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend.program import DataMove
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

OP = get_op("lstm")


def _inputs(wl, seed=1):
    return [(a * 0.3).astype(wl.dtype) for a in OP.make_inputs(wl, seed=seed)]


def test_reference_matches_torch_lstm():
    torch = pytest.importorskip("torch")
    wl = workload("lstm", "t=5,b=3,i=7,h=6", dtype="float32")
    x, w, r, b, h0, c0 = _inputs(wl)
    m = torch.nn.LSTM(7, 6)
    hh = 6
    perm = np.concatenate([np.arange(0, hh), np.arange(2 * hh, 3 * hh), np.arange(3 * hh, 4 * hh),
                           np.arange(hh, 2 * hh)])  # torch's i, f, g, o rows from ONNX's i, o, f, c
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.from_numpy(w[0][perm]))
        m.weight_hh_l0.copy_(torch.from_numpy(r[0][perm]))
        m.bias_ih_l0.copy_(torch.from_numpy(b[0, :4 * hh][perm]))
        m.bias_hh_l0.copy_(torch.from_numpy(b[0, 4 * hh:][perm]))
        y, _ = m(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    np.testing.assert_allclose(OP.reference(wl, [x, w, r, b, h0, c0]), y.numpy(), atol=1e-5, rtol=1e-5)


def test_reverse_reference_matches_torch_bidirectional_lstm():
    torch = pytest.importorskip("torch")
    wl = workload("lstm", "t=5,b=3,i=7,h=6,reverse=1", dtype="float32")
    x, w, r, b, h0, c0 = _inputs(wl)
    m = torch.nn.LSTM(7, 6, bidirectional=True)
    hh = 6
    perm = np.concatenate([np.arange(0, hh), np.arange(2 * hh, 3 * hh), np.arange(3 * hh, 4 * hh),
                           np.arange(hh, 2 * hh)])
    with torch.no_grad():
        m.weight_ih_l0_reverse.copy_(torch.from_numpy(w[0][perm]))
        m.weight_hh_l0_reverse.copy_(torch.from_numpy(r[0][perm]))
        m.bias_ih_l0_reverse.copy_(torch.from_numpy(b[0, :4 * hh][perm]))
        m.bias_hh_l0_reverse.copy_(torch.from_numpy(b[0, 4 * hh:][perm]))
        two = lambda a: torch.from_numpy(np.concatenate([a, a]))  # noqa: E731
        y, _ = m(torch.from_numpy(x), (two(h0), two(c0)))
    np.testing.assert_allclose(OP.reference(wl, [x, w, r, b, h0, c0]), y.numpy()[..., hh:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reverse", [0, 1])
def test_reference_matches_onnxruntime_lstm(reverse):
    pytest.importorskip("onnxruntime")
    from zoo.recurrent import one_node_y
    wl = workload("lstm", f"t=4,b=2,i=5,h=6,reverse={reverse}", dtype="float32")
    ins = _inputs(wl, seed=2)
    got = one_node_y("LSTM", {"direction": "reverse" if reverse else "forward"}, [*ins[:4], None, *ins[4:]])
    np.testing.assert_allclose(OP.reference(wl, ins), got, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", ["t=4,b=3,i=20,h=24", "t=5,b=2,i=9,h=16,reverse=1"])
def test_cpu_template(shape):
    be = get_backend(load_target("cpu"))
    wl = workload("lstm", shape, dtype="float32")
    ins = _inputs(wl)
    np.testing.assert_allclose(be.run(be.build(wl), ins).outputs[0], OP.reference(wl, ins), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,cfg", [
    ("t=4,b=20,i=40,h=48", {"batch_tile": 16, "hidden_tile": 16, "hidden_split": 1, "block_dim": 2}),  # padding, 2 batch tiles
    ("t=3,b=16,i=64,h=64", None),  # the derived default
])
def test_ascend_values_and_clocks(shape, cfg):
    be = get_backend(load_target("ascend-sim"))
    wl = workload("lstm", shape, dtype="float16")
    ins = _inputs(wl)
    kern = be.build(wl, cfg)
    res = be.run(kern, ins)
    np.testing.assert_allclose(res.outputs[0].astype(np.float32), OP.reference(wl, ins).astype(np.float32),
                               atol=1e-2, rtol=1e-2)
    assert res.cycles == be.measure(kern).cycles > 0


def test_ascend_gm_traffic_is_inputs_once_and_y():
    be = get_backend(load_target("ascend-sim"))
    wl = workload("lstm", "t=3,b=16,i=32,h=32", dtype="float16")
    plan = be.build(wl, {"batch_tile": 16, "hidden_tile": 16, "hidden_split": 1, "block_dim": 1}).artifact.plan
    gm = plan.pack(_inputs(wl))
    prog = plan.make_program(0)
    read, written = {}, {}
    for ins in prog.instrs:
        if isinstance(ins, DataMove) and ins.path[0] == "GM":
            read[ins.src.name] = read.get(ins.src.name, 0) + ins.nbytes
        if isinstance(ins, DataMove) and ins.path[1] == "GM":
            written[ins.dst.name] = written.get(ins.dst.name, 0) + ins.nbytes
    assert prog.info["gm_inputs"] == ("X", "W", "R", "B", "H0", "C0")
    assert read == {k: v.nbytes for k, v in gm.items()}  # every input once, weights resident in L1
    assert written == {"Y": 3 * 16 * 32 * 2}  # the hidden states and nothing else
