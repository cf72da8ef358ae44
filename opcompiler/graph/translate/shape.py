"""Views and data movement: Flatten / Reshape / Squeeze / Unsqueeze / Identity / Dropout (zero-cost
views), Concat, Transpose, Slice, and Gather of constant indices (a slice); Gather of runtime ids
into a constant table is an embedding lookup (`recsys.embedding`)."""
from __future__ import annotations

import numpy as np

from ..importer import Node
from .common import Ctx, Unsupported, need_const, runtime
from .recsys import embedding


def view(ctx: Ctx, node: Node) -> None:
    x = node.inputs[0]
    if x in ctx.consts:
        raise Unsupported(node, "a view of a constant (should have been folded)")
    ctx.emit("view", {}, (x,), node.outputs[0], node)


def dropout(ctx: Ctx, node: Node) -> None:
    """Inference Dropout: the identity (kept only when it produces a graph output)."""
    if len(node.outputs) > 1 and node.outputs[1]:
        raise Unsupported(node, "the Dropout mask output is read; in inference it is all ones, export without it")
    view(ctx, node)


def concat(ctx: Ctx, node: Node) -> None:
    ins = [v for v in node.inputs if v]
    if len(ins) == 1:  # torch.cat([x]) (DenseNet's first dense layer): the identity
        ctx.emit("view", {}, (runtime(ctx, node, ins[0], "input"),), node.outputs[0], node)
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


def _concat_flat(ctx: Ctx, node: Node, ins: list[str], shapes: list[tuple[int, ...]], axis: int) -> None:
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


def transpose(ctx: Ctx, node: Node) -> None:
    """Transpose (ShuffleNet's channel shuffle, NHWC<->NCHW at a model's edges): a data-movement kernel."""
    x = runtime(ctx, node, node.inputs[0], "input")
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


def slice_(ctx: Ctx, node: Node) -> None:
    """Slice with step 1 (ShuffleNet's channel split): one data-movement kernel per sliced axis."""
    x = runtime(ctx, node, node.inputs[0], "input")
    xs = list(ctx.shape(x))
    if ctx.graph.opset < 10:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes, steps = list(node.attrs.get("axes", range(len(starts)))), [1] * len(starts)
    else:
        ins = list(node.inputs) + ["", ""]
        starts = [int(v) for v in need_const(ctx, node, ins[1], "starts").astype(np.int64).reshape(-1)]
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


def gather(ctx: Ctx, node: Node) -> None:
    """Gather with constant indices that are one contiguous run (the packed-QKV split of
    nn.MultiheadAttention: index 0, 1 or 2 of the stacked projections): a `slice` kernel, then a
    view that drops the axis for a scalar index. Runtime indices are an embedding lookup
    (`recsys.embedding`)."""
    if node.inputs[1] not in ctx.consts:
        embedding(ctx, node)
        return
    x = runtime(ctx, node, node.inputs[0], "data")
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
