"""Recurrent ops: ONNX LSTM and GRU as one `lstm` / `gru` kernel per direction."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..importer import Node
from .common import Ctx, Unsupported, need_const, runtime


def lstm(ctx: Ctx, node: Node) -> None:
    """LSTM (ONNX's default activations) as one `lstm` kernel per direction: see `_recurrent`."""
    _recurrent(ctx, node, "lstm")


def gru(ctx: Ctx, node: Node) -> None:
    """GRU (ONNX's default activations, linear_before_reset 0 or 1 -> `lbr`) as one `gru` kernel
    per direction: see `_recurrent`."""
    _recurrent(ctx, node, "gru")


_RNN = {  # kind -> (ONNX op, gates, default activations of one direction, initial-state inputs)
    "lstm": ("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"), ("h0", "c0")),
    "gru": ("GRU", 3, ("Sigmoid", "Tanh"), ("h0",)),
}


def _recurrent(ctx: Ctx, node: Node, kind: str) -> None:
    """An ONNX LSTM / GRU node as one kernel per direction (forward: reverse=0, reverse: reverse=1,
    bidirectional: one of each), each with its direction's slice of W, R and B (constants; B zero
    when absent) and of the initial states (constant, runtime or zero). Y is the kernels' (t, b, h)
    viewed as (t, 1, b, h), for two directions concatenated into (t, 2, b, h); Y_h each direction's
    last h (forward: step t-1, reverse: step 0), likewise. layout=1 (batch first) is a transpose of
    X, of the initial states and of the outputs around the kernels. LSTM's Y_c is not produced."""
    a = node.attrs
    op, gates, acts, state_names = _RNN[kind]
    txt = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
    direction, layout = txt(a.get("direction", "forward")), int(a.get("layout", 0))
    if direction not in ("forward", "reverse", "bidirectional") or layout not in (0, 1):
        raise Unsupported(node, f"{op} with direction {direction!r} and layout {layout}")
    nd = 2 if direction == "bidirectional" else 1
    given = a.get("activations")
    if a.get("clip") is not None or int(a.get("input_forget", 0)) or (
            given is not None and [txt(v) for v in given] != list(acts) * nd):
        raise Unsupported(node, f"{op} with clip{', input_forget' if kind == 'lstm' else ''} or non-default "
                                "activations")
    lbr = int(a.get("linear_before_reset", 0))
    if lbr not in (0, 1):
        raise Unsupported(node, f"GRU with linear_before_reset={lbr}")
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    if ins[4] or (kind == "lstm" and ins[7]):
        raise Unsupported(node, f"{op} with sequence_lens" + (" or peepholes (P)" if kind == "lstm" else ""))
    outs = [v if v and ctx.uses[v] else "" for v in list(node.outputs) + [""] * (3 - len(node.outputs))]  # read
    if outs[2]:
        raise Unsupported(node, "LSTM's last cell state Y_c is read")
    x = runtime(ctx, node, ins[0], "X")
    xs = tuple(int(v) for v in ctx.shape(x))
    if len(xs) != 3:
        raise Unsupported(node, f"{op} of a {len(xs)}-D X (3-D expected)")
    if layout:  # X (b, t, i) -> (t, b, i)
        xs = (xs[1], xs[0], xs[2])
        x = _rnn_transpose(ctx, node, x, (xs[1], xs[0], xs[2]), (1, 0, 2), f"{node.name}:X")
    t, b, i = xs
    w, r = need_const(ctx, node, ins[1], "W"), need_const(ctx, node, ins[2], "R")
    h = int(r.shape[-1])
    if w.shape != (nd, gates * h, i) or r.shape != (nd, gates * h, h):
        raise Unsupported(node, f"{op} W {list(w.shape)} / R {list(r.shape)} do not match {nd} direction(s) "
                                f"of hidden size {h} over X {list(ctx.shape(ins[0]))}")
    bias = (need_const(ctx, node, ins[3], "B") if ins[3] else np.zeros((nd, 2 * gates * h), np.float32))
    bias = bias.reshape(nd, 2 * gates * h)
    states = []  # per initial state: a function of the direction giving its (1, b, h) value
    for k, v in zip(state_names, (ins[5], ins[6])):
        states.append(_rnn_state(ctx, node, k, v, nd, b, h, layout))
    params = {"t": t, "b": b, "i": i, "h": h, **({"lbr": lbr} if kind == "gru" else {})}
    ys, lasts = [], []
    for d in range(nd):
        rev = int(direction == "reverse" or d == 1)
        sfx = str(d) if nd > 1 else ""
        consts = [ctx.const(f"{node.name}:{k}{sfx}", v[d:d + 1]) for k, v in (("W", w), ("R", r), ("B", bias))]
        y = ctx.emit(kind, {**params, "reverse": rev}, (x, *consts, *(f(d) for f in states)), f"{node.name}:Y{sfx}",
                     node, (t, b, h))
        ys.append(y)
        if outs[1]:
            step = 0 if rev else t - 1
            lasts.append(y if t == 1 else ctx.emit(
                "slice", {"dims": f"{t}x{b}x{h}", "axis": 0, "start": step, "end": step + 1}, (y,),
                f"{node.name}:Y_h{sfx}", node, (1, b, h)))
    if outs[0]:
        y = _rnn_stack(ctx, node, ys, t, b * h, outs[0] if not layout else f"{node.name}:Y_tdbh", (t, nd, b, h))
        if layout:  # (t, D, b, h) -> (b, t, D, h)
            _rnn_transpose(ctx, node, y, (t, nd, b, h), (2, 0, 1, 3), outs[0])
    if outs[1]:
        y = _rnn_stack(ctx, node, lasts, 1, b * h, outs[1] if not layout else f"{node.name}:Y_h_dbh", (nd, b, h))
        if layout:  # (D, b, h) -> (b, D, h)
            _rnn_transpose(ctx, node, y, (nd, b, h), (1, 0, 2), outs[1])


