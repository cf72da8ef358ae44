"""NN computes: matmul, conv2d, batch_norm (inference), pool2d.

Cube-style dtypes: float16 inputs accumulate in float32, int8 inputs in int32; the result is
cast to `out_dtype` (float16 for fp16 inputs unless asked otherwise). The reduction stage is
always named `matmul` or `conv2d` so templates can find it.
"""
from __future__ import annotations

from typing import Sequence

from tvm import te, tirx

from ..errors import OpcError
from .elementwise import _check
from .util import check_dtype, shape_to_list

ACC = {"float16": "float32", "float32": "float32", "int8": "int32"}
MM_DTYPES = tuple(ACC)


def _out_dtype(in_dtype: str, out_dtype: str | None) -> str:
    allowed = {"float16": ("float16", "float32"), "float32": ("float32",), "int8": ("int32",)}[in_dtype]
    out = out_dtype or allowed[0]
    check_dtype(out, allowed, arg="out_dtype")
    return out


def _finish(acc: te.Tensor, bias: te.Tensor | None, bias_axis: int, out_dtype: str, name: str) -> te.Tensor:
    res = acc
    if bias is not None:
        if len(bias.shape) != 1 or int(bias.shape[0]) != int(acc.shape[bias_axis]):
            raise OpcError(f"bias must be 1-D of length {int(acc.shape[bias_axis])}", arg="bias.shape",
                           value=shape_to_list(bias.shape))
        res = te.compute(acc.shape, lambda *i: res(*i) + bias[i[bias_axis]].astype(acc.dtype),
                         name=f"{name}_bias", tag="elemwise|bias_add")
    if out_dtype != str(acc.dtype):
        r = res
        res = te.compute(acc.shape, lambda *i: r(*i).astype(out_dtype), name=f"{name}_out", tag="elemwise|cast")
    return res


def matmul(tensor_a: te.Tensor, tensor_b: te.Tensor, trans_a: bool = False, trans_b: bool = False,
           bias: te.Tensor | None = None, out_dtype: str | None = None) -> te.Tensor:
    """C[m, n] = sum_k A[m, k] * B[k, n] (+ bias[n]); A is (K, M) if trans_a, B is (N, K) if trans_b."""
    _check(tensor_a, "tensor_a", MM_DTYPES)
    _check(tensor_b, "tensor_b", MM_DTYPES)
    if str(tensor_a.dtype) != str(tensor_b.dtype):
        raise OpcError(f"operands differ in dtype ({tensor_a.dtype} vs {tensor_b.dtype})", arg="tensor_b.dtype",
                       expected=tensor_a.dtype)
    for n, t in (("tensor_a", tensor_a), ("tensor_b", tensor_b)):
        if len(t.shape) != 2:
            raise OpcError("matmul operands must be 2-D", arg=f"{n}.shape", value=shape_to_list(t.shape),
                           expected="(M, K) and (K, N)")
    a, b = shape_to_list(tensor_a.shape), shape_to_list(tensor_b.shape)
    m, ka = (a[1], a[0]) if trans_a else (a[0], a[1])
    n, kb = (b[0], b[1]) if trans_b else (b[1], b[0])
    if ka != kb:
        raise OpcError(f"reduction sizes differ: A gives K={ka}, B gives K={kb}", arg="tensor_b.shape", value=b,
                       expected=f"K={ka} on B's {'second' if trans_b else 'first'} axis")
    acc = ACC[str(tensor_a.dtype)]
    out = _out_dtype(str(tensor_a.dtype), out_dtype)
    k = te.reduce_axis((0, ka), name="k")
    fa = (lambda i, kk: tensor_a[kk, i]) if trans_a else (lambda i, kk: tensor_a[i, kk])
    fb = (lambda kk, j: tensor_b[j, kk]) if trans_b else (lambda kk, j: tensor_b[kk, j])
    c = te.compute((m, n), lambda i, j: te.sum(fa(i, k).astype(acc) * fb(k, j).astype(acc), axis=k),
                   name="matmul", tag="matmul")
    return _finish(c, bias, 1, out, "matmul")


def _pair(v: int | Sequence[int], arg: str, minimum: int) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(x, int) for x in t):
        raise OpcError("expected an int or a pair of ints", arg=arg, value=v)
    if min(t) < minimum:
        raise OpcError(f"must be >= {minimum}", arg=arg, value=v)
    return t  # type: ignore[return-value]


