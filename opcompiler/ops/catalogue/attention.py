"""Scaled dot-product attention: O = softmax(Q K^T * scale + mask) V, one kernel.

Shape keys: `b` (batch), `h` (heads), `sq` (query rows), `skv` (key / value rows), `d` (head size),
`causal` (1: query row i sees key rows 0..i, torch's `is_causal`: the top-left triangle),
`mask` (0: none; 1: one additive (sq, skv) mask for every batch and head; 2: one per batch,
(b, sq, skv)), `scale` (a number, or `auto`: 1/sqrt(d)) and `layout`: `bhsd` (Q is (b, h, sq, d),
K and V (b, h, skv, d), O as Q) or `sbhd` (sequence first: Q and O (sq, b, h, d), K and V (skv, b,
h, d), what a head split without its transpose leaves: the graph folds those transposes in).
The scores and the softmax statistics are fp32 for fp16 inputs (the accumulator's type); P is
rounded to the input type before P V, as the cube consumes it, and the reference does the same.
"""
from __future__ import annotations

import math

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

ATTN_DEFAULTS = {"b": 1, "h": 8, "sq": 512, "skv": 512, "d": 64, "causal": 0, "mask": 0, "scale": "auto",
                 "layout": "bhsd"}
LAYOUTS = ("bhsd", "sbhd")
ATTN_DTYPES = ("float16", "float32")
NEG = -1.0e30  # the masked score: exp(NEG - max) is exactly 0 in fp32


def attention_scale(wl: Workload) -> float:
    """The workload's score scale: its `scale` key, else 1/sqrt(d)."""
    s = wl.p.get("scale")
    return 1.0 / math.sqrt(wl["d"]) if s in (None, "", "auto") else float(s)


def mask_batches(wl: Workload) -> int:
    """Leading extent of the additive mask input: 0 (no mask), 1 (shared) or b (per batch)."""
    return {0: 0, 1: 1, 2: wl["b"]}[int(wl.p.get("mask", 0))]


