"""Layer normalisation over the last axis of a (rows, cols) tensor: layer_norm and add_layer_norm
(onnxruntime's SkipLayerNormalization, y = LN(x + r): the residual add in the same kernel).

    y = (s - mean) / sqrt(var + eps) * gamma + beta,   s = x (+ r), per row of `cols` elements

`rows` is the product of the leading dims (batch x sequence), `cols` the normalised axis. The
statistics are two passes in fp32 whatever the dtype (the mean, then the sum of squared
deviations: no E[x^2] - mean^2, which loses a row whose mean is large against its spread):
fp16 inputs are cast to fp32 first and the result cast back. `eps` is a shape key written as
text (`eps=1e-6`): shape values are ints or strings, and the text is what the record key holds.
"""
from __future__ import annotations

import math

import numpy as np

from ... import dsl
from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, Step, register_op
from .common import EW_DTYPES, placeholders

NORM_DEFAULTS = {"rows": 128, "cols": 768, "eps": "1e-5"}  # BERT-base: 128 tokens x 768


def norm_eps(wl: Workload) -> float:
    """The workload's epsilon as a number (a shape key given as text or as a float)."""
    return float(wl.p.get("eps", NORM_DEFAULTS["eps"]))


def _validate(wl: Workload) -> None:
    for key in ("rows", "cols"):
        if not isinstance(wl[key], int) or wl[key] < 1:
            raise OpcError("must be an integer >= 1", arg=key, value=wl[key])
    try:
        eps = float(wl["eps"])
    except (TypeError, ValueError):
        eps = -1.0
    if not (math.isfinite(eps) and eps > 0):
        raise OpcError("must be a positive number", arg="eps", value=wl["eps"], expected="e.g. 1e-5 or 1e-12")


def _inputs(residual: bool):
    def specs(wl: Workload) -> list:
        rc = (wl["rows"], wl["cols"])
        return [("x", rc, wl.dtype)] + ([("r", rc, wl.dtype)] if residual else []) + \
            [("gamma", (wl["cols"],), wl.dtype), ("beta", (wl["cols"],), wl.dtype)]
    return specs


def _compute(residual: bool):
    def comp(wl: Workload):
        ins = placeholders(_inputs(residual)(wl))
        wide = (lambda t: dsl.cast_to(t, "float32")) if wl.dtype == "float16" else (lambda t: t)
        s = dsl.vadd(wide(ins[0]), wide(ins[1])) if residual else wide(ins[0])
        gamma, beta = (wide(t) for t in ins[-2:])
        inv_n = 1.0 / wl["cols"]
        mean = dsl.vmuls(dsl.sum(s, axis=1, keepdims=True), inv_n)
        d = dsl.vsub(s, mean)
        var = dsl.vmuls(dsl.sum(dsl.vmul(d, d), axis=1, keepdims=True), inv_n)
        rstd = dsl.vrec(dsl.vsqrt(dsl.vadds(var, norm_eps(wl))))
        y = dsl.vadd(dsl.vmul(dsl.vmul(d, rstd), gamma), beta)
        return ins, dsl.cast_to(y, wl.dtype)
    return comp


def _reference(residual: bool):
    def ref(wl: Workload, ins) -> np.ndarray:
        f = [a.astype(np.float32) for a in ins]
        s = f[0] + f[1] if residual else f[0]
        inv_n = np.float32(1.0 / wl["cols"])
        d = s - s.sum(axis=1, keepdims=True, dtype=np.float32) * inv_n
        var = (d * d).sum(axis=1, keepdims=True, dtype=np.float32) * inv_n
        y = d * (np.float32(1.0) / np.sqrt(var + np.float32(norm_eps(wl)))) * f[-2] + f[-1]
        return y.astype(wl.dtype)
    return ref


def _flops(residual: bool):
    # sum, subtract, square, sum, normalise, scale, shift (+ the add): ~8 per element, and the
    # per-row mean, variance, eps, sqrt and reciprocal
    return lambda wl: (8 + int(residual)) * wl["rows"] * wl["cols"] + 5 * wl["rows"]