def _rnn_state(ctx: Ctx, node: Node, k: str, v: str, nd: int, b: int, h: int, layout: int
               ) -> Callable[[int], str]:
    """An initial state (D, b, h) (layout 1: (b, D, h)) as a function of the direction giving its
    (1, b, h) slice: zeros when absent, a constant, or a runtime value (transposed, sliced)."""
    if not v or v in ctx.consts:
        full = np.zeros((nd, b, h), np.float32) if not v else ctx.consts[v].astype(np.float32).reshape(
            (b, nd, h) if layout else (nd, b, h))
        full = full.transpose(1, 0, 2) if layout and v else full
        sfx = lambda d: str(d) if nd > 1 else ""  # noqa: E731
        return lambda d: ctx.const(f"{node.name}:{k}{sfx(d)}", full[d:d + 1])
    vs = tuple(int(s) for s in ctx.shape(v))
    if vs != ((b, nd, h) if layout else (nd, b, h)):
        raise Unsupported(node, f"initial state {v!r} of shape {list(vs)}")
    if layout:
        v = _rnn_transpose(ctx, node, v, vs, (1, 0, 2), f"{node.name}:{k}")
    if nd == 1:
        return lambda d: v
    made: dict[int, str] = {}

    def part(d: int) -> str:
        if d not in made:
            made[d] = ctx.emit("slice", {"dims": f"{nd}x{b}x{h}", "axis": 0, "start": d, "end": d + 1}, (v,),
                               f"{node.name}:{k}{d}", node, (1, b, h))
        return made[d]
    return part


def _rnn_transpose(ctx: Ctx, node: Node, x: str, xs: tuple[int, ...], perm: tuple[int, ...], out: str) -> str:
    """`x` (shape `xs`) transposed by `perm` into `out`: a view when only unit axes move."""
    oshape = tuple(xs[p] for p in perm)
    moved = [p for p in perm if xs[p] != 1]
    if moved == sorted(moved):
        return ctx.emit("view", {}, (x,), out, node, oshape)
    return ctx.emit("transpose", {"dims": "x".join(map(str, xs)), "perm": "".join(map(str, perm))}, (x,), out, node,
                    oshape)


def _rnn_stack(ctx: Ctx, node: Node, parts: list[str], outer: int, inner: int, out: str,
               shape: tuple[int, ...]) -> str:
    """The directions' values (each `outer` x `inner`) side by side on the direction axis, viewed as
    `shape`: one direction is a view, two a `concat` of their (outer, inner, 1, 1) views."""
    if len(parts) == 1:
        return ctx.emit("view", {}, (parts[0],), out, node, shape)
    flat = [ctx.emit("view", {}, (p,), f"{out}:in{k}", node, (outer, inner, 1, 1)) for k, p in enumerate(parts)]
    cat = ctx.emit("concat", {"n": outer, "c": inner, "c1": inner, "h": 1, "w": 1, "layout": "NCHW"}, tuple(flat),
                   f"{out}:cat", node, (outer, 2 * inner, 1, 1))
    return ctx.emit("view", {}, (cat,), out, node, shape)