def _validate(wl: Workload) -> None:
    for key in ("b", "h", "sq", "skv", "d"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    if wl.p.get("causal", 0) not in (0, 1):
        raise OpcError("must be 0 or 1 (1: row i attends to key rows 0..i)", arg="causal", value=wl.p.get("causal"))
    if wl.p.get("mask", 0) not in (0, 1, 2):
        raise OpcError("must be 0 (none), 1 (one (sq, skv) additive mask) or 2 (one per batch)", arg="mask",
                       value=wl.p.get("mask"))
    if wl.p.get("layout", "bhsd") not in LAYOUTS:
        raise OpcError("unknown layout", arg="layout", value=wl.p.get("layout"), expected=" or ".join(LAYOUTS))
    try:
        s = attention_scale(wl)
    except ValueError:
        raise OpcError("is not a number", arg="scale", value=wl.p.get("scale"), expected="e.g. scale=0.125") from None
    if not math.isfinite(s):
        raise OpcError("must be finite", arg="scale", value=wl.p.get("scale"))


def seq_first(wl: Workload) -> bool:
    return wl.p.get("layout", "bhsd") == "sbhd"


def _inputs(wl: Workload) -> list:
    b, h, sq, skv, d = (wl[k] for k in ("b", "h", "sq", "skv", "d"))
    shp = (lambda s: (s, b, h, d)) if seq_first(wl) else (lambda s: (b, h, s, d))
    out = [("q", shp(sq), wl.dtype), ("k", shp(skv), wl.dtype), ("v", shp(skv), wl.dtype)]
    mb = mask_batches(wl)
    if mb:
        out.append(("mask", (mb, sq, skv), wl.dtype))
    return out


def _compute(wl: Workload):
    ins = placeholders(_inputs(wl))
    q, k, v = ins[:3]
    mask = ins[3] if len(ins) > 3 else None
    b, h, sq, skv, d = (wl[key] for key in ("b", "h", "sq", "skv", "d"))
    acc = "float32"
    scale = attention_scale(wl)
    sf = seq_first(wl)
    at = (lambda t, n, c, i, x: t[i, n, c, x]) if sf else (lambda t, n, c, i, x: t[n, c, i, x])
    r = te.reduce_axis((0, d), name="r")
    s = te.compute((b, h, sq, skv), lambda n, c, i, j: te.sum(at(q, n, c, i, r).astype(acc) *
                                                                at(k, n, c, j, r).astype(acc), axis=r),
                   name="scores", tag="attention")

    def scaled(n, c, i, j):
        x = s[n, c, i, j] * te.const(scale, acc)
        if mask is not None:
            x = x + mask[0 if mask.shape[0] == 1 else n, i, j].astype(acc)
        if wl.p.get("causal"):
            x = te.if_then_else(j > i, te.const(NEG, acc), x)
        return x

    x = te.compute((b, h, sq, skv), scaled, name="scaled", tag="elemwise")
    jm = te.reduce_axis((0, skv), name="jm")
    mx = te.compute((b, h, sq), lambda n, c, i: te.max(x[n, c, i, jm], axis=jm), name="row_max")
    e = te.compute((b, h, sq, skv), lambda n, c, i, j: te.exp(x[n, c, i, j] - mx[n, c, i]), name="probs_exp",
                   tag="elemwise")
    js = te.reduce_axis((0, skv), name="js")
    sm = te.compute((b, h, sq), lambda n, c, i: te.sum(e[n, c, i, js], axis=js), name="row_sum")
    p = te.compute((b, h, sq, skv), lambda n, c, i, j: e[n, c, i, j].astype(wl.dtype), name="probs", tag="elemwise")
    jv = te.reduce_axis((0, skv), name="jv")
    o = te.compute((b, h, sq, d), lambda n, c, i, t: te.sum(p[n, c, i, jv].astype(acc) * at(v, n, c, jv, t).astype(acc),
                                                            axis=jv), name="pv")
    if sf:
        out = te.compute((sq, b, h, d), lambda i, n, c, t: (o[n, c, i, t] / sm[n, c, i]).astype(wl.dtype),
                         name="attention_out", tag="elemwise")
    else:
        out = te.compute((b, h, sq, d), lambda n, c, i, t: (o[n, c, i, t] / sm[n, c, i]).astype(wl.dtype),
                         name="attention_out", tag="elemwise")
    return ins, out


def attention_reference(wl: Workload, ins) -> np.ndarray:
    """numpy: fp32 scores and statistics; P rounded to the input type before P V."""
    q, k, v = (a.astype(np.float32) for a in ins[:3])
    if seq_first(wl):
        q, k, v = (a.transpose(1, 2, 0, 3) for a in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) * np.float32(attention_scale(wl))
    if len(ins) > 3:
        s = s + ins[3].astype(np.float32)[:, None]
    if wl.p.get("causal"):
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None], np.float32(NEG), s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e.astype(wl.dtype).astype(np.float32)
    o = np.einsum("bhij,bhjd->bhid", p, v) / e.sum(axis=-1, keepdims=True)
    return (o.transpose(2, 0, 1, 3) if seq_first(wl) else o).astype(wl.dtype)


def _flops(wl: Workload) -> int:
    """4 b h sq skv d for the two products (the causal half counted as computed: the convention
    of FlashAttention's reports is the dense count halved, applied here too) + 5 per score."""
    dense = 4 * wl["b"] * wl["h"] * wl["sq"] * wl["skv"] * wl["d"] + 5 * wl["b"] * wl["h"] * wl["sq"] * wl["skv"]
    return dense // 2 if wl.p.get("causal") else dense


register_op(OpDef(
    name="attention", summary="softmax(Q K^T * scale + mask) V in one kernel (b, h, sq, skv, d, causal, mask)",
    family="attention", defaults=ATTN_DEFAULTS, dtypes=ATTN_DTYPES, compute_fn=_compute,
    reference_fn=attention_reference, input_specs=_inputs, flops_fn=_flops, validate_fn=_validate,
))
