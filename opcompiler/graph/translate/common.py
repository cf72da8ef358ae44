"""What every translation module shares: `Prim` (one catalogue op, view or host node), `Unsupported`,
the translation context `Ctx`, and the helpers the families build on: the element-wise params of a
value (`ew_params`), input checks (`runtime`, `need_const`), the 2-D row views of N-D values
(`as_rows`, `back_to_nd`), and the one- and two-input element-wise prims (`unary`, `binary`, with
numpy broadcasting of runtime operands: `bcast_runtime`). Imports no family module."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..importer import Graph, Node


@dataclass(frozen=True, kw_only=True)
class Prim:
    """One catalogue op (or a view / host node): inputs in the op's input order, constants included."""

    kind: str  # catalogue op name, "view" (zero-cost reshape) or "host" (onnxruntime on the host)
    params: Mapping[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    node: str  # the ONNX node it came from
    onnx_op: str
    reason: str = ""  # host prims: why the node is not compiled

    @property
    def output(self) -> str:
        return self.outputs[0]

    @property
    def step(self) -> str | None:
        """Its ew_chain step when it can join an element-wise chain, else None: an ew_chain's chain,
        or the step a one-step catalogue op is (relu, add, bias_add -> bias, batch_norm -> bn:
        `OpDef.chain`)."""
        if self.kind == "ew_chain":
            return str(self.params["chain"])
        if self.kind in ("view", "host"):
            return None
        from ...ops import get_op
        chain = get_op(self.kind).chain
        return chain if isinstance(chain, str) and chain and ";" not in chain else None


class Unsupported(Exception):
    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


@dataclass
class Ctx:
    """The state of one translation: the graph, its constants and shapes (both grown as prims are
    emitted), the prims so far, and what the families record for later nodes."""

    graph: Graph
    consts: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    prims: list[Prim] = field(default_factory=list)
    uses: Counter = field(default_factory=Counter)  # readers of each ONNX value (a graph output counts one)
    # an N-D value that is a view of a 2-D (rows, last axis) value: the 2-D one. A MatMul over
    # [..., M, K] runs as one (prod(...)*M, K) GEMM, and the element-wise ops that follow it (a
    # Linear's bias, an activation, a residual add) run on the 2-D value too, so they fuse into it
    rows: dict[str, str] = field(default_factory=dict)
    row_views: set[str] = field(default_factory=set)  # the views back to N-D it made (dropped when unread)
    # ids + constant offsets read only by embedding lookups (DeepFM's per-field offsets): the Add's
    # output -> (the runtime ids, the offsets broadcast to the ids' shape); no kernel of its own,
    # each Gather that reads it is a `gather` with a per-field offsets input (`id_offsets`)
    id_offsets: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)

    def shape(self, v: str) -> tuple[int, ...]:
        return tuple(self.consts[v].shape) if v in self.consts else self.shapes[v]

    def const(self, name: str, value: np.ndarray) -> str:
        self.consts[name] = np.ascontiguousarray(value, dtype=np.float32)
        return name

    def emit(self, kind: str, params: Mapping[str, Any], inputs, outputs, node: Node, out_shape=None) -> str:
        outs = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        if out_shape is not None:
            self.shapes[outs[0]] = tuple(out_shape)
        self.prims.append(Prim(kind=kind, params=dict(params), inputs=tuple(inputs), outputs=outs, node=node.name,
                               onnx_op=node.op_type))
        return outs[0]


def ew_params(shape: tuple[int, ...], per_channel: bool = False) -> dict[str, Any]:
    """Element-wise params for a value: NCHW for 4-D, (1, 1, M, N) NHWC for 2-D (channels last)."""
    if len(shape) == 4:
        return {"n": shape[0], "c": shape[1], "h": shape[2], "w": shape[3], "layout": "NCHW"}
    if len(shape) == 2:
        return {"n": 1, "c": shape[1], "h": 1, "w": shape[0], "layout": "NHWC"}
    if per_channel:
        raise ValueError(shape)
    return {"n": 1, "c": 1, "h": 1, "w": int(np.prod(shape)), "layout": "NCHW"}


def runtime(ctx: Ctx, node: Node, v: str, what: str) -> str:
    if v in ctx.consts:
        raise Unsupported(node, f"{what} {v!r} is a constant; only runtime tensors are supported there")
    return v


def need_const(ctx: Ctx, node: Node, v: str, what: str) -> np.ndarray:
    if v not in ctx.consts:
        raise Unsupported(node, f"{what} {v!r} must be a constant (initializer)")
    return ctx.consts[v].astype(np.float32)


