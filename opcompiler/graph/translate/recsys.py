"""Recommendation-model ops: embedding lookups (Gather of runtime ids into a constant table), the
ids + per-field offsets they fold in (`id_offsets`), bag sums folded into the lookup (`fold_bag`),
and DeepFM's pairwise term as one `fm_interaction` (`emit_fm`; the matcher is `fm.py`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..importer import Node
from .common import Ctx, Unsupported, ew_params, producer, runtime


def id_offsets(ctx: Ctx, node: Node) -> tuple[str, np.ndarray] | None:
    """(the ids, the offsets broadcast to their shape) when `node` is an Add of a runtime int32 /
    int64 tensor and a constant integer tensor that does not broadcast the ids, whose result only
    Gathers of a constant 2-D table on axis 0 read (not a graph output): DeepFM's `x + offsets`
    (the fields' ids into one table shared by every field). Else None: the Add is integer math,
    refused in `translate` like any other reader of an integer tensor."""
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


def embedding(ctx: Ctx, node: Node) -> None:
    """Gather of runtime int32 / int64 indices into a constant 2-D table on axis 0 (nn.Embedding):
    one `gather` kernel, the ids viewed as (n,), the rows (n, d) viewed back as ids.shape + (d,).
    Ids plus constant per-field offsets (`id_offsets`) are the ids and the offsets of one period."""
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


def fold_bag(ctx: Ctx, node: Node, x: str, axes: list[int], kind: str) -> bool:
    """A sum (or mean) over the ids' last axes of an embedding lookup that only it reads
    (`emb(ids).sum(1)` of ids (batch, bag): nn.EmbeddingBag's sum written out) is the lookup's
    bag sum: the `gather` takes `bag` and writes one row per bag, so the looked-up rows never
    leave the chip. True when folded."""
    rows = ctx.rows.get(x)
    g = producer(ctx, rows) if rows is not None else None
    xs = ctx.shape(x)
    if g is None or g.kind != "gather" or int(g.params.get("bag", 1)) != 1 or ctx.uses[x] != 1 or not axes:
        return False
    if axes != list(range(axes[0], len(xs) - 1)):  # the block of axes just before the row's
        return False
    b = int(np.prod([xs[a] for a in axes], dtype=np.int64))
    n, d = ctx.shape(rows)
    view = producer(ctx, x)
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


def emit_fm(ctx: Ctx, node: Node, e: str, keepdims: bool) -> None:
    """The FM chain ending at this Sub (`fm.py`): one `fm_interaction` over e (b, f, k), its
    (b, k) result viewed as the Sub's output ((b, 1, k) with keepdims)."""
    e = runtime(ctx, node, e, "embeddings")
    b, f, k = (int(v) for v in ctx.shape(e))
    y = ctx.emit("fm_interaction", {"b": b, "f": f, "k": k}, (e,), f"{node.outputs[0]}:fm", node, (b, k))
    ctx.emit("view", {}, (y,), node.outputs[0], node, ctx.shapes[node.outputs[0]])