def _pads(padding: int | Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (h, w) or (top, left, bottom, right)."""
    p = [padding] * 4 if isinstance(padding, int) else list(padding)
    if len(p) == 2:
        p = [p[0], p[1], p[0], p[1]]
    if len(p) != 4 or not all(isinstance(x, int) for x in p):
        raise OpcError("expected an int, (h, w) or (top, left, bottom, right)", arg="padding", value=padding)
    if min(p) < 0:
        raise OpcError("padding must be >= 0", arg="padding", value=padding, expected="0 or more on every side")
    return tuple(p)  # type: ignore[return-value]


def _layout(layout: str) -> str:
    if layout not in ("NCHW", "NHWC"):
        raise OpcError("unsupported layout", arg="layout", value=layout, expected="NCHW or NHWC")
    return layout


def pad_input(data: te.Tensor, pads: tuple[int, int, int, int], layout: str, value: float = 0.0,
              name: str = "pad") -> te.Tensor:
    """Zero- (or value-) padded copy of an NCHW/NHWC tensor; returns `data` when no padding."""
    if not any(pads):
        return data
    top, left, bottom, right = pads
    n, a, b, c = shape_to_list(data.shape)
    hax, wax = (2, 3) if layout == "NCHW" else (1, 2)
    shape = [n, a, b, c]
    shape[hax] += top + bottom
    shape[wax] += left + right
    h, w = shape_to_list(data.shape)[hax], shape_to_list(data.shape)[wax]
    pv = tirx.const(value, data.dtype)

    def f(*i):
        y, x = i[hax] - top, i[wax] - left
        src = list(i)
        src[hax], src[wax] = y, x
        ok = tirx.all(y >= 0, y < h, x >= 0, x < w)
        return tirx.if_then_else(ok, data(*src), pv)

    return te.compute(shape, f, name=name, tag="pad")


def conv2d(data: te.Tensor, weight: te.Tensor, stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1, layout: str = "NCHW",
           bias: te.Tensor | None = None, out_dtype: str | None = None) -> te.Tensor:
    """2-D convolution. NCHW data takes OIHW weights (K, C/groups, R, S); NHWC data takes HWIO
    weights (R, S, C/groups, K), the MiniGo layout of seed 004 Table 1."""
    _layout(layout)
    _check(data, "data", MM_DTYPES)
    _check(weight, "weight", MM_DTYPES)
    if str(data.dtype) != str(weight.dtype):
        raise OpcError(f"data and weight differ in dtype ({data.dtype} vs {weight.dtype})", arg="weight.dtype",
                       expected=data.dtype)
    if len(data.shape) != 4 or len(weight.shape) != 4:
        raise OpcError("conv2d needs 4-D data and weight", arg="data.shape", value=shape_to_list(data.shape),
                       expected=f"{layout} data and {'OIHW' if layout == 'NCHW' else 'HWIO'} weight")
    sh, sw = _pair(stride, "stride", 1)
    dh, dw = _pair(dilation, "dilation", 1)
    pads = _pads(padding)
    if not isinstance(groups, int) or groups < 1:
        raise OpcError("must be a positive int", arg="groups", value=groups)
    if layout == "NCHW":
        n, c, h, w = shape_to_list(data.shape)
        k, cg, r, s = shape_to_list(weight.shape)
    else:
        n, h, w, c = shape_to_list(data.shape)
        r, s, cg, k = shape_to_list(weight.shape)
    if c % groups or k % groups:
        raise OpcError(f"groups must divide input channels C={c} and output channels K={k}", arg="groups",
                       value=groups, expected=f"a common divisor of {c} and {k}")
    if cg != c // groups:
        raise OpcError(f"weight has {cg} input channels per group but data gives C/groups = {c // groups}",
                       arg="weight.shape", value=shape_to_list(weight.shape))
    ho = (h + pads[0] + pads[2] - dh * (r - 1) - 1) // sh + 1
    wo = (w + pads[1] + pads[3] - dw * (s - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise OpcError(f"output would be {ho}x{wo}: the (dilated) kernel {r}x{s} is larger than the padded input",
                       arg="padding", value=padding, expected="more padding or a smaller kernel")
    acc = ACC[str(data.dtype)]
    out = _out_dtype(str(data.dtype), out_dtype)
    p = pad_input(data, pads, layout)
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, s), name="rx")
    kg = k // groups
    if layout == "NCHW":
        def f(b, kk, y, x):
            ci = (kk // kg) * cg + rc if groups > 1 else rc
            return te.sum(p[b, ci, y * sh + ry * dh, x * sw + rx * dw].astype(acc)
                          * weight[kk, rc, ry, rx].astype(acc), axis=[rc, ry, rx])
        shape, cax = (n, k, ho, wo), 1
    else:
        def f(b, y, x, kk):
            ci = (kk // kg) * cg + rc if groups > 1 else rc
            return te.sum(p[b, y * sh + ry * dh, x * sw + rx * dw, ci].astype(acc)
                          * weight[ry, rx, rc, kk].astype(acc), axis=[ry, rx, rc])
        shape, cax = (n, ho, wo, k), 3
    conv = te.compute(shape, f, name="conv2d", tag="conv2d",
                      attrs={"stride": [sh, sw], "dilation": [dh, dw], "padding": list(pads), "groups": groups,
                             "layout": layout})
    return _finish(conv, bias, cax, out, "conv2d")


def batch_norm(data: te.Tensor, scale: te.Tensor, shift: te.Tensor, layout: str = "NCHW") -> te.Tensor:
    """Inference batch norm: y = x * scale[c] + shift[c] (scale and shift folded from gamma, beta,
    mean, var and eps; see `opcompiler.ops.fold_bn`). Computes in the data's dtype."""
    _layout(layout)
    _check(data, "data", ("float16", "float32"))
    if len(data.shape) != 4:
        raise OpcError("batch_norm needs 4-D data", arg="data.shape", value=shape_to_list(data.shape),
                       expected=f"{layout}")
    cax = 1 if layout == "NCHW" else 3
    c = int(data.shape[cax])
    for n, t in (("scale", scale), ("shift", shift)):
        _check(t, n, ("float16", "float32"))
        if shape_to_list(t.shape) != [c]:
            raise OpcError(f"must be 1-D of length C={c}", arg=f"{n}.shape", value=shape_to_list(t.shape))
    return te.compute(data.shape, lambda *i: data(*i) * scale[i[cax]].astype(data.dtype)
                      + shift[i[cax]].astype(data.dtype), name="batch_norm", tag="elemwise|batch_norm")


def pool2d(data: te.Tensor, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
           padding: int | Sequence[int] = 0, mode: str = "max", layout: str = "NCHW") -> te.Tensor:
    """Max or average pooling; average excludes padding from the count (ONNX's default)."""
    _layout(layout)
    _check(data, "data", ("float16", "float32"))
    if mode not in ("max", "avg"):
        raise OpcError("unsupported pool mode", arg="mode", value=mode, expected="max or avg")
    kh, kw = _pair(kernel, "kernel", 1)
    sh, sw = _pair(stride if stride is not None else (kh, kw), "stride", 1)
    pads = _pads(padding)
    if layout == "NCHW":
        n, c, h, w = shape_to_list(data.shape)
    else:
        n, h, w, c = shape_to_list(data.shape)
    ho = (h + pads[0] + pads[2] - kh) // sh + 1
    wo = (w + pads[1] + pads[3] - kw) // sw + 1
    if ho < 1 or wo < 1:
        raise OpcError(f"pooling window {kh}x{kw} is larger than the padded input {h}x{w}", arg="kernel",
                       value=kernel)
    neg = tirx.min_value(data.dtype)
    p = pad_input(data, pads, layout, value=float(neg.value) if mode == "max" else 0.0, name="pool_pad")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    red = te.max if mode == "max" else te.sum

    def at(b, ch, y, x):
        return p[b, ch, y, x] if layout == "NCHW" else p[b, y, x, ch]

    if layout == "NCHW":
        shape = (n, c, ho, wo)
        pool = te.compute(shape, lambda b, ch, y, x: red(at(b, ch, y * sh + ry, x * sw + rx), axis=[ry, rx]),
                          name="pool2d", tag=f"pool|{mode}")
    else:
        shape = (n, ho, wo, c)
        pool = te.compute(shape, lambda b, y, x, ch: red(at(b, ch, y * sh + ry, x * sw + rx), axis=[ry, rx]),
                          name="pool2d", tag=f"pool|{mode}")
    if mode == "max":
        return pool
    top, left = pads[0], pads[1]
    hax, wax = (2, 3) if layout == "NCHW" else (1, 2)

    def avg(*i):
        y0, x0 = i[hax] * sh - top, i[wax] * sw - left
        cy = tirx.min(y0 + kh, h) - tirx.max(y0, 0)
        cx = tirx.min(x0 + kw, w) - tirx.max(x0, 0)
        return pool(*i) / (cy * cx).astype(data.dtype)

    return te.compute(shape, avg, name="pool2d_avg", tag="elemwise|pool_avg")