def scalar(ctx: Ctx, v: str) -> float | None:
    """The value of a one-element constant, else None."""
    c = ctx.consts.get(v)
    return float(np.asarray(c).reshape(-1)[0]) if c is not None and np.asarray(c).size == 1 else None


def producer(ctx: Ctx, v: str) -> Prim | None:
    return next((p for p in reversed(ctx.prims) if v in p.outputs), None)


def as_rows(ctx: Ctx, node: Node, v: str, rows: tuple[int, int], name: str) -> str:
    """Value `v` as the 2-D `rows` = (prod of the leading axes, last axis): the 2-D value it is a
    view of, or a new view."""
    have = ctx.rows.get(v)
    if have is not None and tuple(ctx.shape(have)) == tuple(rows):
        return have
    if tuple(ctx.shape(v)) == tuple(rows):
        return v
    return ctx.emit("view", {}, (v,), name, node, rows)


def back_to_nd(ctx: Ctx, node: Node, y2: str, out: str, shape: tuple[int, ...]) -> None:
    """`out` (N-D `shape`) as a view of the 2-D result `y2`, remembered as such."""
    ctx.emit("view", {}, (y2,), out, node, shape)
    ctx.rows[out] = y2
    ctx.row_views.add(out)


def unary(ctx: Ctx, node: Node, kind: str, extra: Mapping[str, Any], x: str | None = None,
           out: str | None = None) -> None:
    """A one-input element-wise prim (of the node's first input and output unless given); on the
    2-D value when its input is a row view."""
    x = runtime(ctx, node, x or node.inputs[0], "input")
    out = out or node.outputs[0]
    x2 = ctx.rows.get(x)
    if x2 is not None:
        y2 = ctx.emit(kind, {**ew_params(ctx.shape(x2)), **extra}, (x2,), f"{out}:2d", node, ctx.shape(x2))
        back_to_nd(ctx, node, y2, out, ctx.shape(x))
        return
    ctx.emit(kind, {**ew_params(ctx.shape(x)), **extra}, (x,), out, node)


def binary(ctx: Ctx, node: Node, a: str, b: str, out: str, kind: str) -> None:
    """Add, Sub or Mul of two values: same shape, a scalar constant (an `affine` step), a per-channel
    constant, or a constant broadcast to full."""
    oshape = ctx.shapes.get(out) or tuple(np.broadcast_shapes(ctx.shape(a), ctx.shape(b)))
    if kind == "sub":
        if b in ctx.consts:  # x - c = x + (-c)
            binary(ctx, node, a, ctx.const(f"{node.name}:{b}:neg", -ctx.consts[b]), out, "add")
            return
        if a in ctx.consts:  # c - x = (-x) + c
            neg = f"{out}:neg"
            ctx.shapes[neg] = tuple(ctx.shape(b))
            unary(ctx, node, "ew_chain", {"chain": "affine:-1.0:0.0"}, x=b, out=neg)
            binary(ctx, node, neg, a, out, "add")
            return
    for x, c in ((a, b), (b, a)):
        v = scalar(ctx, c)
        if v is not None and x not in ctx.consts and tuple(ctx.shape(x)) == tuple(oshape):
            step = f"affine:1.0:{v!r}" if kind == "add" else f"affine:{v!r}:0.0"
            unary(ctx, node, "ew_chain", {"chain": step}, x=x, out=out)
            return
    if len(oshape) >= 3 and _binary_rows(ctx, node, a, b, out, kind, oshape):
        return
    if _per_row_op(ctx, node, a, b, out, kind, oshape):
        return
    if a not in ctx.consts and b not in ctx.consts and (tuple(ctx.shape(a)) != oshape or tuple(ctx.shape(b)) != oshape) \
            and (kind == "sub" or not any(_per_image_channel(ctx.shape(v), oshape) for v in (a, b))):
        # a runtime operand broadcast (a padding mask (B*H, 1, S) on the scores (B*H, S, S)): copied to full
        a2, b2 = (bcast_runtime(ctx, node, v, oshape, f"{out}:{t}:bc") for v, t in ((a, "a"), (b, "b")))
        binary(ctx, node, a2, b2, out, kind)
        return
    if kind == "sub" and (tuple(ctx.shape(a)) != tuple(oshape) or tuple(ctx.shape(b)) != tuple(oshape)):
        raise Unsupported(node, f"Sub with runtime broadcasting {list(ctx.shape(a))} - {list(ctx.shape(b))} "
                                "(same shapes, or a [..., 1] operand of a [..., N] one, are lowered)")
    if a in ctx.consts and b not in ctx.consts:
        a, b = b, a
    if a in ctx.consts:
        raise Unsupported(node, "both operands are constant (should have been folded)")
    if b not in ctx.consts and tuple(ctx.shape(b)) == oshape and tuple(ctx.shape(a)) != oshape and kind != "sub":
        a, b = b, a  # the full-shape operand first
    if tuple(ctx.shape(a)) != oshape:
        raise Unsupported(node, f"broadcasting the runtime operand {a!r} {list(ctx.shape(a))} to {list(oshape)}")
    if b not in ctx.consts and _per_image_channel(ctx.shape(b), oshape):
        _runtime_channel_op(ctx, node, a, b, out, kind, oshape)
        return
    same = "add" if kind == "add" else "ew_chain"
    same_params = ew_params(oshape) | ({} if kind == "add" else {"chain": kind})
    if b not in ctx.consts:
        if tuple(ctx.shape(b)) != oshape:
            raise Unsupported(node, f"runtime broadcasting {list(ctx.shape(b))} to {list(oshape)} is not supported")
        ctx.emit(same, same_params, (a, b), out, node, oshape)
        return
    c = ctx.consts[b].astype(np.float32)
    chan = _per_channel(c, oshape)
    if chan is not None:
        name = ctx.const(f"{node.name}:{b}:c", chan)
        if kind == "add":
            ctx.emit("bias_add", ew_params(oshape, True), (a, name), out, node, oshape)
        else:
            ctx.emit("ew_chain", {**ew_params(oshape, True), "chain": "scale"}, (a, name), out, node, oshape)
        return
    full = ctx.const(f"{node.name}:{b}:full", np.broadcast_to(c, oshape))  # materialized: costs its bytes
    ctx.emit(same, same_params, (a, full), out, node, oshape)


