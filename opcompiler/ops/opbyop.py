"""What an op-by-op framework runs for one recurrent layer: its primitive kernels, step by step.

Seed 000 §5.3.3 explains why an RNN is slow on the NPU as frameworks run it: every step's gate
matmul leaves the AI Core for global memory, comes back for the vector unit's activations, and
the next step waits on it. This module writes that execution down as catalogue kernels (each its
own kernel, every intermediate through GM), so the unfused plan of a model with an LSTM / GRU
node (`opcompiler.graph.unroll`) and the single-operator study (`benchmarks/seed000_ops.py`) run
and time exactly it:

    once      x_proj = X (t*b, i) @ W^T (i, G*h)                  (the input projection, hoisted
                                                                   as cuDNN and the fused cell do)
    per step  x_s    = rows s*b .. (s+1)*b of x_proj              (a view: a contiguous range)
              hr     = h_{s-1} (b, h) @ R^T (h, G*h)               (matmul)
              LSTM: g = hr + x_s + bias; i, o, f, c~ = 4 slices of g;
                    sigmoid x 3, tanh; f*c, i*c~, add -> c; tanh(c); o * tanh(c) -> h
              GRU (linear_before_reset = 1, torch's): hr + Rb; 3 slices of x_s and of hr;
                    z = sigmoid(x_z + h_z), r = sigmoid(x_r + h_r), n = tanh(x_n + r * h_n)
                    (mul, then add;tanh), h = n + z * (h_{s-1} - n) (sub, mul, add)
                    (linear_before_reset = 0: z and r from h R_zr^T, then (r * h) R_n^T, a
                    second matmul per step, the biases added as full-size operands)
    once      Y = the steps' h stacked (a balanced tree of pairwise concats along the rows)

`decompose(op, params)` gives the kernels with their data flow: inputs name the layer's own
inputs (X, W, R, B, h0, c0), a constant derived from them (`derived`: W^T, R^T, the summed
biases) or an earlier kernel's output. `steps(op, params)` counts the distinct kernels.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

GATES = {"lstm": 4, "gru": 3}


@dataclass(frozen=True)
class Kernel:
    """One primitive kernel: catalogue op, params, inputs (names), output name and shape."""

    op: str
    params: Mapping[str, Any]
    inputs: tuple[str, ...]
    output: str
    shape: tuple[int, ...]


@dataclass
class Decomposition:
    kernels: list[Kernel] = field(default_factory=list)
    # name -> (source, shape, offset): the source's elements [offset, offset + size) in `shape`
    views: dict[str, tuple[str, tuple[int, ...], int]] = field(default_factory=dict)
    derived: dict[str, Callable[[Mapping[str, np.ndarray]], np.ndarray]] = field(default_factory=dict)
    output: str = "Y"

    def emit(self, op: str, params: Mapping[str, Any], inputs: tuple[str, ...], output: str,
             shape: tuple[int, ...]) -> str:
        self.kernels.append(Kernel(op, dict(params), tuple(inputs), output, tuple(shape)))
        return output


def rows_ew(rows: int, cols: int, chain: str) -> dict:
    """ew_chain params over a 2-D (rows, cols) value (channels last: a `bias` is per column)."""
    return {"n": 1, "c": cols, "h": 1, "w": rows, "layout": "NHWC", "chain": chain}


def _cols(d: Decomposition, src: str, shape: tuple[int, int], start: int, end: int, out: str) -> str:
    """Columns start .. end of a 2-D value: a `slice` kernel (a strided copy)."""
    return d.emit("slice", {"dims": f"{shape[0]}x{shape[1]}", "axis": 1, "start": start, "end": end}, (src,),
                  out, (shape[0], end - start))


def _stack(d: Decomposition, parts: list[str], b: int, h: int) -> str:
    """Y (t*b, h) from the steps' (b, h) values: pairwise concats along the rows, a balanced tree."""
    level = [(p, b) for p in parts]
    depth = 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level) - 1, 2):
            (a, ra), (c, rc) = level[k], level[k + 1]
            out = "Y2" if len(level) == 2 else f"cat{depth}_{k // 2}"
            va, vc = f"{out}:a", f"{out}:b"
            d.views[va], d.views[vc] = (a, (1, ra * h, 1, 1), 0), (c, (1, rc * h, 1, 1), 0)
            d.emit("concat", {"n": 1, "c": ra * h, "c1": rc * h, "h": 1, "w": 1, "layout": "NCHW"}, (va, vc), out,
                   (1, (ra + rc) * h, 1, 1))
            nxt.append((out, ra + rc))
        if len(level) % 2:
            nxt.append(level[-1])
        level, depth = nxt, depth + 1
    return level[0][0]


