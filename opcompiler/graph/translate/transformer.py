"""Transformer ops: MatMul (a Linear on [..., M, K] as one GEMM of rows; attention's batched
products) and Gemm, Softmax / LogSoftmax, LayerNormalization, and LayerNorm as older exporters
write it out (found by a pre-pass: `written_out_layer_norms`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..importer import Node
from .common import Ctx, Prim, Unsupported, as_rows, back_to_nd, binary, ew_params, need_const, producer, runtime


def gemm(ctx: Ctx, node: Node) -> None:
    a = runtime(ctx, node, node.inputs[0], "A")
    trans_a = int(node.attrs.get("transA", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    b = need_const(ctx, node, node.inputs[1], "B")
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
    c = need_const(ctx, node, node.inputs[2], "C") * np.float32(beta)
    ctx.consts[f"{node.name}:C"] = c
    ctx.shapes[out] = (m, n)
    binary(ctx, node, mid, f"{node.name}:C", out, "add")


def matmul(ctx: Ctx, node: Node) -> None:
    """MatMul with numpy's rules. 2-D x 2-D is one GEMM. A [..., M, K] times one matrix B ([K, N],
    or [1, .., K, N]: a Linear on [B, S, D]) is one GEMM of M = prod(...)*M rows, the result a row
    view (`Ctx.rows`). Two batched operands (attention's Q K^T, P V) are not lowered."""
    a, b = node.inputs[0], node.inputs[1]
    runtime(ctx, node, a, "A")
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
        b2 = as_rows(ctx, node, b, (k, n), f"{out}:B2d")
    a2 = as_rows(ctx, node, a, (m, k), f"{out}:A2d")
    y2 = ctx.emit("matmul", {"m": m, "k": k, "n": n, "trans_a": 0, "trans_b": 0}, (a2, b2), f"{out}:2d", node,
                  (m, n))
    back_to_nd(ctx, node, y2, out, tuple(oshape))


def _swaps_last_two(p: Prim | None) -> bool:
    if p is None or p.kind != "transpose":
        return False
    perm = [int(c) for c in str(p.params["perm"])]
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def _untransposed(ctx: Ctx, node: Node, b: str) -> str | None:
    """The B^T whose last-two-axes transpose `b` is, when the transpose (and a scalar affine step
    after it, which commutes: torch's scaled_dot_product_attention scales K^T) is read by this
    MatMul alone: the transpose kernel is dropped and the MatMul reads B^T with trans_b = 1."""
    prod = producer(ctx, b)
    affine = None
    if prod is not None and prod.kind == "ew_chain" and str(prod.params["chain"]).startswith("affine:") \
            and len(prod.inputs) == 1 and ctx.uses[b] == 1:
        affine, prod = prod, producer(ctx, prod.inputs[0])
    if not _swaps_last_two(prod) or ctx.uses[prod.output] != 1 or (affine is None and ctx.uses[b] != 1):
        return None
    bt = prod.inputs[0]
    ctx.prims.remove(prod)
    if affine is None:
        return bt
    ctx.prims.remove(affine)
    return ctx.emit("ew_chain", {**ew_params(ctx.shape(bt)), "chain": affine.params["chain"]}, (bt,),
                    f"{b}:bt", node, ctx.shape(bt))


def _batched_matmul(ctx: Ctx, node: Node, a: str, b: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """Both operands batched (attention's Q K^T and P V): one batch_matmul over the flattened
    batch axes, B^T read directly (trans_b) where B is a transpose of its last two axes. The
    result is (batch * M, N) rows with an N-D row view: the scale, mask and softmax that follow
    in attention run on the rows, so they chain into one attention kernel."""
    runtime(ctx, node, b, "B")
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
    back_to_nd(ctx, node, y, out, ctx.shapes.get(out, (*lead_a, m, n)))


def softmax(ctx: Ctx, node: Node, log: bool = False) -> None:
    """Softmax (LogSoftmax: `log`) over rows of a 2-D view. Before opset 13 `axis` flattens the
    tensor into [prod(shape[:axis]), prod(shape[axis:])]; from 13 on it is one axis: the last (or
    one followed by unit axes only) is the rows, any other is moved last by a data-movement kernel
    ((outer, r, inner) -> (outer, inner, r), as a reduction over a middle axis) and moved back after.
    LogSoftmax is the softmax then the `ln` step (in fp16, log-probabilities below ln of fp16's
    smallest subnormal, about -16.6, are -inf)."""
    x = runtime(ctx, node, node.inputs[0], "input")
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


def log_softmax(ctx: Ctx, node: Node) -> None:
    softmax(ctx, node, log=True)


def _softmax_rows(ctx: Ctx, node: Node, x: str, xs: tuple[int, ...], m: int, n: int, out: str, log: bool) -> str:
    """`out` (shape xs) = softmax (then ln for `log`) over the rows of x viewed as (m, n)."""
    def rows(src: str, name: str) -> str:
        p = ctx.emit("softmax", {"m": m, "n": n}, (src,), name if not log else f"{name}:p", node, (m, n))
        if log:
            p = ctx.emit("ew_chain", {**ew_params((m, n)), "chain": "ln"}, (p,), name, node, (m, n))
        return p
    x2 = ctx.rows.get(x)
    if x2 is not None and tuple(ctx.shape(x2)) == (m, n):  # the rows of a batched product (attention's scores)
        back_to_nd(ctx, node, rows(x2, f"{out}:rows"), out, xs)
        return out
    if tuple(xs) == (m, n):
        return rows(x, out)
    flat = ctx.emit("view", {}, (x,), f"{out}:2d", node, (m, n))
    mid = rows(flat, f"{out}:sm")
    return ctx.emit("view", {}, (mid,), out, node, xs)


def layer_norm(ctx: Ctx, node: Node) -> None:
    """LayerNormalization over the last axis: one `layer_norm` kernel over the (rows, last axis)
    view, its statistics in fp32 whatever the plan's dtype. A residual add that feeds it alone
    fuses with it into `add_layer_norm` (onnxruntime's SkipLayerNormalization)."""
    x = runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    axis = int(node.attrs.get("axis", -1)) % len(xs)
    if axis != len(xs) - 1:
        raise Unsupported(node, f"LayerNormalization over axes {axis}.. of a {len(xs)}-D tensor (the last axis only)")
    if len(node.outputs) > 1 and any(node.outputs[1:]):
        raise Unsupported(node, "LayerNormalization's mean / inv_std_dev outputs are read (training only)")
    eps = float(node.attrs.get("epsilon", 1e-5))
    n = int(xs[-1])
    out = node.outputs[0]
    gamma = need_const(ctx, node, node.inputs[1], "scale").reshape(-1)
    beta = (need_const(ctx, node, node.inputs[2], "B").reshape(-1) if len(node.inputs) > 2 and node.inputs[2]
            else np.zeros(n, np.float32))
    if gamma.size != n or beta.size != n:
        raise Unsupported(node, f"LayerNormalization scale / B of {gamma.size} / {beta.size} values for {n} columns")
    emit_layer_norm(ctx, node, x, gamma, beta, eps, out)


def emit_layer_norm(ctx: Ctx, node: Node, x: str, gamma: np.ndarray, beta: np.ndarray, eps: float, out: str
                     ) -> None:
    """One `layer_norm` over the rows of `x` into `out` (a residual Add of two N-D values read by it
    alone is re-emitted on their rows, so the partitioner fuses the two into add_layer_norm)."""
    xs = ctx.shape(x)
    m, n = int(np.prod(xs[:-1], dtype=np.int64)), int(xs[-1])
    add = producer(ctx, x)
    if x not in ctx.rows and add is not None and add.kind == "add" and ctx.uses[x] == 1 and \
            all(v not in ctx.consts and tuple(ctx.shape(v)) == tuple(xs) for v in add.inputs):
        # a residual add of two N-D values: on their rows, so it fuses with the normalisation
        ctx.prims.remove(add)
        a2, b2 = (as_rows(ctx, node, v, (m, n), f"{x}:{i}:rows") for i, v in enumerate(add.inputs))
        ctx.prims.append(replace(add, params=ew_params((m, n)), inputs=(a2, b2), outputs=(f"{x}:rows",)))
        ctx.shapes[f"{x}:rows"] = (m, n)
        rows = f"{x}:rows"
    else:
        rows = as_rows(ctx, node, x, (m, n), f"{out}:rows")
    g, b = ctx.const(f"{node.name}:gamma", gamma), ctx.const(f"{node.name}:beta", beta)
    y = ctx.emit("layer_norm", {"rows": m, "cols": n, "eps": repr(eps)}, (rows, g, b), f"{out}:2d", node, (m, n))
    back_to_nd(ctx, node, y, out, tuple(xs))


def written_out_layer_norms(ctx: Ctx) -> tuple[dict[str, tuple], set[str]]:
    """LayerNorm as older exporters write it (opset < 17: ReduceMean, Sub, Pow 2, ReduceMean, Add
    eps, Sqrt, Div, Mul gamma, Add beta over the last axis), found before translating: {name of its
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
