"""Recurrent operators: `lstm`, one LSTM layer (ONNX LSTM, forward direction, sequence first).

Shape keys: `t` (steps), `b` (batch), `i` (input size), `h` (hidden size). Inputs as ONNX orders
them: X (t, b, i), W (1, 4h, i), R (1, 4h, h), B (1, 8h) (Wb then Rb), initial h0 and c0 (1, b, h);
the gates in ONNX order i, o, f, c (torch's nn.LSTM orders them i, f, g, o). The output is every
hidden state, Y (t, b, h) (ONNX's Y (t, 1, b, h) without its direction axis). Gate math in fp32:

    g = x_t W^T + h_{t-1} R^T + Wb + Rb;  i, o, f = sigmoid(g_i, g_o, g_f);  c~ = tanh(g_c)
    c_t = f * c_{t-1} + i * c~;  h_t = o * tanh(c_t)
"""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

LSTM_DEFAULTS = {"t": 100, "b": 64, "i": 512, "h": 512}
LSTM_DTYPES = ("float16", "float32")


def _validate(wl: Workload) -> None:
    for key in ("t", "b", "i", "h"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])


def _inputs(wl: Workload) -> list:
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    dt = wl.dtype
    return [("X", (t, b, i), dt), ("W", (1, 4 * h, i), dt), ("R", (1, 4 * h, h), dt), ("B", (1, 8 * h), dt),
            ("h0", (1, b, h), dt), ("c0", (1, b, h), dt)]


def _sigmoid(x):
    return te.const(1.0, "float32") / (te.const(1.0, "float32") + te.exp(-x))


def _compute(wl: Workload):
    """The input projection as one GEMM over all steps, then the cell unrolled step by step
    (TE has no recurrence that `create_prim_func` takes), Y gathered from the steps' h."""
    X, W, R, B, h0, c0 = ins = placeholders(_inputs(wl))
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    acc, dt = "float32", wl.dtype
    ri = te.reduce_axis((0, i), name="ri")
    xp = te.compute((t, b, 4 * h), lambda s, n, g: te.sum(X[s, n, ri].astype(acc) * W[0, g, ri].astype(acc), axis=ri),
                    name="x_proj")
    def step(s: int, hp, cp):
        rh = te.reduce_axis((0, h), name=f"rh{s}")
        prev = (lambda n, k: h0[0, n, k].astype(acc)) if hp is None else (lambda n, k: hp[n, k])
        hsum = te.compute((b, 4 * h), lambda n, g: te.sum(prev(n, rh) * R[0, g, rh].astype(acc), axis=rh),
                          name=f"h_proj{s}")
        gates = te.compute((b, 4 * h), lambda n, g: xp[s, n, g] + hsum[n, g] + B[0, g].astype(acc)
                           + B[0, 4 * h + g].astype(acc), name=f"gates{s}")
        c_old = (lambda n, u: c0[0, n, u].astype(acc)) if cp is None else (lambda n, u: cp[n, u])
        c = te.compute((b, h), lambda n, u: _sigmoid(gates[n, 2 * h + u]) * c_old(n, u)
                       + _sigmoid(gates[n, u]) * te.tanh(gates[n, 3 * h + u]), name=f"c{s}")
        hn = te.compute((b, h), lambda n, u: _sigmoid(gates[n, h + u]) * te.tanh(c[n, u]), name=f"h{s}")
        return hn, c

    hs, hp, cp = [], None, None
    for s in range(t):
        hp, cp = step(s, hp, cp)
        hs.append(hp)

    def pick(s, n, u, lo, hi):  # a balanced select over the steps' h (depth log2 t)
        if hi - lo == 1:
            return hs[lo][n, u]
        mid = (lo + hi) // 2
        return te.if_then_else(s < mid, pick(s, n, u, lo, mid), pick(s, n, u, mid, hi))

    out = te.compute((t, b, h), lambda s, n, u: pick(s, n, u, 0, t).astype(dt), name="lstm_out", tag="lstm")
    return ins, out


def lstm_reference(wl: Workload, ins) -> np.ndarray:
    """numpy, fp32 gates (ONNX gate order i, o, f, c)."""
    x, w, r, bias, h0, c0 = (a.astype(np.float32) for a in ins)
    hdim = wl["h"]
    w, r = w[0], r[0]
    bsum = bias[0, :4 * hdim] + bias[0, 4 * hdim:]
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    h, c = h0[0], c0[0]
    ys = []
    for s in range(wl["t"]):
        g = x[s] @ w.T + h @ r.T + bsum
        gi, go, gf, gc = (g[:, k * hdim:(k + 1) * hdim] for k in range(4))
        c = sig(gf) * c + sig(gi) * np.tanh(gc)
        h = sig(go) * np.tanh(c)
        ys.append(h)
    return np.stack(ys).astype(wl.dtype)


def _flops(wl: Workload) -> int:
    """2 t b 4h (i + h) for the products + per step 4h bias adds and ~ 4 per gate element
    (activations counted as one each) + 5 per cell element (c and h updates)."""
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    return 2 * t * b * 4 * h * (i + h) + t * b * (4 * h * 2 + 5 * h)


register_op(OpDef(
    name="lstm", summary="one LSTM layer, ONNX semantics, forward (t, b, i, h): Y = every h_t",
    family="recurrent", defaults=LSTM_DEFAULTS, dtypes=LSTM_DTYPES, compute_fn=_compute,
    reference_fn=lstm_reference, input_specs=_inputs, flops_fn=_flops, validate_fn=_validate,
))
