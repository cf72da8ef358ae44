"""Recurrent operators, one layer each in ONNX semantics (sequence first, one direction):
`lstm` and `gru`.

Shape keys: `t` (steps), `b` (batch), `i` (input size), `h` (hidden size) and `reverse` (0: the
recurrence runs from step 0 up to t-1; 1: from t-1 down to 0, ONNX's reverse direction, Y[s]
still the h computed at input position s). A bidirectional ONNX node is two kernels, one each way.

`lstm`: inputs as ONNX orders them: X (t, b, i), W (1, 4h, i), R (1, 4h, h), B (1, 8h) (Wb then
Rb), initial h0 and c0 (1, b, h); the gates in ONNX order i, o, f, c (torch's nn.LSTM orders
them i, f, g, o). The output is every hidden state, Y (t, b, h) (ONNX's Y (t, 1, b, h) without its
direction axis). Gate math in fp32:

    g = x_t W^T + h_{t-1} R^T + Wb + Rb;  i, o, f = sigmoid(g_i, g_o, g_f);  c~ = tanh(g_c)
    c_t = f * c_{t-1} + i * c~;  h_t = o * tanh(c_t)

`gru` (also key `lbr`, ONNX's linear_before_reset, 1 as torch exports it): X (t, b, i), W (1, 3h, i),
R (1, 3h, h), B (1, 6h) (Wb then Rb), h0 (1, b, h); the gates in ONNX order z, r, n (torch's
nn.GRU orders them r, z, n). Y (t, b, h), every h_t. In fp32:

    z = sigmoid(x Wz^T + Wbz + h Rz^T + Rbz);  r = sigmoid(x Wr^T + Wbr + h Rr^T + Rbr)
    lbr=1: n = tanh(x Wn^T + Wbn + r * (h Rn^T + Rbn));  lbr=0: n = tanh(x Wn^T + Wbn + (r * h) Rn^T + Rbn)
    h_t = (1 - z) * n + z * h_{t-1}
"""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

LSTM_DEFAULTS = {"t": 100, "b": 64, "i": 512, "h": 512, "reverse": 0}
LSTM_DTYPES = ("float16", "float32")
GRU_DEFAULTS = {"t": 100, "b": 64, "i": 512, "h": 512, "reverse": 0, "lbr": 1}
GRU_DTYPES = ("float16", "float32")