def _unfused_add_ln(wl: Workload) -> list[Step]:
    """The residual add as its own kernel (x and r viewed as one (1, 1, rows, cols) image), then
    layer_norm of its output."""
    rows, cols = wl["rows"], wl["cols"]
    return [Step(op="add", params={"n": 1, "c": 1, "h": rows, "w": cols, "layout": "NCHW"}, inputs=("in0", "in1")),
            Step(op="layer_norm", params={"rows": rows, "cols": cols, "eps": wl["eps"]}, inputs=("s0", "in2", "in3"))]


for _name, _res, _summary in (
        ("layer_norm", False, "layer normalisation over the last axis of a (rows, cols) tensor, statistics in fp32"),
        ("add_layer_norm", True, "residual add then layer normalisation, y = LN(x + r), one kernel "
                                 "(onnxruntime SkipLayerNormalization)")):
    register_op(OpDef(
        name=_name, summary=_summary, family="norm", defaults=NORM_DEFAULTS, dtypes=EW_DTYPES,
        compute_fn=_compute(_res), reference_fn=_reference(_res), input_specs=_inputs(_res),
        flops_fn=_flops(_res), validate_fn=_validate, unfused_fn=_unfused_add_ln if _res else None,
        fusion="add_layer_norm" if _res else "",
    ))


def norm_blocks(sch) -> dict:
    """The blocks of the compute's prim func (an `s_tir.Schedule` of it, unscheduled) by role,
    read off its data flow: block names differ with the dtype and the residual (the DSL names
    every stage after its op), and a row of one element has no broadcasts. Schedules of every
    target place the stages by these roles.

        sums      the two row reductions (of s, of the squared deviations)
        sq, d     the squares the second reads, and d = s - mean they square
        stats_a   (rows, 1) blocks from the first reduction only: the mean
        stats_b   (rows, 1) blocks from the second: var, + eps, sqrt, 1 / x (rstd)
        params    1-D blocks: the fp32 casts of gamma and beta
        pbcast    broadcasts of 1-D buffers (gamma, beta over the rows)
        pre       the input casts and the residual add (before the first reduction)
        rows_b    the other row blocks before the second reduction (the mean's broadcast)
        rows_c    the row blocks after it (rstd's broadcast, d * rstd, * gamma, + beta = y, last)
        out       the output cast (fp16), or None; last: the block writing the output"""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    names = [sch.get(b).name_hint for b in blocks]
    writes = {hash(sch.get(b).writes[0].source): nm for b, nm in zip(blocks, names)}  # (buffer names repeat)
    reads = {nm: [hash(r.source) for r in sch.get(b).reads] for b, nm in zip(blocks, names)}
    vectors = {hash(r.source) for b in blocks for r in sch.get(b).reads if len(r.source.shape) == 1}
    shape = {nm: tuple(int(s) for s in sch.get(b).writes[0].source.shape) for b, nm in zip(blocks, names)}
    sums = [nm for b, nm in zip(blocks, names) if any(int(iv.iter_type) == 2 for iv in sch.get(b).iter_vars)]
    if len(sums) != 2:
        raise OpcError(f"layer norm compute: two row reductions expected, found {sums}")
    stats: set[str] = set(sums)
    for nm in names:
        if nm not in stats and shape[nm][-1] == 1 and all(writes.get(r) in stats for r in reads[nm]):
            stats.add(nm)
    params = [nm for nm in names if len(shape[nm]) == 1]
    pbcast = [nm for nm in names if nm not in stats and len(shape[nm]) == 2 and len(reads[nm]) == 1
              and reads[nm][0] in vectors]
    sq = writes[reads[sums[1]][0]]
    d = writes[reads[sq][0]]
    i0, i1 = names.index(sums[0]), names.index(sums[1])
    skip = stats | set(params) | set(pbcast) | {d, sq}
    last = names[-1]
    out = last if str(sch.get(blocks[-1]).writes[0].source.dtype) != "float32" else None
    return {"pre": [nm for nm in names[:i0] if nm not in skip], "sums": sums, "sq": sq, "d": d,
            "stats_a": [nm for nm in names[i0 + 1:i1] if nm in stats],
            "stats_b": [nm for nm in names[i1 + 1:] if nm in stats], "params": params, "pbcast": pbcast,
            "rows_b": [nm for nm in names[i0 + 1:i1] if nm not in skip],
            "rows_c": [nm for nm in names[i1 + 1:] if nm not in skip and nm != out], "out": out, "last": last}
