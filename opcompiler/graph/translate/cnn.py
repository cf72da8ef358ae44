"""Convolutional-network ops: Conv (explicit padding where asymmetric), BatchNormalization (folded
into (scale, shift), a Conv's bias folded in), MaxPool / AveragePool / GlobalAveragePool, LRN, and
the ReduceMean / ReduceSum / ReduceMax row reductions."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ops import fold_bn
from ..importer import Node
from .common import Ctx, Unsupported, ew_params, need_const, runtime
from .recsys import fold_bag


def conv(ctx: Ctx, node: Node) -> None:
    x = runtime(ctx, node, node.inputs[0], "input")
    w = need_const(ctx, node, node.inputs[1], "weight")
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
        b = need_const(ctx, node, node.inputs[2], "bias")
        mid = ctx.emit("conv2d", params, (x, wname), f"{out}:conv", node, ctx.shapes[out])
        ctx.emit("bias_add", ew_params(ctx.shapes[out]), (mid, ctx.const(node.inputs[2], b)), out, node)
    else:
        ctx.emit("conv2d", params, (x, wname), out, node)


def _explicit_pad(ctx: Ctx, node: Node, x: str, xs: tuple[int, ...], pads: list[int], fill: str
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


def batch_norm(ctx: Ctx, node: Node) -> None:
    if node.attrs.get("training_mode", 0):
        raise Unsupported(node, "training-mode batch norm is not supported (inference only)")
    x = runtime(ctx, node, node.inputs[0], "input")
    g, b, m, v = (need_const(ctx, node, node.inputs[i], n) for i, n in
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


def pool(mode: str) -> Callable[[Ctx, Node], None]:
    def fn(ctx: Ctx, node: Node) -> None:
        x = runtime(ctx, node, node.inputs[0], "input")
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


def global_avg(ctx: Ctx, node: Node) -> None:
    x = runtime(ctx, node, node.inputs[0], "input")
    xs = ctx.shape(x)
    if len(xs) != 4 or xs[2] != xs[3]:
        raise Unsupported(node, f"GlobalAveragePool needs a square 4-D input, got {list(xs)}")
    ctx.emit("pool2d", {"n": xs[0], "c": xs[1], "h": xs[2], "w": xs[3], "kernel": xs[2], "stride": 1, "pad": 0,
                        "mode": "avg", "layout": "NCHW"}, (x,), node.outputs[0], node)


def lrn(ctx: Ctx, node: Node) -> None:
    """LRN as the hardware would run it: x*x (vector), the sum over the channel window as a 1x1
    convolution with a banded weight scaled by alpha/size (cube), (bias + s)**-beta (vector),
    times x (vector)."""
    x = runtime(ctx, node, node.inputs[0], "input")
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


def reduce(kind: str) -> Callable[[Ctx, Node], None]:
    """ReduceMean / ReduceSum / ReduceMax over trailing axes (ShuffleNet's x.mean([2, 3])): the
    tensor viewed as (outer, inner) rows, one row reduction, a 1/inner scale for the mean. A block
    of axes with others after it (a sum over the middle axis) is transposed to the end first."""
    def fn(ctx: Ctx, node: Node) -> None:
        x = runtime(ctx, node, node.inputs[0], "input")
        xs = ctx.shape(x)
        if len(node.inputs) > 1 and node.inputs[1]:
            axes = [int(v) for v in need_const(ctx, node, node.inputs[1], "axes").astype(np.int64).reshape(-1)]
        else:
            axes = list(node.attrs.get("axes", range(len(xs))))
        axes = sorted({a % len(xs) for a in axes})
        out = node.outputs[0]
        if kind in ("sum", "mean") and fold_bag(ctx, node, x, axes, kind):
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
