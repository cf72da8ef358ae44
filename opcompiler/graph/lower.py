"""ONNX nodes -> primitive ops of the catalogue (one kernel each in the unfused plan).

Each supported ONNX node becomes one or more `Prim`s: Conv with a bias is conv2d then bias_add
(the bias folded into a following BN that alone reads it), BatchNormalization is batch_norm
with (scale, shift) folded from its constants, Gemm is matmul then bias_add, Sum is a chain of adds; Flatten, Reshape and Identity are zero-cost views.
A node we cannot compile raises `Unsupported`; with `fallback="cpu"` it becomes a host prim
that onnxruntime runs on the host, reported separately.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import OpcError
from ..ops import fold_bn
from . import fm
from .importer import Graph, Node

F32_MAX = float(np.finfo(np.float32).max)


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
        from ..ops import get_op
        chain = get_op(self.kind).chain
        return chain if isinstance(chain, str) and chain and ";" not in chain else None


class Unsupported(Exception):
    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


@dataclass
class _Ctx:
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
    # each Gather that reads it is a `gather` with a per-field offsets input (`_id_offsets`)
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


def lower(graph: Graph, fallback: str | None = None) -> tuple[list[Prim], dict[str, np.ndarray], dict[str, tuple]]:
    """Prims in topological order, the constants they use (folded BN etc. added), all shapes."""
    if fallback not in (None, "cpu"):
        raise OpcError("unknown fallback", arg="--fallback", value=fallback, expected="cpu")
    ctx = _Ctx(graph=graph, consts=dict(graph.constants), shapes=dict(graph.shapes))
    ctx.uses.update(v for n in graph.nodes for v in n.inputs if v)
    ctx.uses.update(graph.outputs)
    written_ln, skip = _written_out_layer_norms(ctx)
    fm_chains, fm_skip = fm.find(graph.nodes, graph.outputs, ctx.consts, ctx.shape)  # DeepFM's pairwise term
    skip |= fm_skip
    masks = mask_values(graph)  # int / bool values the plan stores as floats (runtime masks)
    for node in graph.nodes:
        if node.name in skip:
            continue
        try:
            fn = (lambda c, n: _emit_layer_norm(c, n, *written_ln[n.name])) if node.name in written_ln else \
                (lambda c, n: _emit_fm(c, n, *fm_chains[n.name])) if node.name in fm_chains else \
                _LOWER.get(node.op_type)
            if fn is None:
                raise Unsupported(node, f"op {node.op_type} is not supported (supported: {', '.join(SUPPORTED)})")
            ints = [v for v in node.inputs if v and v not in ctx.consts and is_int(graph.dtype(v)) and v not in masks]
            if node.op_type == "Gather" and node.inputs[0] in ctx.consts:  # an embedding lookup: `gather` takes the ids
                ints = [v for v in ints if v != node.inputs[1]]
            if node.op_type == "Add" and _id_offsets(ctx, node) is not None:  # ids + offsets: folds into the gathers
                ints = []
            if ints:  # token ids, masks and what is computed from them: no target kernel takes integers
                raise Unsupported(node, f"{node.op_type} of the integer tensor {ints[0]!r} ({graph.dtype(ints[0])}): "
                                        "integer tensors run on the host")
            mark = len(ctx.prims)
            try:
                fn(ctx, node)
            except Unsupported:
                del ctx.prims[mark:]
                raise
        except Unsupported as e:
            if fallback is None:
                raise OpcError(f"node {node.name!r} ({node.op_type}): {e.reason}", arg="MODEL", value=graph.path,
                               expected="--fallback cpu to run unsupported nodes on the host") from None
            ctx.prims.append(Prim(kind="host", params={}, inputs=node.inputs, outputs=node.outputs, node=node.name,
                                  onnx_op=node.op_type, reason=e.reason))
    return _drop_unread_row_views(ctx, graph), ctx.consts, ctx.shapes


def _drop_unread_row_views(ctx: _Ctx, graph: Graph) -> list[Prim]:
    """The prims without the views back to N-D that nothing reads (every reader took the 2-D value):
    a kept view would count as a second reader of the 2-D value and stop its fusion. A row view
    reads a kernel's 2-D output, never another row view, so one pass drops them all."""
    read = {v for p in ctx.prims for v in p.inputs} | set(graph.outputs)
    return [p for p in ctx.prims if not (p.kind == "view" and p.output in ctx.row_views and p.output not in read)]


def _as_rows(ctx: _Ctx, node: Node, v: str, rows: tuple[int, int], name: str) -> str:
    """Value `v` as the 2-D `rows` = (prod of the leading axes, last axis): the 2-D value it is a
    view of, or a new view."""
    have = ctx.rows.get(v)
    if have is not None and tuple(ctx.shape(have)) == tuple(rows):
        return have
    if tuple(ctx.shape(v)) == tuple(rows):
        return v
    return ctx.emit("view", {}, (v,), name, node, rows)


def _back_to_nd(ctx: _Ctx, node: Node, y2: str, out: str, shape: tuple[int, ...]) -> None:
    """`out` (N-D `shape`) as a view of the 2-D result `y2`, remembered as such."""
    ctx.emit("view", {}, (y2,), out, node, shape)
    ctx.rows[out] = y2
    ctx.row_views.add(out)


def _unary(ctx: _Ctx, node: Node, kind: str, extra: Mapping[str, Any], x: str | None = None,
           out: str | None = None) -> None:
    """A one-input element-wise prim (of the node's first input and output unless given); on the
    2-D value when its input is a row view."""
    x = _runtime(ctx, node, x or node.inputs[0], "input")
    out = out or node.outputs[0]
    x2 = ctx.rows.get(x)
    if x2 is not None:
        y2 = ctx.emit(kind, {**ew_params(ctx.shape(x2)), **extra}, (x2,), f"{out}:2d", node, ctx.shape(x2))
        _back_to_nd(ctx, node, y2, out, ctx.shape(x))
        return
    ctx.emit(kind, {**ew_params(ctx.shape(x)), **extra}, (x,), out, node)


def ew_params(shape: tuple[int, ...], per_channel: bool = False) -> dict[str, Any]:
    """Element-wise params for a value: NCHW for 4-D, (1, 1, M, N) NHWC for 2-D (channels last)."""
    if len(shape) == 4:
        return {"n": shape[0], "c": shape[1], "h": shape[2], "w": shape[3], "layout": "NCHW"}
    if len(shape) == 2:
        return {"n": 1, "c": shape[1], "h": 1, "w": shape[0], "layout": "NHWC"}
    if per_channel:
        raise ValueError(shape)
    return {"n": 1, "c": 1, "h": 1, "w": int(np.prod(shape)), "layout": "NCHW"}


def _runtime(ctx: _Ctx, node: Node, v: str, what: str) -> str:
    if v in ctx.consts:
        raise Unsupported(node, f"{what} {v!r} is a constant; only runtime tensors are supported there")
    return v


def _need_const(ctx: _Ctx, node: Node, v: str, what: str) -> np.ndarray:
    if v not in ctx.consts:
        raise Unsupported(node, f"{what} {v!r} must be a constant (initializer)")
    return ctx.consts[v].astype(np.float32)


def _conv(ctx: _Ctx, node: Node) -> None:
    x = _runtime(ctx, node, node.inputs[0], "input")
    w = _need_const(ctx, node, node.inputs[1], "weight")
    xs = ctx.shape(x)
    if len(xs) != 4:
        raise Unsupported(node, f"only 2-D convolution (4-D NCHW input) is supported, got input shape {list(xs)}")
    k, cg, r, s = w.shape
    strides = list(node.attrs.get("strides", [1, 1]))
    dil = list(node.attrs.get("dilations", [1, 1]))
    pads = _pads(node, xs[2:], (r, s), strides, dil)
    if len(set(strides)) != 1 or len(set(dil)) != 1:
        raise Unsupported(node, f"strides {strides} and dilations {dil} must each be the same along H and W")
    if len(set(pads)) != 1:  # asymmetric (SAME_UPPER with stride 2, TF exports): pad explicitly
        x, xs = _explicit_pad(ctx, node, x, xs, pads, "zero")
        pads = [0, 0, 0, 0]
    params = {"n": xs[0], "c": xs[1], "h": xs[2], "w": xs[3], "k": k, "r": r, "s": s, "stride": strides[0],
              "pad": pads[0], "dilation": dil[0], "groups": int(node.attrs.get("group", 1)), "layout": "NCHW"}
    out = node.outputs[0]
    wname = ctx.const(node.inputs[1], w)
    if len(node.inputs) > 2 and node.inputs[2]:
        b = _need_const(ctx, node, node.inputs[2], "bias")
        mid = ctx.emit("conv2d", params, (x, wname), f"{out}:conv", node, ctx.shapes[out])
        ctx.emit("bias_add", ew_params(ctx.shapes[out]), (mid, ctx.const(node.inputs[2], b)), out, node)
    else:
        ctx.emit("conv2d", params, (x, wname), out, node)