def _validate(wl: Workload) -> None:
    for key in ("t", "b", "i", "h"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    for key in ("reverse", "lbr"):
        if key in wl.p and wl[key] not in (0, 1):
            raise OpcError("must be 0 or 1", arg=key, value=wl[key])


def _positions(wl: Workload) -> list[int]:
    """The input positions in the order the recurrence visits them."""
    t = wl["t"]
    return list(range(t - 1, -1, -1)) if wl.p.get("reverse", 0) else list(range(t))


def _inputs(wl: Workload) -> list:
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    dt = wl.dtype
    return [("X", (t, b, i), dt), ("W", (1, 4 * h, i), dt), ("R", (1, 4 * h, h), dt), ("B", (1, 8 * h), dt),
            ("h0", (1, b, h), dt), ("c0", (1, b, h), dt)]


def _sigmoid(x):
    return te.const(1.0, "float32") / (te.const(1.0, "float32") + te.exp(-x))


def _x_proj(X, W, wl: Workload, gates: int):
    """x W^T for every step at once: (t, b, gates*h), fp32."""
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    ri = te.reduce_axis((0, i), name="ri")
    return te.compute((t, b, gates * h), lambda s, n, g: te.sum(X[s, n, ri].astype("float32")
                                                                * W[0, g, ri].astype("float32"), axis=ri),
                      name="x_proj")


def _gather_steps(hs_at: list, wl: Workload, name: str, tag: str):
    """Y (t, b, h): the h computed at each input position, by a balanced select over the steps'
    h (depth log2 t)."""
    t, b, h = wl["t"], wl["b"], wl["h"]

    def pick(s, n, u, lo, hi):
        if hi - lo == 1:
            return hs_at[lo][n, u]
        mid = (lo + hi) // 2
        return te.if_then_else(s < mid, pick(s, n, u, lo, mid), pick(s, n, u, mid, hi))

    return te.compute((t, b, h), lambda s, n, u: pick(s, n, u, 0, t).astype(wl.dtype), name=name, tag=tag)


def _compute(wl: Workload):
    """The input projection as one GEMM over all steps, then the cell unrolled step by step
    (TE has no recurrence that `create_prim_func` takes), Y gathered from the steps' h."""
    X, W, R, B, h0, c0 = ins = placeholders(_inputs(wl))
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    acc = "float32"
    xp = _x_proj(X, W, wl, 4)

    def step(s: int, pos: int, hp, cp):
        rh = te.reduce_axis((0, h), name=f"rh{s}")
        prev = (lambda n, k: h0[0, n, k].astype(acc)) if hp is None else (lambda n, k: hp[n, k])
        hsum = te.compute((b, 4 * h), lambda n, g: te.sum(prev(n, rh) * R[0, g, rh].astype(acc), axis=rh),
                          name=f"h_proj{s}")
        gates = te.compute((b, 4 * h), lambda n, g: xp[pos, n, g] + hsum[n, g] + B[0, g].astype(acc)
                           + B[0, 4 * h + g].astype(acc), name=f"gates{s}")
        c_old = (lambda n, u: c0[0, n, u].astype(acc)) if cp is None else (lambda n, u: cp[n, u])
        c = te.compute((b, h), lambda n, u: _sigmoid(gates[n, 2 * h + u]) * c_old(n, u)
                       + _sigmoid(gates[n, u]) * te.tanh(gates[n, 3 * h + u]), name=f"c{s}")
        hn = te.compute((b, h), lambda n, u: _sigmoid(gates[n, h + u]) * te.tanh(c[n, u]), name=f"h{s}")
        return hn, c

    hs_at: list = [None] * t
    hp, cp = None, None
    for s, pos in enumerate(_positions(wl)):
        hp, cp = step(s, pos, hp, cp)
        hs_at[pos] = hp
    return ins, _gather_steps(hs_at, wl, "lstm_out", "lstm")


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def lstm_reference(wl: Workload, ins) -> np.ndarray:
    """numpy, fp32 gates (ONNX gate order i, o, f, c)."""
    x, w, r, bias, h0, c0 = (a.astype(np.float32) for a in ins)
    hdim = wl["h"]
    w, r = w[0], r[0]
    bsum = bias[0, :4 * hdim] + bias[0, 4 * hdim:]
    h, c = h0[0], c0[0]
    ys = [None] * wl["t"]
    for s in _positions(wl):
        g = x[s] @ w.T + h @ r.T + bsum
        gi, go, gf, gc = (g[:, k * hdim:(k + 1) * hdim] for k in range(4))
        c = _sig(gf) * c + _sig(gi) * np.tanh(gc)
        h = _sig(go) * np.tanh(c)
        ys[s] = h
    return np.stack(ys).astype(wl.dtype)


def _flops(wl: Workload) -> int:
    """2 t b 4h (i + h) for the products + per step 4h bias adds and ~ 4 per gate element
    (activations counted as one each) + 5 per cell element (c and h updates)."""
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    return 2 * t * b * 4 * h * (i + h) + t * b * (4 * h * 2 + 5 * h)


register_op(OpDef(
    name="lstm", summary="one LSTM layer, ONNX semantics, one direction (t, b, i, h, reverse): Y = every h_t",
    family="recurrent", defaults=LSTM_DEFAULTS, dtypes=LSTM_DTYPES, compute_fn=_compute,
    reference_fn=lstm_reference, input_specs=_inputs, flops_fn=_flops, validate_fn=_validate,
))


# -- gru ---------------------------------------------------------------------------------------

def _gru_inputs(wl: Workload) -> list:
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    dt = wl.dtype
    return [("X", (t, b, i), dt), ("W", (1, 3 * h, i), dt), ("R", (1, 3 * h, h), dt), ("B", (1, 6 * h), dt),
            ("h0", (1, b, h), dt)]


def _gru_compute(wl: Workload):
    """As lstm's: x W^T one GEMM over all steps (`x_proj`), then per step `h_proj{s}` = h R^T
    (all three gates with lbr=1; z and r with lbr=0, which adds `rh{s}` = r * h and
    `n_proj{s}` = (r * h) Rn^T) and the new h (`h{s}`), z, r and n computed in it."""
    X, W, R, B, h0 = ins = placeholders(_gru_inputs(wl))
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    lbr = wl["lbr"]
    acc = "float32"
    xp = _x_proj(X, W, wl, 3)
    wb = lambda g: B[0, g].astype(acc)  # noqa: E731
    rb = lambda g: B[0, 3 * h + g].astype(acc)  # noqa: E731

    def step(s: int, pos: int, hp):
        prev = (lambda n, k: h0[0, n, k].astype(acc)) if hp is None else (lambda n, k: hp[n, k])
        rk = te.reduce_axis((0, h), name=f"rk{s}")
        hsum = te.compute((b, (3 if lbr else 2) * h),
                          lambda n, g: te.sum(prev(n, rk) * R[0, g, rk].astype(acc), axis=rk), name=f"h_proj{s}")

        def gate(n, u, k):  # z (k=0) or r (k=1)
            g = k * h + u
            return _sigmoid(xp[pos, n, g] + wb(g) + hsum[n, g] + rb(g))

        if lbr:
            def cand(n, u):
                g = 2 * h + u
                return te.tanh(xp[pos, n, g] + wb(g) + gate(n, u, 1) * (hsum[n, g] + rb(g)))
        else:
            rh = te.compute((b, h), lambda n, u: gate(n, u, 1) * prev(n, u), name=f"rh{s}")
            rk2 = te.reduce_axis((0, h), name=f"rn{s}")
            nproj = te.compute((b, h), lambda n, u: te.sum(rh[n, rk2] * R[0, 2 * h + u, rk2].astype(acc), axis=rk2),
                               name=f"n_proj{s}")

            def cand(n, u):
                g = 2 * h + u
                return te.tanh(xp[pos, n, g] + wb(g) + nproj[n, u] + rb(g))

        def new_h(n, u):
            z = gate(n, u, 0)
            return (te.const(1.0, acc) - z) * cand(n, u) + z * prev(n, u)

        return te.compute((b, h), new_h, name=f"h{s}")

    hs_at: list = [None] * t
    hp = None
    for s, pos in enumerate(_positions(wl)):
        hp = step(s, pos, hp)
        hs_at[pos] = hp
    return ins, _gather_steps(hs_at, wl, "gru_out", "gru")


def gru_reference(wl: Workload, ins) -> np.ndarray:
    """numpy, fp32 gates (ONNX gate order z, r, n)."""
    x, w, r, bias, h0 = (a.astype(np.float32) for a in ins)
    hd = wl["h"]
    w, r = w[0], r[0]
    wb, rb = bias[0, :3 * hd], bias[0, 3 * hd:]
    h = h0[0]
    ys = [None] * wl["t"]
    for s in _positions(wl):
        xg = x[s] @ w.T + wb
        hg = h @ r[:2 * hd].T + rb[:2 * hd]
        z = _sig(xg[:, :hd] + hg[:, :hd])
        rr = _sig(xg[:, hd:2 * hd] + hg[:, hd:])
        if wl["lbr"]:
            n = np.tanh(xg[:, 2 * hd:] + rr * (h @ r[2 * hd:].T + rb[2 * hd:]))
        else:
            n = np.tanh(xg[:, 2 * hd:] + (rr * h) @ r[2 * hd:].T + rb[2 * hd:])
        h = (1.0 - z) * n + z * h
        ys[s] = h
    return np.stack(ys).astype(wl.dtype)


def _gru_flops(wl: Workload) -> int:
    """2 t b 3h (i + h) for the products + per step ~ 4 per gate element (two bias adds, the
    hidden product's add, the activation) + 4 per h element (r's product, the update's three)."""
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    return 2 * t * b * 3 * h * (i + h) + t * b * (3 * h * 4 + 4 * h)


register_op(OpDef(
    name="gru", summary="one GRU layer, ONNX semantics, one direction (t, b, i, h, reverse, lbr): Y = every h_t",
    family="recurrent", defaults=GRU_DEFAULTS, dtypes=GRU_DTYPES, compute_fn=_gru_compute,
    reference_fn=gru_reference, input_specs=_gru_inputs, flops_fn=_gru_flops, validate_fn=_validate,
))