def decompose(op: str, params: Mapping[str, Any]) -> Decomposition:
    """The op-by-op kernels of one `lstm` or `gru` layer (see the module docstring)."""
    if op not in GATES:
        raise ValueError(f"no op-by-op decomposition of {op!r} (have: {', '.join(GATES)})")
    params = dict(params)
    t, b, i, h = (int(params[k]) for k in ("t", "b", "i", "h"))
    reverse = int(params.get("reverse", 0))
    ng = GATES[op]
    G = ng * h
    d = Decomposition()
    d.derived["WT"] = lambda ins: np.ascontiguousarray(ins["W"][0].T)
    d.derived["RT"] = lambda ins: np.ascontiguousarray(ins["R"][0].T)
    if op == "lstm":
        d.derived["bias"] = lambda ins: ins["B"][0, :G] + ins["B"][0, G:]
    else:
        d.derived["Wb"] = lambda ins: ins["B"][0, :G]
        d.derived["Rb"] = lambda ins: ins["B"][0, G:]
    lbr0 = op == "gru" and not int(params.get("lbr", 1))
    if lbr0:  # the z and r gates' recurrent columns, and the candidate's (with its bias) apart
        d.derived["RT_zr"] = lambda ins: np.ascontiguousarray(ins["R"][0, :2 * h].T)
        d.derived["RT_n"] = lambda ins: np.ascontiguousarray(ins["R"][0, 2 * h:].T)
        for k, n in enumerate("zrn"):
            d.derived[f"Rb_{n}"] = lambda ins, k=k: np.broadcast_to(ins["B"][0, G + k * h:G + (k + 1) * h], (b, h)).copy()
    d.views["X2"] = ("X", (t * b, i), 0)
    d.views["h_init"] = ("h0", (b, h), 0)
    if op == "lstm":
        d.views["c_init"] = ("c0", (b, h), 0)
    xp = d.emit("matmul", {"m": t * b, "k": i, "n": G, "trans_a": 0, "trans_b": 0}, ("X2", "WT"), "x_proj", (t * b, G))
    if op == "gru":
        xp = d.emit("ew_chain", rows_ew(t * b, G, "bias"), (xp, "Wb"), "x_projb", (t * b, G))
    hp, cp = "h_init", "c_init"
    hs: dict[int, str] = {}
    order = range(t - 1, -1, -1) if reverse else range(t)
    for s in order:
        xs = f"x{s}"
        d.views[xs] = (xp, (b, G), s * b * G)
        if lbr0:
            hr = d.emit("matmul", {"m": b, "k": h, "n": 2 * h, "trans_a": 0, "trans_b": 0}, (hp, "RT_zr"), f"hr{s}",
                        (b, 2 * h))
        else:
            hr = d.emit("matmul", {"m": b, "k": h, "n": G, "trans_a": 0, "trans_b": 0}, (hp, "RT"), f"hr{s}", (b, G))
        ew = lambda chain, ins, out: d.emit("ew_chain", rows_ew(b, h, chain), ins, out, (b, h))  # noqa: E731
        if op == "lstm":
            g = d.emit("ew_chain", rows_ew(b, G, "add;bias"), (hr, xs, "bias"), f"g{s}", (b, G))
            gi, go, gf, gc = (_cols(d, g, (b, G), k * h, (k + 1) * h, f"g{s}_{n}")
                              for k, n in enumerate("iofc"))
            si, so, sf = (ew("sigmoid", (v,), f"{v}s") for v in (gi, go, gf))
            tc = ew("tanh", (gc,), f"{gc}t")
            fc = ew("mul", (sf, cp), f"fc{s}")
            ic = ew("mul", (si, tc), f"ic{s}")
            cp = ew("add", (fc, ic), f"c_{s}")
            th = ew("tanh", (cp,), f"tc{s}")
            hp = ew("mul", (so, th), f"h_{s}")
        elif int(params.get("lbr", 1)):
            hb = d.emit("ew_chain", rows_ew(b, G, "bias"), (hr, "Rb"), f"hb{s}", (b, G))
            xz, xr, xn = (_cols(d, xs, (b, G), k * h, (k + 1) * h, f"x{s}_{n}") for k, n in enumerate("zrn"))
            hz, hrr, hn = (_cols(d, hb, (b, G), k * h, (k + 1) * h, f"hb{s}_{n}") for k, n in enumerate("zrn"))
            z = ew("add;sigmoid", (xz, hz), f"z{s}")
            r = ew("add;sigmoid", (xr, hrr), f"r{s}")
            rh = ew("mul", (r, hn), f"rh{s}")
            n = ew("add;tanh", (xn, rh), f"n{s}")
            hp = _gru_update(d, ew, hp, z, n, s)
        else:  # (r * h) R_n^T: the candidate's product waits on the reset gate
            xz, xr, xn = (_cols(d, xs, (b, G), k * h, (k + 1) * h, f"x{s}_{n}") for k, n in enumerate("zrn"))
            hz, hrr = (_cols(d, hr, (b, 2 * h), k * h, (k + 1) * h, f"hr{s}_{n}") for k, n in enumerate("zr"))
            z = ew("add;add;sigmoid", (xz, hz, "Rb_z"), f"z{s}")
            r = ew("add;add;sigmoid", (xr, hrr, "Rb_r"), f"r{s}")
            rh = ew("mul", (r, hp), f"rh{s}")
            hn = d.emit("matmul", {"m": b, "k": h, "n": h, "trans_a": 0, "trans_b": 0}, (rh, "RT_n"), f"hn{s}", (b, h))
            n = ew("add;add;tanh", (xn, hn, "Rb_n"), f"n{s}")
            hp = _gru_update(d, ew, hp, z, n, s)
        hs[s] = hp
    y2 = _stack(d, [hs[s] for s in range(t)], b, h)
    if y2 != "Y2":
        d.views["Y2"] = (y2, (t * b, h), 0)
    d.views["Y"] = ("Y2", (t, b, h), 0)
    return d


def _gru_update(d: Decomposition, ew: Callable, hp: str, z: str, n: str, s: int) -> str:
    """h = (1 - z) n + z h_prev as n + z (h_prev - n): sub, mul, add."""
    dh = ew("sub", (hp, n), f"dh{s}")
    zd = ew("mul", (z, dh), f"zd{s}")
    return ew("add", (n, zd), f"h_{s}")


def steps(op: str, params: Mapping[str, Any]) -> list[tuple[str, dict, int]]:
    """The distinct (op, params, count) kernels of the op-by-op execution of one layer."""
    counts: Counter = Counter()
    first: dict[tuple, dict] = {}
    for k in decompose(op, params).kernels:
        key = (k.op, tuple(sorted(k.params.items())))
        counts[key] += 1
        first.setdefault(key, dict(k.params))
    return [(key[0], first[key], n) for key, n in counts.items()]


__all__ = ["Kernel", "Decomposition", "decompose", "steps", "rows_ew", "GATES"]