def _explicit_pad(ctx: _Ctx, node: Node, x: str, xs: tuple[int, ...], pads: list[int], fill: str
                  ) -> tuple[str, tuple[int, ...]]:
    """A `pad` kernel (ONNX order [top, left, bottom, right]) in front of a conv or pool."""
    t, l, b, r = pads
    shape = (xs[0], xs[1], xs[2] + t + b, xs[3] + l + r)
    name = ctx.emit("pad", {"n": xs[0], "c": xs[1], "h": xs[2], "w": xs[3], "pt": t, "pl": l, "pb": b, "pr": r,
                            "fill": fill, "layout": "NCHW"}, (x,), f"{node.outputs[0]}:pad", node, shape)
    return name, shape


def _pads(node: Node, hw, kernel, strides, dil) -> list[int]:
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(node.attrs.get("pads", [0, 0, 0, 0]))
    if auto == "VALID":
        return [0, 0, 0, 0]
    pads = [0, 0, 0, 0]
    for i, (n, kk, st, d) in enumerate(zip(hw, kernel, strides, dil)):
        out = -(-n // st)
        total = max((out - 1) * st + (kk - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        pads[i], pads[i + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    return pads


def _batch_norm(ctx: _Ctx, node: Node) -> None:
    if node.attrs.get("training_mode", 0):
        raise Unsupported(node, "training-mode batch norm is not supported (inference only)")
    x = _runtime(ctx, node, node.inputs[0], "input")
    g, b, m, v = (_need_const(ctx, node, node.inputs[i], n) for i, n in
                  ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")))
    shape = ctx.shape(x)
    if len(shape) not in (2, 4):
        raise Unsupported(node, f"batch norm on a {len(shape)}-D tensor is not supported (2-D or 4-D)")
    scale, shift = fold_bn(g, b, m, v, float(node.attrs.get("epsilon", 1e-5)))
    # a Conv's bias read only by this BN folds into its shift: BN(conv + b) = conv * scale + (shift
    # + scale * b), so the conv and the BN fuse into one conv2d_bn kernel (no bias_add in between)
    src = next((p for p in reversed(ctx.prims) if p.outputs == (x,)), None)
    if (src is not None and src.kind == "bias_add" and src.onnx_op == "Conv" and ctx.uses[x] == 1
            and len(shape) == 4):
        ctx.prims.remove(src)
        shift = (shift + scale * ctx.consts[src.inputs[1]]).astype(np.float32)
        x = src.inputs[0]
    ctx.emit("batch_norm", ew_params(shape), (x, ctx.const(f"{node.name}:scale", scale),
                                              ctx.const(f"{node.name}:shift", shift)), node.outputs[0], node)


def _relu(ctx: _Ctx, node: Node) -> None:
    _unary(ctx, node, "relu", {})


def _chain(step: str) -> Callable[[_Ctx, Node], None]:
    def fn(ctx: _Ctx, node: Node) -> None:
        _unary(ctx, node, "ew_chain", {"chain": step})
    return fn


def _clip(ctx: _Ctx, node: Node) -> None:
    _runtime(ctx, node, node.inputs[0], "input")  # (checked before the bounds are read)
    if ctx.graph.opset < 11:
        lo, hi = node.attrs.get("min", -F32_MAX), node.attrs.get("max", F32_MAX)
    else:
        ins = list(node.inputs) + ["", ""]
        lo = float(_need_const(ctx, node, ins[1], "min")) if ins[1] else -F32_MAX
        hi = float(_need_const(ctx, node, ins[2], "max")) if ins[2] else F32_MAX
    _unary(ctx, node, "ew_chain", {"chain": f"clip:{float(lo)!r}:{float(hi)!r}"})


def _scalar(ctx: _Ctx, v: str) -> float | None:
    """The value of a one-element constant, else None."""
    c = ctx.consts.get(v)
    return float(np.asarray(c).reshape(-1)[0]) if c is not None and np.asarray(c).size == 1 else None


def _binary(ctx: _Ctx, node: Node, a: str, b: str, out: str, kind: str) -> None:
    """Add, Sub or Mul of two values: same shape, a scalar constant (an `affine` step), a per-channel
    constant, or a constant broadcast to full."""
    oshape = ctx.shapes.get(out) or tuple(np.broadcast_shapes(ctx.shape(a), ctx.shape(b)))
    if kind == "sub":
        if b in ctx.consts:  # x - c = x + (-c)
            _binary(ctx, node, a, ctx.const(f"{node.name}:{b}:neg", -ctx.consts[b]), out, "add")
            return
        if a in ctx.consts:  # c - x = (-x) + c
            neg = f"{out}:neg"
            ctx.shapes[neg] = tuple(ctx.shape(b))
            _unary(ctx, node, "ew_chain", {"chain": "affine:-1.0:0.0"}, x=b, out=neg)
            _binary(ctx, node, neg, a, out, "add")
            return
    for x, c in ((a, b), (b, a)):
        v = _scalar(ctx, c)
        if v is not None and x not in ctx.consts and tuple(ctx.shape(x)) == tuple(oshape):
            step = f"affine:1.0:{v!r}" if kind == "add" else f"affine:{v!r}:0.0"
            _unary(ctx, node, "ew_chain", {"chain": step}, x=x, out=out)
            return
    if len(oshape) >= 3 and _binary_rows(ctx, node, a, b, out, kind, oshape):
        return
    if _per_row_op(ctx, node, a, b, out, kind, oshape):
        return
    if a not in ctx.consts and b not in ctx.consts and (tuple(ctx.shape(a)) != oshape or tuple(ctx.shape(b)) != oshape) \
            and (kind == "sub" or not any(_per_image_channel(ctx.shape(v), oshape) for v in (a, b))):
        # a runtime operand broadcast (a padding mask (B*H, 1, S) on the scores (B*H, S, S)): copied to full
        a2, b2 = (_bcast_runtime(ctx, node, v, oshape, f"{out}:{t}:bc") for v, t in ((a, "a"), (b, "b")))
        _binary(ctx, node, a2, b2, out, kind)
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


def _binary_rows(ctx: _Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> bool:
    """Add or Mul on the 2-D value of a row view (a Linear's bias, a residual add): the other operand
    a full-shape runtime value, or a constant along the last axis only (then per channel: `bias` /
    `scale`, which fuse into the GEMM). False when neither operand is a row view of the result's
    shape or the other does not fit: the N-D lowering then runs."""
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
        y2 = _as_rows(ctx, node, y, (m, n), f"{out}:{y}:2d")
    else:
        return False
    ctx.shapes[f"{out}:2d"] = (m, n)
    _binary(ctx, node, *((x2, y2) if x == a else (y2, x2)), f"{out}:2d", kind)  # Sub keeps its order
    _back_to_nd(ctx, node, f"{out}:2d", out, oshape)
    return True


def _per_row_op(ctx: _Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> bool:
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


def _runtime_channel_op(ctx: _Ctx, node: Node, a: str, b: str, out: str, kind: str, oshape: tuple[int, ...]) -> None:
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


def _add(ctx: _Ctx, node: Node) -> None:
    fold = _id_offsets(ctx, node)
    if fold is not None:  # integer ids + constant offsets: no kernel, each reading Gather adds them
        ctx.id_offsets[node.outputs[0]] = fold
        return
    _binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "add")


def _id_offsets(ctx: _Ctx, node: Node) -> tuple[str, np.ndarray] | None:
    """(the ids, the offsets broadcast to their shape) when `node` is an Add of a runtime int32 /
    int64 tensor and a constant integer tensor that does not broadcast the ids, whose result only
    Gathers of a constant 2-D table on axis 0 read (not a graph output): DeepFM's `x + offsets`
    (the fields' ids into one table shared by every field). Else None: the Add is integer math,
    refused in `lower` like any other reader of an integer tensor."""
    if node.op_type != "Add" or len(node.inputs) != 2:
        return None
    out, g = node.outputs[0], ctx.graph
    a, b = node.inputs
    ids, c = (a, b) if b in ctx.consts else (b, a)
    if ids in ctx.consts or c not in ctx.consts or g.dtype(ids) not in ("int32", "int64"):
        return None
    off = np.asarray(ctx.consts[c])
    ish = tuple(ctx.shape(ids))
    if not np.issubdtype(off.dtype, np.integer) or off.ndim > len(ish) or out in g.outputs:
        return None
    try:
        if tuple(np.broadcast_shapes(ish, off.shape)) != ish:
            return None
    except ValueError:
        return None
    readers = [r for r in g.nodes if out in r.inputs]
    if not readers or any(r.op_type != "Gather" or r.inputs[0] not in ctx.consts or out in (r.inputs[0], *r.inputs[2:])
                          or len(ctx.shape(r.inputs[0])) != 2 or int(r.attrs.get("axis", 0)) % 2 != 0 for r in readers):
        return None
    return ids, np.broadcast_to(off, ish).astype(g.dtype(ids))


def _mul(ctx: _Ctx, node: Node) -> None:
    _binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "mul")


def _sub(ctx: _Ctx, node: Node) -> None:
    _binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "sub")


def _div(ctx: _Ctx, node: Node) -> None:
    """a / b: times 1/b for a constant b; else a times `rec` of b (the vector unit's reciprocal)."""
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if b in ctx.consts:
        c = ctx.consts[b].astype(np.float64)
        if np.any(c == 0):
            raise Unsupported(node, f"division by a constant {b!r} that holds 0")
        _binary(ctx, node, a, ctx.const(f"{node.name}:{b}:rec", 1.0 / c), out, "mul")
        return
    r = f"{out}:rec"
    ctx.shapes[r] = tuple(ctx.shape(b))
    _unary(ctx, node, "ew_chain", {"chain": "rec"}, x=b, out=r)
    _binary(ctx, node, a, r, out, "mul")


def _pow(ctx: _Ctx, node: Node) -> None:
    """x ** p for a constant scalar p: 1 a view, 2 and 3 products (any sign of x), -1 `rec`, any
    other p the `pow` step (exp(p ln x): x > 0, as x ** p is real only there for a fractional p)."""
    x, out = _runtime(ctx, node, node.inputs[0], "base"), node.outputs[0]
    p = _scalar(ctx, node.inputs[1])
    if p is None:
        raise Unsupported(node, "Pow with a runtime or non-scalar exponent")
    if p == 1.0:
        ctx.emit("view", {}, (x,), out, node)
    elif p in (2.0, 3.0):
        sq = out if p == 2.0 else f"{out}:sq"
        ctx.shapes[sq] = tuple(ctx.shape(x))
        _binary(ctx, node, x, x, sq, "mul")
        if p == 3.0:
            _binary(ctx, node, sq, x, out, "mul")
    elif p == -1.0:
        _unary(ctx, node, "ew_chain", {"chain": "rec"})
    elif float(p).is_integer():
        raise Unsupported(node, f"Pow with the integer exponent {p:g} (2, 3, 1 and -1 are lowered)")
    else:
        _unary(ctx, node, "ew_chain", {"chain": f"pow:{p!r}"})


def _gelu(ctx: _Ctx, node: Node) -> None:
    approx = node.attrs.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    _unary(ctx, node, "ew_chain", {"chain": "gelu_tanh" if approx == "tanh" else "gelu"})


def _sum(ctx: _Ctx, node: Node) -> None:
    ins = [v for v in node.inputs if v]
    if len(ins) == 1:
        ctx.emit("view", {}, (ins[0],), node.outputs[0], node)
        return
    acc = ins[0]
    for i, v in enumerate(ins[1:]):
        out = node.outputs[0] if i == len(ins) - 2 else f"{node.outputs[0]}:sum{i}"
        _binary(ctx, node, acc, v, out, "add")
        acc = out


def _gemm(ctx: _Ctx, node: Node) -> None:
    a = _runtime(ctx, node, node.inputs[0], "A")
    trans_a = int(node.attrs.get("transA", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    b = _need_const(ctx, node, node.inputs[1], "B")
    b = (b.T if node.attrs.get("transB", 0) else b) * np.float32(alpha)  # folded at import: B is (K, N)
    sa = ctx.shape(a)
    m, kk = (sa[1], sa[0]) if trans_a else sa
    n = b.shape[1]
    out = node.outputs[0]
    params = {"m": m, "k": kk, "n": n, "trans_a": trans_a, "trans_b": 0}
    bname = ctx.const(f"{node.name}:B", b)
    if len(node.inputs) < 3 or not node.inputs[2]:
        ctx.emit("matmul", params, (a, bname), out, node, (m, n))
        return
    mid = ctx.emit("matmul", params, (a, bname), f"{out}:mm", node, (m, n))
    c = _need_const(ctx, node, node.inputs[2], "C") * np.float32(beta)
    ctx.consts[f"{node.name}:C"] = c
    ctx.shapes[out] = (m, n)
    _binary(ctx, node, mid, f"{node.name}:C", out, "add")


def _matmul(ctx: _Ctx, node: Node) -> None:
    """MatMul with numpy's rules. 2-D x 2-D is one GEMM. A [..., M, K] times one matrix B ([K, N],
    or [1, .., K, N]: a Linear on [B, S, D]) is one GEMM of M = prod(...)*M rows, the result a row
    view (`_Ctx.rows`). Two batched operands (attention's Q K^T, P V) are not lowered."""
    a, b = node.inputs[0], node.inputs[1]
    _runtime(ctx, node, a, "A")
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) == 2 and len(sb) == 2:
        if b in ctx.consts:
            b = ctx.const(b, ctx.consts[b])
        ctx.emit("matmul", {"m": sa[0], "k": sa[1], "n": sb[1], "trans_a": 0, "trans_b": 0}, (a, b), node.outputs[0],
                 node)
        return
    if len(sa) < 2 or len(sb) < 2:
        raise Unsupported(node, f"MatMul of a 1-D operand ({list(sa)} x {list(sb)}) is not lowered")
    if int(np.prod(sb[:-2], dtype=np.int64)) != 1:
        _batched_matmul(ctx, node, a, b, sa, sb)
        return
    k, n = int(sb[-2]), int(sb[-1])
    m = int(np.prod(sa[:-1], dtype=np.int64))
    out = node.outputs[0]
    oshape = ctx.shapes.get(out) or tuple(np.broadcast_shapes(sa[:-2], sb[:-2])) + (int(sa[-2]), n)
    if b in ctx.consts:
        b2 = ctx.const(f"{node.name}:B", ctx.consts[b].reshape(k, n))
    else:
        b2 = _as_rows(ctx, node, b, (k, n), f"{out}:B2d")
    a2 = _as_rows(ctx, node, a, (m, k), f"{out}:A2d")
    y2 = ctx.emit("matmul", {"m": m, "k": k, "n": n, "trans_a": 0, "trans_b": 0}, (a2, b2), f"{out}:2d", node,
                  (m, n))
    _back_to_nd(ctx, node, y2, out, tuple(oshape))


def _producer(ctx: _Ctx, v: str) -> Prim | None:
    return next((p for p in reversed(ctx.prims) if v in p.outputs), None)


def _swaps_last_two(p: Prim | None) -> bool:
    if p is None or p.kind != "transpose":
        return False
    perm = [int(c) for c in str(p.params["perm"])]
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def _untransposed(ctx: _Ctx, node: Node, b: str) -> str | None:
    """The B^T whose last-two-axes transpose `b` is, when the transpose (and a scalar affine step
    after it, which commutes: torch's scaled_dot_product_attention scales K^T) is read by this
    MatMul alone: the transpose kernel is dropped and the MatMul reads B^T with trans_b = 1."""
    prod = _producer(ctx, b)
    affine = None
    if prod is not None and prod.kind == "ew_chain" and str(prod.params["chain"]).startswith("affine:") \
            and len(prod.inputs) == 1 and ctx.uses[b] == 1:
        affine, prod = prod, _producer(ctx, prod.inputs[0])
    if not _swaps_last_two(prod) or ctx.uses[prod.output] != 1 or (affine is None and ctx.uses[b] != 1):
        return None
    bt = prod.inputs[0]
    ctx.prims.remove(prod)
    if affine is None:
        return bt
    ctx.prims.remove(affine)
    return ctx.emit("ew_chain", {**ew_params(ctx.shape(bt)), "chain": affine.params["chain"]}, (bt,),
                    f"{b}:bt", node, ctx.shape(bt))


def _batched_matmul(ctx: _Ctx, node: Node, a: str, b: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """Both operands batched (attention's Q K^T and P V): one batch_matmul over the flattened
    batch axes, B^T read directly (trans_b) where B is a transpose of its last two axes. The
    result is (batch * M, N) rows with an N-D row view: the scale, mask and softmax that follow
    in attention run on the rows, so they chain into one attention kernel."""
    _runtime(ctx, node, b, "B")
    lead_a, lead_b = tuple(sa[:-2]), tuple(sb[:-2])
    if len(sa) < 3 or lead_a != lead_b:
        raise Unsupported(node, f"batched MatMul {list(sa)} x {list(sb)} with broadcast batch axes is not lowered")
    nb, m, k, n = int(np.prod(lead_a, dtype=np.int64)), int(sa[-2]), int(sa[-1]), int(sb[-1])
    bt = _untransposed(ctx, node, b)
    params = {"b": nb, "m": m, "k": k, "n": n, "trans_a": 0, "trans_b": int(bt is not None), "bcast_b": 0}
    a2 = ctx.rows.get(a)
    if a2 is not None and int(np.prod(ctx.shape(a2))) == nb * m * k:
        a = a2  # softmax's rows (attention's P): read as (batch, M, K) directly
    out = node.outputs[0]
    y = ctx.emit("batch_matmul", params, (a, bt if bt is not None else b), f"{out}:rows", node, (nb * m, n))
    _back_to_nd(ctx, node, y, out, ctx.shapes.get(out, (*lead_a, m, n)))


def _pool(mode: str) -> Callable[[_Ctx, Node], None]:
    def fn(ctx: _Ctx, node: Node) -> None:
        x = _runtime(ctx, node, node.inputs[0], "input")
        xs = ctx.shape(x)
        if len(xs) != 4:
            raise Unsupported(node, f"only 2-D pooling is supported, got input shape {list(xs)}")
        ks = list(node.attrs["kernel_shape"])
        strides = list(node.attrs.get("strides", [1, 1]))
        pads = _pads(node, xs[2:], ks, strides, [1, 1])
        if any(d != 1 for d in node.attrs.get("dilations", [1, 1])):
            raise Unsupported(node, "dilated pooling is not supported")
        if len(set(ks)) != 1 or len(set(strides)) != 1:
            raise Unsupported(node, f"kernel {ks} and strides {strides} must each be square")
        if len(node.outputs) > 1 and node.outputs[1]:
            raise Unsupported(node, "the MaxPool Indices output is not supported")
        # ceil_mode: the inferred output is larger; the windows past the edge read padding only
        # beyond the input, so for max pooling extra bottom/right padding (lowest) is exact
        ho, wo = ctx.shapes[node.outputs[0]][2:]
        extra = [max((o - 1) * st + kk - (n + p0 + p1), 0)
                 for o, st, kk, n, p0, p1 in zip((ho, wo), strides, ks, xs[2:], pads[:2], pads[2:])]
        pads = [pads[0], pads[1], pads[2] + extra[0], pads[3] + extra[1]]
        include = bool(node.attrs.get("count_include_pad", 0))
        divisor = None
        if len(set(pads)) != 1 or (mode == "avg" and include and pads[0]):
            if mode == "avg":  # zero padding, a window sum over k*k, then each output scaled to its own count
                divisor = _avg_divisor(xs[2:], ks[0], strides[0], pads, extra, include)
            x, xs = _explicit_pad(ctx, node, x, xs, pads, "lowest" if mode == "max" else "zero")
            pads = [0, 0, 0, 0]
        params = {"n": xs[0], "c": xs[1], "h": xs[2], "w": xs[3], "kernel": ks[0], "stride": strides[0],
                  "pad": pads[0], "mode": mode, "layout": "NCHW"}
        out = node.outputs[0]
        if divisor is None or np.all(divisor == ks[0] * ks[0]):
            ctx.emit("pool2d", params, (x,), out, node)
            return
        oshape = ctx.shapes[out]
        mid = ctx.emit("pool2d", params, (x,), f"{out}:sum", node, oshape)
        fix = np.broadcast_to((ks[0] * ks[0] / divisor).astype(np.float32), oshape)  # a constant, like a weight
        ctx.emit("ew_chain", {**ew_params(oshape), "chain": "mul"}, (mid, ctx.const(f"{node.name}:count", fix)), out,
                 node, oshape)
    return fn


def _avg_divisor(hw, k: int, stride: int, pads: list[int], extra: list[int], include: bool) -> np.ndarray:
    """(Ho, Wo) element counts an ONNX AveragePool divides by (onnxruntime's rule): with
    count_include_pad the window clipped to the padded input (ceil_mode's windows past it count
    only what they cover), else clipped to the input itself."""
    counts = []
    for n, p0, p1, ex in zip(hw, pads[:2], pads[2:], extra):
        o = (n + p0 + p1 - k) // stride + 1
        start = np.arange(o) * stride - p0
        end = np.minimum(start + k, n + p1 - ex)  # p1 includes ceil_mode's extra rows, which never count
        counts.append(end - start if include else np.minimum(end, n) - np.maximum(start, 0))
    return np.outer(counts[0], counts[1]).astype(np.float64)


def _global_avg(ctx: _Ctx, node: Node) -> None:
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    if len(xs) != 4 or xs[2] != xs[3]:
        raise Unsupported(node, f"GlobalAveragePool needs a square 4-D input, got {list(xs)}")
    ctx.emit("pool2d", {"n": xs[0], "c": xs[1], "h": xs[2], "w": xs[3], "kernel": xs[2], "stride": 1, "pad": 0,
                        "mode": "avg", "layout": "NCHW"}, (x,), node.outputs[0], node)


def _view(ctx: _Ctx, node: Node) -> None:
    x = node.inputs[0]
    if x in ctx.consts:
        raise Unsupported(node, "a view of a constant (should have been folded)")
    ctx.emit("view", {}, (x,), node.outputs[0], node)


def _softmax(ctx: _Ctx, node: Node, log: bool = False) -> None:
    """Softmax (LogSoftmax: `log`) over rows of a 2-D view. Before opset 13 `axis` flattens the
    tensor into [prod(shape[:axis]), prod(shape[axis:])]; from 13 on it is one axis: the last (or
    one followed by unit axes only) is the rows, any other is moved last by a data-movement kernel
    ((outer, r, inner) -> (outer, inner, r), as a reduction over a middle axis) and moved back after.
    LogSoftmax is the softmax then the `ln` step (in fp16, log-probabilities below ln of fp16's
    smallest subnormal, about -16.6, are -inf)."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    axis = int(node.attrs.get("axis", 1 if ctx.graph.opset < 13 else -1)) % max(len(xs), 1)
    out = node.outputs[0]
    if ctx.graph.opset >= 13 and any(d != 1 for d in xs[axis + 1:]):
        outer, r = int(np.prod(xs[:axis], dtype=np.int64)), int(xs[axis])
        inner = int(np.prod(xs[axis + 1:], dtype=np.int64))
        cube = ctx.emit("view", {}, (x,), f"{out}:3d", node, (outer, r, inner))
        t = ctx.emit("transpose", {"dims": f"{outer}x{r}x{inner}", "perm": "021"}, (cube,), f"{out}:t", node,
                     (outer, inner, r))
        y = _softmax_rows(ctx, node, t, (outer, inner, r), outer * inner, r, f"{out}:tsm", log)
        back = ctx.emit("transpose", {"dims": f"{outer}x{inner}x{r}", "perm": "021"}, (y,), f"{out}:back", node,
                        (outer, r, inner))
        ctx.emit("view", {}, (back,), out, node, xs)
        return
    m, n = int(np.prod(xs[:axis], dtype=np.int64)), int(np.prod(xs[axis:], dtype=np.int64))
    _softmax_rows(ctx, node, x, xs, m, n, out, log)


def _log_softmax(ctx: _Ctx, node: Node) -> None:
    _softmax(ctx, node, log=True)


def _softmax_rows(ctx: _Ctx, node: Node, x: str, xs: tuple[int, ...], m: int, n: int, out: str, log: bool) -> str:
    """`out` (shape xs) = softmax (then ln for `log`) over the rows of x viewed as (m, n)."""
    def rows(src: str, name: str) -> str:
        p = ctx.emit("softmax", {"m": m, "n": n}, (src,), name if not log else f"{name}:p", node, (m, n))
        if log:
            p = ctx.emit("ew_chain", {**ew_params((m, n)), "chain": "ln"}, (p,), name, node, (m, n))
        return p
    x2 = ctx.rows.get(x)
    if x2 is not None and tuple(ctx.shape(x2)) == (m, n):  # the rows of a batched product (attention's scores)
        _back_to_nd(ctx, node, rows(x2, f"{out}:rows"), out, xs)
        return out
    if tuple(xs) == (m, n):
        return rows(x, out)
    flat = ctx.emit("view", {}, (x,), f"{out}:2d", node, (m, n))
    mid = rows(flat, f"{out}:sm")
    return ctx.emit("view", {}, (mid,), out, node, xs)


def _concat(ctx: _Ctx, node: Node) -> None:
    ins = [v for v in node.inputs if v]
    if len(ins) == 1:  # torch.cat([x]) (DenseNet's first dense layer): the identity
        ctx.emit("view", {}, (_runtime(ctx, node, ins[0], "input"),), node.outputs[0], node)
        return
    shapes = [ctx.shape(v) for v in ins]
    rank = len(shapes[0])
    axis = int(node.attrs["axis"]) % rank
    for v in ins:
        if v in ctx.consts:
            ctx.const(v, ctx.consts[v])
    if rank not in (2, 4) or axis != 1:
        _concat_flat(ctx, node, ins, shapes, axis)
        return
    acc, acc_shape = ins[0], shapes[0]
    for i, (v, s) in enumerate(zip(ins[1:], shapes[1:])):
        n, h, w = (acc_shape[0], *acc_shape[2:]) if rank == 4 else (acc_shape[0], 1, 1)
        out_shape = (acc_shape[0], acc_shape[1] + s[1], *acc_shape[2:])
        out = node.outputs[0] if i == len(ins) - 2 else f"{node.outputs[0]}:cat{i}"
        ctx.emit("concat", {"n": n, "c": acc_shape[1], "c1": s[1], "h": h, "w": w, "layout": "NCHW"}, (acc, v), out,
                 node, out_shape)
        acc, acc_shape = out, out_shape


def _concat_flat(ctx: _Ctx, node: Node, ins: list[str], shapes: list[tuple[int, ...]], axis: int) -> None:
    """Concat on any axis of any rank: each input is an (outer, inner_i) block row, with outer =
    prod(shape[:axis]) and inner_i = prod(shape_i[axis:]); viewed as (outer, inner_i, 1, 1) the
    result is the channel concat of those views, viewed back."""
    outer = int(np.prod(shapes[0][:axis], dtype=np.int64))
    out = node.outputs[0]
    views = []
    for i, (v, sh) in enumerate(zip(ins, shapes)):
        inner = int(np.prod(sh[axis:], dtype=np.int64))
        views.append((ctx.emit("view", {}, (v,), f"{out}:in{i}", node, (outer, inner, 1, 1)), inner))
    acc, acc_c = views[0]
    for i, (v, inner) in enumerate(views[1:]):
        last = i == len(views) - 2
        name = f"{out}:flat" if last else f"{out}:cat{i}"
        ctx.emit("concat", {"n": outer, "c": acc_c, "c1": inner, "h": 1, "w": 1, "layout": "NCHW"}, (acc, v), name,
                 node, (outer, acc_c + inner, 1, 1))
        acc, acc_c = name, acc_c + inner
    ctx.emit("view", {}, (acc,), out, node, ctx.shapes[out])


def _transpose(ctx: _Ctx, node: Node) -> None:
    """Transpose (ShuffleNet's channel shuffle, NHWC<->NCHW at a model's edges): a data-movement kernel."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    perm = list(node.attrs.get("perm", list(range(len(xs)))[::-1]))
    if len(xs) > 8:
        raise Unsupported(node, f"transpose of a {len(xs)}-D tensor (up to 8 axes)")
    moved = [a for a in perm if xs[a] != 1]
    if moved == sorted(moved):  # only unit axes move (batch-first <-> sequence-first at batch 1): a view
        ctx.emit("view", {}, (x,), node.outputs[0], node)
        return
    ctx.emit("transpose", {"dims": "x".join(map(str, xs)), "perm": "".join(map(str, perm))}, (x,), node.outputs[0],
             node)


def _slice(ctx: _Ctx, node: Node) -> None:
    """Slice with step 1 (ShuffleNet's channel split): one data-movement kernel per sliced axis."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = list(ctx.shape(x))
    if ctx.graph.opset < 10:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes, steps = list(node.attrs.get("axes", range(len(starts)))), [1] * len(starts)
    else:
        ins = list(node.inputs) + ["", ""]
        starts = [int(v) for v in _need_const(ctx, node, ins[1], "starts").astype(np.int64).reshape(-1)]
        ends = [int(v) for v in ctx.consts[ins[2]].astype(np.int64).reshape(-1)] if ins[2] in ctx.consts else None
        if ends is None:
            raise Unsupported(node, "ends must be a constant")
        axes = ([int(v) for v in ctx.consts[ins[3]].reshape(-1)] if ins[3] else list(range(len(starts))))
        steps = [int(v) for v in ctx.consts[ins[4]].reshape(-1)] if ins[4] else [1] * len(starts)
    cur, shape = x, list(xs)
    todo = []
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= len(xs)
        if sp != 1:
            raise Unsupported(node, f"Slice with step {sp} (only step 1)")
        d = shape[ax]
        st = min(max(st + d if st < 0 else st, 0), d)
        en = min(max(en + d if en < 0 else en, 0), d)
        if en <= st:
            raise Unsupported(node, f"an empty slice [{st}:{en}] of axis {ax}")
        if (st, en) != (0, d):
            todo.append((ax, st, en))
    out = node.outputs[0]
    if not todo:
        ctx.emit("view", {}, (cur,), out, node)
        return
    for i, (ax, st, en) in enumerate(todo):
        name = out if i == len(todo) - 1 else f"{out}:s{i}"
        params = {"dims": "x".join(map(str, shape)), "axis": ax, "start": st, "end": en}
        shape[ax] = en - st
        cur = ctx.emit("slice", params, (cur,), name, node, tuple(shape))


def _gather(ctx: _Ctx, node: Node) -> None:
    """Gather with constant indices that are one contiguous run (the packed-QKV split of
    nn.MultiheadAttention: index 0, 1 or 2 of the stacked projections): a `slice` kernel, then a
    view that drops the axis for a scalar index. Runtime int32 / int64 indices into a constant
    2-D table on axis 0 (nn.Embedding) are one `gather` kernel: the ids viewed as (n,), the rows
    (n, d) viewed back as ids.shape + (d,)."""
    if node.inputs[1] not in ctx.consts:
        table, ids, out = node.inputs[0], node.inputs[1], node.outputs[0]
        if table not in ctx.consts:
            raise Unsupported(node, "Gather with runtime indices from a runtime tensor (a constant table, an "
                                    "embedding lookup, is lowered)")
        ts, ish, idt = ctx.shape(table), tuple(ctx.shape(ids)), ctx.graph.dtype(ids)
        if len(ts) != 2 or int(node.attrs.get("axis", 0)) % 2 != 0 or idt not in ("int32", "int64"):
            raise Unsupported(node, f"Gather with runtime {idt} indices into a {len(ts)}-D table on axis "
                                    f"{node.attrs.get('axis', 0)} (lowered: int32 / int64 ids, a 2-D table, axis 0)")
        n, d = int(np.prod(ish, dtype=np.int64)), int(ts[1])
        params, extra = {"rows": int(ts[0]), "cols": d, "n": n, "idx": idt}, ()
        if ids in ctx.id_offsets:  # ids + constant offsets (folded Add): the ids, offsets of one period
            base, full = ctx.id_offsets[ids]
            flat_off = full.reshape(-1)
            period = next(p for p in range(1, n + 1)
                          if n % p == 0 and np.array_equal(flat_off, np.tile(flat_off[:p], n // p)))
            name = f"{ids}:offsets"
            ctx.consts[name] = np.ascontiguousarray(flat_off[:period])  # integers, as they are
            params["fields"], extra, ids = period, (name,), base
        flat = ids if ish == (n,) else ctx.emit("view", {}, (ids,), f"{out}:ids", node, (n,))
        oshape = (*ish, d)
        rows = ctx.emit("gather", params, (table, flat, *extra),
                        out if oshape == (n, d) else f"{out}:rows", node, (n, d))
        if rows != out:
            ctx.emit("view", {}, (rows,), out, node, oshape)
            ctx.rows[out] = rows  # the 2-D rows a following MatMul (a Linear) can take directly
            ctx.row_views.add(out)
        return
    x = _runtime(ctx, node, node.inputs[0], "data")
    xs = list(ctx.shape(x))
    axis = int(node.attrs.get("axis", 0)) % len(xs)
    d = xs[axis]
    ind = ctx.consts[node.inputs[1]].astype(np.int64).reshape(-1)
    ind = np.where(ind < 0, ind + d, ind)
    if ind.size == 0 or ind.min() < 0 or ind.max() >= d:
        raise Unsupported(node, f"Gather indices {ind.tolist()[:8]} out of range for an axis of {d}")
    if not np.array_equal(ind, np.arange(ind[0], ind[0] + ind.size)):
        raise Unsupported(node, "Gather of constant indices that are not one contiguous run")
    out = node.outputs[0]
    st, en = int(ind[0]), int(ind[-1]) + 1
    if (st, en) == (0, d):
        ctx.emit("view", {}, (x,), out, node)
        return
    shape = list(xs)
    shape[axis] = en - st
    sl = ctx.emit("slice", {"dims": "x".join(map(str, xs)), "axis": axis, "start": st, "end": en}, (x,),
                  f"{out}:slice", node, tuple(shape))
    ctx.emit("view", {}, (sl,), out, node)


def _reduce(kind: str) -> Callable[[_Ctx, Node], None]:
    """ReduceMean / ReduceSum / ReduceMax over trailing axes (ShuffleNet's x.mean([2, 3])): the
    tensor viewed as (outer, inner) rows, one row reduction, a 1/inner scale for the mean. A block
    of axes with others after it (a sum over the middle axis) is transposed to the end first."""
    def fn(ctx: _Ctx, node: Node) -> None:
        x = _runtime(ctx, node, node.inputs[0], "input")
        xs = ctx.shape(x)
        if len(node.inputs) > 1 and node.inputs[1]:
            axes = [int(v) for v in _need_const(ctx, node, node.inputs[1], "axes").astype(np.int64).reshape(-1)]
        else:
            axes = list(node.attrs.get("axes", range(len(xs))))
        axes = sorted({a % len(xs) for a in axes})
        out = node.outputs[0]
        if kind in ("sum", "mean") and _fold_bag(ctx, node, x, axes, kind):
            return
        kept_after = [i for i in range(axes[0], len(xs)) if i not in axes] if axes else []
        if any(xs[i] != 1 for i in kept_after):
            # a block of axes with non-unit axes after it (DeepFM's sum over the fields of a
            # (batch, fields, dim) tensor): (outer, r, inner) transposed to (outer, inner, r) by a
            # data-movement kernel, then the row reduction
            if axes != list(range(axes[0], axes[-1] + 1)):
                raise Unsupported(node, f"{node.op_type} over axes {axes} of a {len(xs)}-D tensor (trailing axes, or "
                                        "one contiguous block of axes, are lowered)")
            outer = int(np.prod(xs[:axes[0]], dtype=np.int64))
            r = int(np.prod(xs[axes[0]:axes[-1] + 1], dtype=np.int64))
            inner = int(np.prod(xs[axes[-1] + 1:], dtype=np.int64))
            cube = ctx.emit("view", {}, (x,), f"{out}:3d", node, (outer, r, inner))
            t = ctx.emit("transpose", {"dims": f"{outer}x{r}x{inner}", "perm": "021"}, (cube,), f"{out}:t", node,
                         (outer, inner, r))
            x, outer, inner = t, outer * inner, r
        else:  # trailing axes (unit axes after the first reduced one count as trailing)
            outer = int(np.prod([xs[i] for i in range(len(xs)) if i not in axes], dtype=np.int64))
            inner = int(np.prod([xs[a] for a in axes], dtype=np.int64))
        rows = ctx.emit("view", {}, (x,), f"{out}:rows", node, (outer, inner))
        op = "reduce_max" if kind == "max" else "reduce_sum"
        red = ctx.emit(op, {"m": outer, "n": inner}, (rows,), f"{out}:red", node, (outer,))
        if kind == "mean":
            red = ctx.emit("ew_chain", {**ew_params((outer,)), "chain": f"affine:{1.0 / inner!r}:0.0"}, (red,),
                           f"{out}:mean", node, (outer,))
        ctx.emit("view", {}, (red,), out, node, ctx.shapes[out])
    return fn


def _fold_bag(ctx: _Ctx, node: Node, x: str, axes: list[int], kind: str) -> bool:
    """A sum (or mean) over the ids' last axes of an embedding lookup that only it reads
    (`emb(ids).sum(1)` of ids (batch, bag): nn.EmbeddingBag's sum written out) is the lookup's
    bag sum: the `gather` takes `bag` and writes one row per bag, so the looked-up rows never
    leave the chip. True when folded."""
    rows = ctx.rows.get(x)
    g = _producer(ctx, rows) if rows is not None else None
    xs = ctx.shape(x)
    if g is None or g.kind != "gather" or int(g.params.get("bag", 1)) != 1 or ctx.uses[x] != 1 or not axes:
        return False
    if axes != list(range(axes[0], len(xs) - 1)):  # the block of axes just before the row's
        return False
    b = int(np.prod([xs[a] for a in axes], dtype=np.int64))
    n, d = ctx.shape(rows)
    view = _producer(ctx, x)
    if b < 2 or view is None or view.kind != "view" or view.inputs != (rows,):
        return False
    ctx.prims[ctx.prims.index(g)] = replace(g, params={**g.params, "bag": b})
    ctx.prims.remove(view)
    ctx.row_views.discard(x)
    del ctx.rows[x]
    ctx.shapes[rows] = (n // b, d)
    out = node.outputs[0]
    if kind == "mean":
        rows = ctx.emit("ew_chain", {**ew_params((n // b, d)), "chain": f"affine:{1.0 / b!r}:0.0"}, (rows,),
                        f"{out}:mean", node, (n // b, d))
    ctx.emit("view", {}, (rows,), out, node, ctx.shapes[out])
    return True


def _emit_fm(ctx: _Ctx, node: Node, e: str, keepdims: bool) -> None:
    """The FM chain ending at this Sub (`graph.fm`): one `fm_interaction` over e (b, f, k), its
    (b, k) result viewed as the Sub's output ((b, 1, k) with keepdims)."""
    e = _runtime(ctx, node, e, "embeddings")
    b, f, k = (int(v) for v in ctx.shape(e))
    y = ctx.emit("fm_interaction", {"b": b, "f": f, "k": k}, (e,), f"{node.outputs[0]}:fm", node, (b, k))
    ctx.emit("view", {}, (y,), node.outputs[0], node, ctx.shapes[node.outputs[0]])


def _layer_norm(ctx: _Ctx, node: Node) -> None:
    """LayerNormalization over the last axis: one `layer_norm` kernel over the (rows, last axis)
    view, its statistics in fp32 whatever the plan's dtype. A residual add that feeds it alone
    fuses with it into `add_layer_norm` (onnxruntime's SkipLayerNormalization)."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    axis = int(node.attrs.get("axis", -1)) % len(xs)
    if axis != len(xs) - 1:
        raise Unsupported(node, f"LayerNormalization over axes {axis}.. of a {len(xs)}-D tensor (the last axis only)")
    if len(node.outputs) > 1 and any(node.outputs[1:]):
        raise Unsupported(node, "LayerNormalization's mean / inv_std_dev outputs are read (training only)")
    eps = float(node.attrs.get("epsilon", 1e-5))
    n = int(xs[-1])
    out = node.outputs[0]
    gamma = _need_const(ctx, node, node.inputs[1], "scale").reshape(-1)
    beta = (_need_const(ctx, node, node.inputs[2], "B").reshape(-1) if len(node.inputs) > 2 and node.inputs[2]
            else np.zeros(n, np.float32))
    if gamma.size != n or beta.size != n:
        raise Unsupported(node, f"LayerNormalization scale / B of {gamma.size} / {beta.size} values for {n} columns")
    _emit_layer_norm(ctx, node, x, gamma, beta, eps, out)


def _emit_layer_norm(ctx: _Ctx, node: Node, x: str, gamma: np.ndarray, beta: np.ndarray, eps: float, out: str
                     ) -> None:
    """One `layer_norm` over the rows of `x` into `out` (a residual Add of two N-D values read by it
    alone is re-emitted on their rows, so the partitioner fuses the two into add_layer_norm)."""
    xs = ctx.shape(x)
    m, n = int(np.prod(xs[:-1], dtype=np.int64)), int(xs[-1])
    add = _producer(ctx, x)
    if x not in ctx.rows and add is not None and add.kind == "add" and ctx.uses[x] == 1 and \
            all(v not in ctx.consts and tuple(ctx.shape(v)) == tuple(xs) for v in add.inputs):
        # a residual add of two N-D values: on their rows, so it fuses with the normalisation
        ctx.prims.remove(add)
        a2, b2 = (_as_rows(ctx, node, v, (m, n), f"{x}:{i}:rows") for i, v in enumerate(add.inputs))
        ctx.prims.append(replace(add, params=ew_params((m, n)), inputs=(a2, b2), outputs=(f"{x}:rows",)))
        ctx.shapes[f"{x}:rows"] = (m, n)
        rows = f"{x}:rows"
    else:
        rows = _as_rows(ctx, node, x, (m, n), f"{out}:rows")
    g, b = ctx.const(f"{node.name}:gamma", gamma), ctx.const(f"{node.name}:beta", beta)
    y = ctx.emit("layer_norm", {"rows": m, "cols": n, "eps": repr(eps)}, (rows, g, b), f"{out}:2d", node, (m, n))
    _back_to_nd(ctx, node, y, out, tuple(xs))


def _written_out_layer_norms(ctx: _Ctx) -> tuple[dict[str, tuple], set[str]]:
    """LayerNorm as older exporters write it (opset < 17: ReduceMean, Sub, Pow 2, ReduceMean, Add
    eps, Sqrt, Div, Mul gamma, Add beta over the last axis), found before lowering: {name of its
    last node: (x, gamma, beta, eps, output)} and the names of the nodes it replaces. Every
    intermediate is read only inside the pattern (x - mean twice); gamma and beta constants."""
    g = ctx.graph
    by_out = {o: n for n in g.nodes for o in n.outputs}
    readers: dict[str, list[Node]] = {}
    for n in g.nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n)

    def only(v: str, op: str, count: int = 1) -> list[Node] | None:
        r = readers.get(v, [])
        return r if len(r) == count and all(x.op_type == op for x in r) and v not in g.outputs else None

    def scalar(v: str) -> float | None:
        c = ctx.consts.get(v)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None

    def other(node: Node, v: str) -> str:
        return node.inputs[1] if node.inputs[0] == v else node.inputs[0]

    def last_axis(node: Node, x: str) -> bool:
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] in ctx.consts:
            axes = ctx.consts[node.inputs[1]].reshape(-1).tolist()
        nd = len(ctx.shape(x)) if x in ctx.shapes or x in ctx.consts else 0
        return nd > 0 and axes is not None and [int(a) % nd for a in axes] == [nd - 1] and \
            int(node.attrs.get("keepdims", 1)) == 1

    found: dict[str, tuple] = {}
    skip: set[str] = set()
    for mean in (n for n in g.nodes if n.op_type == "ReduceMean"):
        try:
            x = mean.inputs[0]
            if not last_axis(mean, x) or not (sub := only(mean.outputs[0], "Sub")) or sub[0].inputs != (x, mean.outputs[0]):
                continue
            xc = sub[0].outputs[0]
            r = readers.get(xc, [])
            pw = next((q for q in r if q.op_type == "Pow"), None)
            dv = next((q for q in r if q.op_type == "Div"), None)
            if len(r) != 2 or pw is None or dv is None or scalar(pw.inputs[1]) != 2.0 or dv.inputs[0] != xc:
                continue
            var = only(pw.outputs[0], "ReduceMean")
            if not var or not last_axis(var[0], pw.outputs[0]):
                continue
            add = only(var[0].outputs[0], "Add")
            eps = scalar(other(add[0], var[0].outputs[0])) if add else None
            sq = only(add[0].outputs[0], "Sqrt") if eps is not None else None
            if not sq or by_out.get(dv.inputs[1]) is not sq[0] or not only(sq[0].outputs[0], "Div"):
                continue
            nodes, y = [mean, sub[0], pw, var[0], add[0], sq[0], dv], dv.outputs[0]
            n_cols = int(ctx.shape(x)[-1])
            gamma, beta = np.ones(n_cols, np.float32), np.zeros(n_cols, np.float32)
            if (mul := only(y, "Mul")) and other(mul[0], y) in ctx.consts and ctx.consts[other(mul[0], y)].size == n_cols:
                gamma, y = ctx.consts[other(mul[0], y)].reshape(-1), mul[0].outputs[0]
                nodes.append(mul[0])
                if (badd := only(y, "Add")) and other(badd[0], y) in ctx.consts and \
                        ctx.consts[other(badd[0], y)].size == n_cols:
                    beta, y = ctx.consts[other(badd[0], y)].reshape(-1), badd[0].outputs[0]
                    nodes.append(badd[0])
        except (KeyError, IndexError):
            continue
        found[nodes[-1].name] = (x, gamma.astype(np.float32), beta.astype(np.float32), float(eps), y)
        skip.update(q.name for q in nodes[:-1])
    return found, skip


def _lstm(ctx: _Ctx, node: Node) -> None:
    """LSTM (ONNX's default activations) as one `lstm` kernel per direction: see `_recurrent`."""
    _recurrent(ctx, node, "lstm")


def _gru(ctx: _Ctx, node: Node) -> None:
    """GRU (ONNX's default activations, linear_before_reset 0 or 1 -> `lbr`) as one `gru` kernel
    per direction: see `_recurrent`."""
    _recurrent(ctx, node, "gru")


_RNN = {  # kind -> (ONNX op, gates, default activations of one direction, initial-state inputs)
    "lstm": ("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"), ("h0", "c0")),
    "gru": ("GRU", 3, ("Sigmoid", "Tanh"), ("h0",)),
}


def _recurrent(ctx: _Ctx, node: Node, kind: str) -> None:
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
    x = _runtime(ctx, node, ins[0], "X")
    xs = tuple(int(v) for v in ctx.shape(x))
    if len(xs) != 3:
        raise Unsupported(node, f"{op} of a {len(xs)}-D X (3-D expected)")
    if layout:  # X (b, t, i) -> (t, b, i)
        xs = (xs[1], xs[0], xs[2])
        x = _rnn_transpose(ctx, node, x, (xs[1], xs[0], xs[2]), (1, 0, 2), f"{node.name}:X")
    t, b, i = xs
    w, r = _need_const(ctx, node, ins[1], "W"), _need_const(ctx, node, ins[2], "R")
    h = int(r.shape[-1])
    if w.shape != (nd, gates * h, i) or r.shape != (nd, gates * h, h):
        raise Unsupported(node, f"{op} W {list(w.shape)} / R {list(r.shape)} do not match {nd} direction(s) "
                                f"of hidden size {h} over X {list(ctx.shape(ins[0]))}")
    bias = (_need_const(ctx, node, ins[3], "B") if ins[3] else np.zeros((nd, 2 * gates * h), np.float32))
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


def _rnn_state(ctx: _Ctx, node: Node, k: str, v: str, nd: int, b: int, h: int, layout: int
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


def _rnn_transpose(ctx: _Ctx, node: Node, x: str, xs: tuple[int, ...], perm: tuple[int, ...], out: str) -> str:
    """`x` (shape `xs`) transposed by `perm` into `out`: a view when only unit axes move."""
    oshape = tuple(xs[p] for p in perm)
    moved = [p for p in perm if xs[p] != 1]
    if moved == sorted(moved):
        return ctx.emit("view", {}, (x,), out, node, oshape)
    return ctx.emit("transpose", {"dims": "x".join(map(str, xs)), "perm": "".join(map(str, perm))}, (x,), out, node,
                    oshape)


def _rnn_stack(ctx: _Ctx, node: Node, parts: list[str], outer: int, inner: int, out: str,
               shape: tuple[int, ...]) -> str:
    """The directions' values (each `outer` x `inner`) side by side on the direction axis, viewed as
    `shape`: one direction is a view, two a `concat` of their (outer, inner, 1, 1) views."""
    if len(parts) == 1:
        return ctx.emit("view", {}, (parts[0],), out, node, shape)
    flat = [ctx.emit("view", {}, (p,), f"{out}:in{k}", node, (outer, inner, 1, 1)) for k, p in enumerate(parts)]
    cat = ctx.emit("concat", {"n": outer, "c": inner, "c1": inner, "h": 1, "w": 1, "layout": "NCHW"}, tuple(flat),
                   f"{out}:cat", node, (outer, 2 * inner, 1, 1))
    return ctx.emit("view", {}, (cat,), out, node, shape)


def _lrn(ctx: _Ctx, node: Node) -> None:
    """LRN as the hardware would run it: x*x (vector), the sum over the channel window as a 1x1
    convolution with a banded weight scaled by alpha/size (cube), (bias + s)**-beta (vector),
    times x (vector)."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    if len(xs) != 4:
        raise Unsupported(node, f"LRN over a {len(xs)}-D tensor (4-D NCHW only)")
    size = int(node.attrs["size"])
    alpha, beta, bias = (float(node.attrs.get(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    n, c, h, w = xs
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    band = np.zeros((c, c, 1, 1), np.float32)
    for k in range(c):
        band[k, max(0, k - lo):min(c, k + hi + 1), 0, 0] = alpha / size
    out = node.outputs[0]
    ew = ew_params(xs)
    sq = ctx.emit("ew_chain", {**ew, "chain": "mul"}, (x, x), f"{out}:sq", node, xs)
    s = ctx.emit("conv2d", {"n": n, "c": c, "h": h, "w": w, "k": c, "r": 1, "s": 1, "stride": 1, "pad": 0,
                            "dilation": 1, "groups": 1, "layout": "NCHW"},
                 (sq, ctx.const(f"{node.name}:band", band)), f"{out}:sum", node, xs)
    den = ctx.emit("ew_chain", {**ew, "chain": f"affine:1.0:{bias!r};pow:{-beta!r}"}, (s,), f"{out}:den", node, xs)
    ctx.emit("ew_chain", {**ew, "chain": "mul"}, (den, x), out, node, xs)


def _dropout(ctx: _Ctx, node: Node) -> None:
    """Inference Dropout: the identity (kept only when it produces a graph output)."""
    if len(node.outputs) > 1 and node.outputs[1]:
        raise Unsupported(node, "the Dropout mask output is read; in inference it is all ones, export without it")
    _view(ctx, node)


def _hard_sigmoid(ctx: _Ctx, node: Node) -> None:
    x = _runtime(ctx, node, node.inputs[0], "input")
    a, b = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    ctx.emit("ew_chain", {**ew_params(ctx.shape(x)), "chain": f"affine:{a!r}:{b!r};clip:0.0:1.0"}, (x,),
             node.outputs[0], node)


# Masks given at run time: an int / bool graph input that only mask ops read (through int / bool
# values: Cast, Equal, Not, the condition of Where, views and Expand) is a mask input. The executor
# stores it as the plan's float dtype when it is fed (`mask_values`), and every int / bool value
# computed from it is a float 0/1 (bool) or integer-valued (int) tensor: Cast is a view (int -> bool
# is clip(x*x, 0, 1)), Equal with a constant c is 1 - clip((x - c)^2, 0, 1), Not is 1 - x, and
# Where(c, a, b) is b + c * (a - b), an `ew_chain`; `-inf` (masked_fill) is kept finite at -3e4.
MASK_OPS = ("Cast", "Equal", "Not", "Where", "Unsqueeze", "Reshape", "Squeeze", "Flatten", "Expand", "Identity")
MASK_NEG = 3.0e4  # |a constant| of a Where is at most this: -inf finite in fp16, and exp(-3e4 - max) is 0


def is_int(dtype: str) -> bool:
    """An integer or bool dtype name (the tensors no target kernel computes with as such)."""
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def mask_values(graph: Graph) -> set[str]:
    """The mask inputs (see above) and every int / bool value computed from them: the graph inputs of
    an int / bool dtype none of whose readers, nor the readers of the int / bool values they compute,
    is anything but a mask op (Where and the views reading them as their data / condition only), and
    that are not graph outputs. An input that a Gather also reads (token ids) is not a mask."""
    readers: dict[str, list[tuple[Node, int]]] = {}
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            if v:
                readers.setdefault(v, []).append((n, i))
    found: set[str] = set()
    for name, _ in graph.inputs:
        if not is_int(graph.dtype(name)):
            continue
        seen, todo, ok = {name}, [name], True
        while todo and ok:
            v = todo.pop()
            ok = v not in graph.outputs
            for n, i in readers.get(v, ()):
                if n.op_type not in MASK_OPS or (i != 0 and n.op_type not in ("Equal",)):
                    ok = False
                    break
                for o in n.outputs:
                    if o and is_int(graph.dtype(o)) and o not in seen:
                        seen.add(o)
                        todo.append(o)
        if ok:
            found |= seen
    return found


def _bcast_runtime(ctx: _Ctx, node: Node, v: str, oshape: tuple[int, ...], out: str) -> str:
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


def _expand(ctx: _Ctx, node: Node) -> None:
    """Expand of a runtime tensor (a padding mask to every head): a view when it only adds unit axes,
    else copies by `concat` kernels (`_bcast_runtime`)."""
    x = _runtime(ctx, node, node.inputs[0], "input")
    out = node.outputs[0]
    y = _bcast_runtime(ctx, node, x, ctx.shapes[out], f"{out}:bc")
    ctx.emit("view", {}, (y,), out, node, ctx.shapes[out])


def _cast(ctx: _Ctx, node: Node) -> None:
    """Cast of a mask value (a view: the plan stores it as floats already; int -> bool is
    clip(x*x, 0, 1), 1 for any nonzero integer), or of a float tensor to float32 (a view)."""
    from onnx import helper
    x = _runtime(ctx, node, node.inputs[0], "input")
    to = helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])).name
    src = ctx.graph.dtype(x)
    out = node.outputs[0]
    if is_int(src):  # a mask value (`lower` refuses any other integer tensor)
        if to == "bool" and src != "bool":
            ctx.emit("ew_chain", {**ew_params(ctx.shape(x)), "chain": "mul;clip:0.0:1.0"}, (x, x), out, node,
                     ctx.shape(x))
        else:
            ctx.emit("view", {}, (x,), out, node, ctx.shape(x))
        return
    if to != "float32":
        raise Unsupported(node, f"Cast of a {src} tensor to {to} (a float32 result, or casts of integer / bool "
                                "masks, are lowered)")
    ctx.emit("view", {}, (x,), out, node, ctx.shape(x))


def _equal(ctx: _Ctx, node: Node) -> None:
    """Equal of a mask value and a scalar constant c: 1 - clip((x - c)^2, 0, 1), one `ew_chain`
    ((x - 2c) * x + c^2 of integer-valued x; x or 1 - x for a bool x). Exact for integers while the
    plan's dtype holds (x - c)^2, and for any larger it is clipped to 1 anyway."""
    a, b = node.inputs[:2]
    if a in ctx.consts:
        a, b = b, a
    x = _runtime(ctx, node, a, "input")
    c = _scalar(ctx, b)
    if not is_int(ctx.graph.dtype(x)) or c is None:
        raise Unsupported(node, "Equal of a runtime integer / bool mask and a scalar constant is lowered "
                                f"(got {ctx.graph.dtype(x)} {list(ctx.shape(x))} and {b!r})")
    xs, out = ctx.shape(x), node.outputs[0]
    if ctx.graph.dtype(x) == "bool":
        if c:
            ctx.emit("view", {}, (x,), out, node, xs)
        else:
            ctx.emit("ew_chain", {**ew_params(xs), "chain": "affine:-1.0:1.0"}, (x,), out, node, xs)
        return
    chain = f"affine:1.0:{-2.0 * c!r};mul;affine:1.0:{c * c!r};clip:0.0:1.0;affine:-1.0:1.0"
    ctx.emit("ew_chain", {**ew_params(xs), "chain": chain}, (x, x), out, node, xs)


def _not(ctx: _Ctx, node: Node) -> None:
    _unary(ctx, node, "ew_chain", {"chain": "affine:-1.0:1.0"})


def _where(ctx: _Ctx, node: Node) -> None:
    """Where(c, a, b) with c a bool mask (0/1 floats): b + c * (a - b), one `ew_chain` on the
    broadcast shape (runtime operands broadcast by `_bcast_runtime`, constants materialized). Its
    constants are clipped to +-3e4 (masked_fill's -inf: finite in fp16, exp(-3e4 - max) is 0).
    Two forms are additive: constants a and b (a padding mask: c * (a - b) + b, one `affine` on
    c), and masked_fill(c, -inf) of scores that only softmaxes read: scores + c * -3e4 (the same
    probabilities), so the attention pattern (scores + mask -> softmax) keeps its kernel."""
    c, a, b = node.inputs[:3]
    out = node.outputs[0]
    oshape = tuple(ctx.shapes[out])
    if c in ctx.consts:
        raise Unsupported(node, "Where with a constant condition and runtime values (a runtime mask is lowered)")
    if ctx.graph.dtype(c) != "bool":
        raise Unsupported(node, f"Where with a {ctx.graph.dtype(c)} condition")
    for v in (a, b):
        if is_int(ctx.graph.dtype(v)):
            raise Unsupported(node, f"Where of the integer tensor {v!r} (float values are lowered)")

    def const(v: str) -> np.ndarray:
        return np.clip(ctx.consts[v].astype(np.float32), -MASK_NEG, MASK_NEG)
    av = float(const(a).reshape(-1)[0]) if a in ctx.consts and ctx.consts[a].size == 1 else None
    bv = float(const(b).reshape(-1)[0]) if b in ctx.consts and ctx.consts[b].size == 1 else None
    cs = tuple(ctx.shape(c))
    if av is not None and bv is not None:  # c * (a - b) + b, on c's shape, then broadcast
        mid = f"{out}:sel" if cs != oshape else out
        ctx.emit("ew_chain", {**ew_params(cs), "chain": f"affine:{av - bv!r}:{bv!r}"}, (c,), mid, node, cs)
        if mid != out:
            y = _bcast_runtime(ctx, node, mid, oshape, f"{out}:bc")
            ctx.emit("view", {}, (y,), out, node, oshape)
        return
    readers = [r for r in ctx.graph.nodes if out in r.inputs]
    if av is not None and av <= -MASK_NEG and b not in ctx.consts and out not in ctx.graph.outputs and readers \
            and all(r.op_type == "Softmax" for r in readers):
        m = f"{out}:mask"
        ctx.emit("ew_chain", {**ew_params(cs), "chain": f"affine:{av!r}:0.0"}, (c,), m, node, cs)
        _binary(ctx, node, b, m, out, "add")
        return
    operands: list[str] = []
    steps: list[str] = []

    made: dict[str, str] = {}

    def full(v: str, tag: str) -> str:  # v at the broadcast shape (each made once)
        if tag not in made:
            made[tag] = ctx.const(f"{node.name}:{tag}", np.broadcast_to(const(v), oshape)) if v in ctx.consts \
                else _bcast_runtime(ctx, node, v, oshape, f"{out}:{tag}")
        return made[tag]
    if a not in ctx.consts:  # x = a; a - b
        x = full(a, "a")
        if bv is not None:
            steps.append(f"affine:1.0:{-bv!r}")
        else:
            steps.append("sub")
            operands.append(full(b, "b"))
    else:  # x = b; a - b = -b + a
        x = full(b, "b")
        if av is not None:
            steps.append(f"affine:-1.0:{av!r}")
        else:
            steps += ["affine:-1.0:0.0", "add"]
            operands.append(full(a, "a"))
    steps.append("mul")
    operands.append(full(c, "c"))
    if bv is not None:
        steps.append(f"affine:1.0:{bv!r}")
    else:
        steps.append("add")
        operands.append(full(b, "b"))
    ctx.emit("ew_chain", {**ew_params(oshape), "chain": ";".join(steps)}, (x, *operands), out, node, oshape)


# The one table of supported ONNX ops: each op's lowering. Constant and ConstantOfShape never reach
# it: the importer folds every constant subgraph (`importer.py`).
_LOWER: dict[str, Callable[[_Ctx, Node], None]] = {
    "Conv": _conv, "BatchNormalization": _batch_norm, "Relu": _relu, "Add": _add, "Sum": _sum, "Mul": _mul,
    "Gemm": _gemm, "MatMul": _matmul, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global_avg, "Flatten": _view, "Reshape": _view, "Squeeze": _view, "Unsqueeze": _view,
    "Softmax": _softmax, "LogSoftmax": _log_softmax, "Clip": _clip, "Concat": _concat, "Sigmoid": _chain("sigmoid"),
    "HardSigmoid": _hard_sigmoid, "HardSwish": lambda c, n: _unary(c, n, "hardswish", {}), "Transpose": _transpose, "Slice": _slice,
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("max"), "LRN": _lrn,
    "Identity": _view, "Dropout": _dropout, "Sub": _sub, "Div": _div, "Pow": _pow, "Erf": _chain("erf"),
    "Tanh": _chain("tanh"), "Gelu": _gelu, "Sqrt": _chain("pow:0.5"), "Reciprocal": _chain("rec"),
    "LayerNormalization": _layer_norm, "Gather": _gather, "LSTM": _lstm, "GRU": _gru,
    "Cast": _cast, "Equal": _equal, "Not": _not, "Where": _where, "Expand": _expand,
}
SUPPORTED = (*_LOWER, "Constant", "ConstantOfShape")  # what `lower` takes, as its error message lists it