def _binary_rows(ctx: Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> bool:
    """Add or Mul on the 2-D value of a row view (a Linear's bias, a residual add): the other operand
    a full-shape runtime value, or a constant along the last axis only (then per channel: `bias` /
    `scale`, which fuse into the GEMM). False when neither operand is a row view of the result's
    shape or the other does not fit: the N-D translation then runs."""
    full = [v for v in (a, b) if v not in ctx.consts and tuple(ctx.shape(v)) == tuple(oshape) and v in ctx.rows]
    if not full:
        return False
    x = full[0]
    y = b if x == a else a
    x2 = ctx.rows[x]
    m, n = ctx.shape(x2)
    if y in ctx.consts:
        c = ctx.consts[y]
        lead = (1,) * (len(oshape) - c.ndim) + tuple(c.shape)
        if any(d != 1 for d in lead[:-1]):
            readers = [r for r in ctx.graph.nodes if out in r.inputs]
            if kind != "add" or len(readers) != 1 or readers[0].op_type != "Softmax":
                return False
            # an additive mask on attention scores (causal, padding): the full (rows, keys) constant
            full_c = np.maximum(np.broadcast_to(c, oshape).reshape(m, n), -3.0e4)  # -inf: finite in fp16, exp is 0
            y2 = ctx.const(f"{node.name}:{y}:rows", full_c)
        else:
            y2 = ctx.const(f"{node.name}:{y}:row", c.reshape(1, lead[-1]))
    elif tuple(ctx.shape(y)) == tuple(oshape):
        y2 = as_rows(ctx, node, y, (m, n), f"{out}:{y}:2d")
    else:
        return False
    ctx.shapes[f"{out}:2d"] = (m, n)
    binary(ctx, node, *((x2, y2) if x == a else (y2, x2)), f"{out}:2d", kind)  # Sub keeps its order
    back_to_nd(ctx, node, f"{out}:2d", out, oshape)
    return True


def _per_row_op(ctx: Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> bool:
    """x op r with r a runtime [..., 1] of x's [..., N] (a LayerNorm written out: x - mean, x / std):
    x viewed as one image of M = prod(...) channels of N, r as M per-channel operands (`bias` /
    `scale`; Sub adds -r), the result viewed back. False when the operands are not so."""
    if len(oshape) < 2 or a in ctx.consts or b in ctx.consts or oshape[-1] < 2:
        return False
    row = tuple(oshape[:-1]) + (1,)
    x, r = (a, b) if tuple(ctx.shape(a)) == tuple(oshape) else (b, a)
    if tuple(ctx.shape(x)) != tuple(oshape) or tuple(ctx.shape(r)) != row or (kind == "sub" and x != a):
        return False
    m, n = int(np.prod(oshape[:-1], dtype=np.int64)), int(oshape[-1])
    img = (1, m, 1, n)
    xa = ctx.emit("view", {}, (x,), f"{out}:x", node, img)
    rb = ctx.emit("view", {}, (r,), f"{out}:r", node, (m,))
    if kind == "sub":
        rb = ctx.emit("ew_chain", {**ew_params((m,)), "chain": "affine:-1.0:0.0"}, (rb,), f"{out}:negr", node, (m,))
    step = "scale" if kind == "mul" else "bias"
    y = ctx.emit("ew_chain", {**ew_params(img), "chain": step}, (xa, rb), f"{out}:y", node, img)
    ctx.emit("view", {}, (y,), out, node, oshape)
    return True


def _per_image_channel(bshape: tuple[int, ...], oshape: tuple[int, ...]) -> bool:
    """A runtime (N, C, 1, 1) operand of an (N, C, H, W) result: squeeze-and-excite's gate."""
    return (len(oshape) == 4 and len(bshape) == 4 and tuple(bshape[:2]) == tuple(oshape[:2])
            and tuple(bshape[2:]) == (1, 1) and oshape[2] * oshape[3] > 1)


def _runtime_channel_op(ctx: Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> None:
    """x * g or x + g with g of shape (N, C, 1, 1), computed at run time: viewed as one image of N*C
    channels, g is a per-channel operand (the `scale` / `bias` step), and the result is viewed back."""
    n, c, h, w = oshape
    flat = (1, n * c, h, w)
    xa = ctx.emit("view", {}, (a,), f"{out}:x", node, flat)
    gb = ctx.emit("view", {}, (b,), f"{out}:g", node, (n * c,))
    step = "scale" if kind == "mul" else "bias"
    y = ctx.emit("ew_chain", {**ew_params(flat), "chain": step}, (xa, gb), f"{out}:y", node, flat)
    ctx.emit("view", {}, (y,), out, node, oshape)


def _per_channel(c: np.ndarray, oshape: tuple[int, ...]) -> np.ndarray | None:
    """The (C,) vector when constant `c` broadcasts along the channel axis only (C > 1)."""
    cax = 1 if len(oshape) == 4 else (1 if len(oshape) == 2 else None)
    if cax is None or c.size != oshape[cax] or c.ndim > len(oshape):
        return None
    full = (1,) * (len(oshape) - c.ndim) + c.shape
    if full[cax] != oshape[cax] or any(d != 1 for i, d in enumerate(full) if i != cax):
        return None
    return c.reshape(-1)


def bcast_runtime(ctx: Ctx, node: Node, v: str, oshape: tuple[int, ...], out: str) -> str:
    """Runtime `v` broadcast to `oshape` (numpy rules), named `out`: a view when only unit axes are
    added (the same elements), else the copies concatenated: each run of broadcast axes is (outer,
    inner) repeated r times along a new middle axis, by `concat` kernels that double the copies
    (log2 r of them and one per further set bit of r)."""
    vs = tuple(ctx.shape(v))
    oshape = tuple(oshape)
    if vs == oshape:
        return v
    full = (1,) * (len(oshape) - len(vs)) + vs
    if len(full) != len(oshape) or any(a != b and a != 1 for a, b in zip(full, oshape)):
        raise Unsupported(node, f"{list(vs)} does not broadcast to {list(oshape)}")
    if int(np.prod(full, dtype=np.int64)) == int(np.prod(oshape, dtype=np.int64)):
        return ctx.emit("view", {}, (v,), out, node, oshape)
    runs: list[list[int]] = []  # runs of adjacent broadcast axes
    for ax, (a, b) in enumerate(zip(full, oshape)):
        if a != b:
            if runs and runs[-1][-1] == ax - 1:
                runs[-1].append(ax)
            else:
                runs.append([ax])
    cur, acc = list(full), v
    for k, run in enumerate(runs):
        outer = int(np.prod(cur[:run[0]], dtype=np.int64))
        inner = int(np.prod(cur[run[-1] + 1:], dtype=np.int64))
        r = int(np.prod([oshape[a] for a in run], dtype=np.int64))
        base = f"{out}:bc{k}"
        piece = ctx.emit("view", {}, (acc,), f"{base}:in", node, (outer, inner, 1, 1))
        have, copies, width = None, 1, inner  # `have`: the copies concatenated so far
        while True:
            if r & copies:
                if have is None:
                    have = piece
                else:
                    hc = ctx.shape(have)[1]
                    have = ctx.emit("concat", {"n": outer, "c": hc, "c1": width, "h": 1, "w": 1, "layout": "NCHW"},
                                    (have, piece), f"{base}:acc{copies}", node, (outer, hc + width, 1, 1))
            if copies * 2 > r:
                break
            piece = ctx.emit("concat", {"n": outer, "c": width, "c1": width, "h": 1, "w": 1, "layout": "NCHW"},
                             (piece, piece), f"{base}:x{copies * 2}", node, (outer, 2 * width, 1, 1))
            copies, width = copies * 2, width * 2
        for a in run:
            cur[a] = oshape[a]
        acc = have
    return ctx.emit("view", {}, (acc,), out, node, oshape)
