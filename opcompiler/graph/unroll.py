"""The unfused plan of a recurrent layer: its op-by-op kernels, step by step, through GM (and of an
embedding bag: the lookup, then the sum over the bag as its own kernels).

An `lstm` / `gru` prim is one persistent kernel in a fused plan. In the unfused plan it becomes
what an op-by-op framework runs (`opcompiler.ops.opbyop.decompose`: the input projection, then
per step the h R^T matmul and the gate kernels, every intermediate a tensor in GM), so `compare`
shows what the fused cell buys. The step's rows of the input projection and the reshapes are
views (no kernel: a contiguous range of a tensor, as `x[s]` is in any framework).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ops.opbyop import GATES, decompose
from .translate import Prim, ew_params

INPUTS = {"lstm": ("X", "W", "R", "B", "h0", "c0"), "gru": ("X", "W", "R", "B", "h0")}


def expand(prims: list[Prim], consts: dict[str, np.ndarray], shapes: dict[str, tuple]) -> list[Prim]:
    """`prims` with every recurrent prim replaced by its op-by-op kernels (constants derived from
    its weights added to `consts`, the new values' shapes to `shapes`)."""
    out: list[Prim] = []
    for p in prims:
        if p.kind == "gather" and int(p.params.get("bag", 1)) > 1:
            out.extend(_unbag(p, shapes))
        elif p.kind == "fm_interaction":
            out.extend(_unfm(p, shapes))
        elif p.kind in GATES:
            out.extend(_expand(p, consts, shapes))
        else:
            out.append(p)
    return out


def _unbag(p: Prim, shapes: dict[str, tuple]) -> list[Prim]:
    """An embedding lookup with its bag sum folded in (`translate.recsys.fold_bag`), as the graph reads
    unfused: the lookup's rows written to GM, then the sum over the bag axis as any middle-axis
    ReduceSum runs (the rows (bags, bag, d) transposed to (bags, d, bag), one row reduction)."""
    b = int(p.params["bag"])
    n, d = int(p.params["n"]), int(p.params["cols"])
    nb, pre = n // b, f"{p.output}:"
    shapes.update({pre + "rows": (n, d), pre + "3d": (nb, b, d), pre + "t": (nb, d, b), pre + "2d": (nb * d, b),
                   pre + "sum": (nb * d,)})
    mk = lambda kind, params, ins, out: Prim(kind=kind, params=params, inputs=ins, outputs=(out,),  # noqa: E731
                                              node=p.node, onnx_op=p.onnx_op)
    return [mk("gather", {**p.params, "bag": 1}, p.inputs, pre + "rows"),
            mk("view", {}, (pre + "rows",), pre + "3d"),
            mk("transpose", {"dims": f"{nb}x{b}x{d}", "perm": "021"}, (pre + "3d",), pre + "t"),
            mk("view", {}, (pre + "t",), pre + "2d"),
            mk("reduce_sum", {"m": nb * d, "n": b}, (pre + "2d",), pre + "sum"),
            mk("view", {}, (pre + "sum",), p.output)]


def _unfm(p: Prim, shapes: dict[str, tuple]) -> list[Prim]:
    """DeepFM's pairwise term (`graph.translate.fm`) as the model's nodes run one by one: the field sum
    (transpose to (b, k, f), a row reduction), squared; the squares, their field sum; the difference."""
    b, f, k = (int(p.params[x]) for x in ("b", "f", "k"))
    e, pre = p.inputs[0], f"{p.output}:"
    made: list[Prim] = []

    def mk(kind: str, params: dict, ins: tuple, out: str, shape: tuple) -> str:
        shapes[out] = shape
        made.append(Prim(kind=kind, params=params, inputs=ins, outputs=(out,), node=p.node, onnx_op=p.onnx_op))
        return out

    def field_sum(x: str, tag: str) -> str:
        t = mk("transpose", {"dims": f"{b}x{f}x{k}", "perm": "021"}, (x,), pre + tag + ":t", (b, k, f))
        rows = mk("view", {}, (t,), pre + tag + ":rows", (b * k, f))
        red = mk("reduce_sum", {"m": b * k, "n": f}, (rows,), pre + tag + ":red", (b * k,))
        return mk("view", {}, (red,), pre + tag, (b, k))

    s = field_sum(e, "sum")
    s2 = mk("ew_chain", {**ew_params((b, k)), "chain": "mul"}, (s, s), pre + "sum2", (b, k))
    sq = mk("ew_chain", {**ew_params((b, f, k)), "chain": "mul"}, (e, e), pre + "sq", (b, f, k))
    q = field_sum(sq, "sumsq")
    mk("ew_chain", {**ew_params((b, k)), "chain": "sub"}, (s2, q), p.output, (b, k))
    return made


def _expand(p: Prim, consts: dict[str, np.ndarray], shapes: dict[str, tuple]) -> list[Prim]:
    d = decompose(p.kind, p.params)
    own = dict(zip(INPUTS[p.kind], p.inputs))
    pre = f"{p.output}:"

    def name(v: str) -> str:
        if v in own:
            return own[v]
        return p.output if v == "Y" else pre + v

    weights: Mapping[str, np.ndarray] = {k: consts[v] for k, v in own.items() if v in consts}
    for k, fn in d.derived.items():
        consts[name(k)] = np.ascontiguousarray(fn(weights), dtype=np.float32)
    made: list[Prim] = []
    seen: set[str] = set()

    def view(v: str) -> None:
        src, shape, off = d.views[v]
        if src in d.views and src not in seen:
            view(src)
        seen.add(v)
        shapes[name(v)] = tuple(shape)
        made.append(Prim(kind="view", params={"offset": off} if off else {}, inputs=(name(src),),
                         outputs=(name(v),), node=p.node, onnx_op=p.onnx_op))

    produced = {k.output for k in d.kernels}
    for k in d.kernels:
        for v in k.inputs:
            if v in d.views and v not in seen:
                view(v)
        shapes[name(k.output)] = tuple(k.shape)
        made.append(Prim(kind=k.op, params=dict(k.params), inputs=tuple(name(v) for v in k.inputs),
                         outputs=(name(k.output),), node=p.node, onnx_op=p.onnx_op))
    for v in d.views:  # the views after the last kernel (Y and its 2-D form)
        if v not in seen and d.views[v][0] in produced | set(d.views):
            view(v)
    return made


__all__ = ["expand"]
