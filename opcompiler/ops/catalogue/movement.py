"""Data movement: concat, pad, transpose, slice (no arithmetic: FLOPs 0); their geometry."""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import EW_DTYPES, ew_shape, placeholders, validate_ew

CONCAT_DEFAULTS = {"n": 1, "c": 32, "c1": 32, "h": 28, "w": 28, "layout": "NCHW"}


def _concat_inputs(wl: Workload) -> list:
    p = wl.p
    return [("x", (p["n"], p["c"], p["h"], p["w"]), wl.dtype), ("x1", (p["n"], p["c1"], p["h"], p["w"]), wl.dtype)]


def _concat_compute(wl: Workload):
    from tvm import tirx  # max(c - c0, 0): the untaken branch never indexes out of bounds
    ins = placeholders(_concat_inputs(wl))
    a, b = ins
    c0 = wl["c"]
    out = te.compute((wl["n"], c0 + wl["c1"], wl["h"], wl["w"]),
                     lambda n, c, y, x: te.if_then_else(c < c0, a[n, c, y, x], b[n, tirx.max(c - c0, 0), y, x]),
                     name="concat", tag="elemwise|concat")
    return ins, out


def _validate_concat(wl: Workload) -> None:
    validate_ew(wl)
    if wl["c1"] < 1:
        raise OpcError("must be >= 1", arg="c1", value=wl["c1"])


register_op(OpDef(
    name="concat", summary="concatenate two NCHW tensors along channels (c then c1)", family="elemwise",
    defaults=CONCAT_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_concat_compute,
    reference_fn=lambda wl, ins: np.concatenate(ins, axis=1), input_specs=_concat_inputs,
    flops_fn=lambda wl: 0,
    validate_fn=_validate_concat,
))

PAD_DEFAULTS = {"n": 1, "c": 64, "h": 56, "w": 56, "pt": 0, "pl": 0, "pb": 1, "pr": 1, "fill": "zero",
                "layout": "NCHW"}
PAD_FILLS = ("zero", "lowest")  # lowest: the dtype's most negative finite value (max pooling's identity)


def _pad_value(wl: Workload) -> float:
    return 0.0 if wl["fill"] == "zero" else float(np.finfo(wl.dtype).min)


def _validate_pad(wl: Workload) -> None:
    validate_ew(wl)
    for key in ("pt", "pl", "pb", "pr"):
        if wl[key] < 0:
            raise OpcError("must be >= 0", arg=key, value=wl[key])
    if wl["fill"] not in PAD_FILLS:
        raise OpcError("unknown fill", arg="fill", value=wl["fill"], expected=" or ".join(PAD_FILLS))


def _pad_compute(wl: Workload):
    ins = placeholders([("x", ew_shape(wl), wl.dtype)])
    from ...dsl.nn import pad_input
    out = pad_input(ins[0], (wl["pt"], wl["pl"], wl["pb"], wl["pr"]), wl.layout, _pad_value(wl), name="pad_out")
    if out is ins[0]:  # no padding at all: still a kernel (a copy)
        out = te.compute(out.shape, lambda *i: ins[0](*i), name="pad_out", tag="elemwise")
    return ins, out


def _pad_ref(wl: Workload, ins) -> np.ndarray:
    hw = ((wl["pt"], wl["pb"]), (wl["pl"], wl["pr"]))
    widths = ((0, 0), (0, 0), *hw) if wl.layout == "NCHW" else ((0, 0), *hw, (0, 0))
    return np.pad(ins[0], widths, constant_values=np.asarray(_pad_value(wl), wl.dtype))


register_op(OpDef(
    name="pad", summary="explicit spatial padding (pt, pl, pb, pr; fill zero|lowest)",
    family="elemwise", defaults=PAD_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_pad_compute, reference_fn=_pad_ref,
    input_specs=lambda wl: [("x", ew_shape(wl), wl.dtype)], flops_fn=lambda wl: 0, validate_fn=_validate_pad,
))

TRANSPOSE_DEFAULTS = {"dims": "1x2x4x8x8", "perm": "02134"}  # a channel shuffle of 2 groups of 4


def transpose_dims(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, permutation) of a transpose workload: dims=AxBxC..., perm=digits (rank <= 8)."""
    try:
        dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
        perm = tuple(int(c) for c in str(wl["perm"]).zfill(len(dims)))  # "0213" may arrive as the int 213
    except ValueError:
        raise OpcError("dims must read like 2x3x4 and perm like 021", arg="dims", value=f"{wl['dims']}/{wl['perm']}",
                       expected="dims=AxBxC (up to 8 axes), perm=a digit per axis") from None
    return dims, perm


def _validate_transpose(wl: Workload) -> None:
    dims, perm = transpose_dims(wl)
    if not 1 <= len(dims) <= 8 or any(d < 1 for d in dims):
        raise OpcError("1 to 8 positive dimensions", arg="dims", value=wl["dims"], expected="e.g. 1x2x4x8x8")
    if sorted(perm) != list(range(len(dims))):
        raise OpcError(f"not a permutation of the {len(dims)} axes", arg="perm", value=wl["perm"],
                       expected="".join(map(str, range(len(dims)))) + " reordered")


def _transpose_compute(wl: Workload):
    dims, perm = transpose_dims(wl)
    ins = placeholders([("x", dims, wl.dtype)])
    inv = [perm.index(k) for k in range(len(dims))]
    out = te.compute([dims[p] for p in perm], lambda *i: ins[0](*[i[j] for j in inv]), name="transpose",
                     tag="elemwise|transpose")
    return ins, out


register_op(OpDef(
    name="transpose", summary="permute the axes of a tensor (dims=AxBxC..., perm=digits): a data movement",
    family="elemwise", defaults=TRANSPOSE_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_transpose_compute,
    reference_fn=lambda wl, ins: np.ascontiguousarray(np.transpose(ins[0], transpose_dims(wl)[1])),
    input_specs=lambda wl: [("x", transpose_dims(wl)[0], wl.dtype)], flops_fn=lambda wl: 0,
    validate_fn=_validate_transpose,
))

SLICE_DEFAULTS = {"dims": "1x8x4x4", "axis": 1, "start": 0, "end": 4}  # ShuffleNet's channel split


def slice_geometry(wl: Workload) -> tuple[tuple[int, ...], int, int, int]:
    """(input dims, outer blocks, run start, run length) of a slice along one axis, step 1: each of
    the `outer` blocks copies `run` contiguous elements starting at `start` (in elements)."""
    dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    a = wl["axis"]
    inner = int(np.prod(dims[a + 1:], dtype=np.int64))
    return dims, int(np.prod(dims[:a], dtype=np.int64)), wl["start"] * inner, (wl["end"] - wl["start"]) * inner


def _validate_slice(wl: Workload) -> None:
    try:
        dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    except ValueError:
        raise OpcError("dims must read like 1x8x4x4", arg="dims", value=wl["dims"]) from None
    if not 0 <= wl["axis"] < len(dims):
        raise OpcError(f"no axis {wl['axis']} in a {len(dims)}-D tensor", arg="axis", value=wl["axis"])
    if not 0 <= wl["start"] < wl["end"] <= dims[wl["axis"]]:
        raise OpcError(f"need 0 <= start < end <= {dims[wl['axis']]}", arg="start", value=(wl["start"], wl["end"]))


def _slice_compute(wl: Workload):
    dims = tuple(int(d) for d in str(wl["dims"]).split("x"))
    a, st = wl["axis"], wl["start"]
    ins = placeholders([("x", dims, wl.dtype)])
    shape = list(dims)
    shape[a] = wl["end"] - st
    out = te.compute(shape, lambda *i: ins[0](*[i[j] + st if j == a else i[j] for j in range(len(dims))]),
                     name="slice", tag="elemwise|slice")
    return ins, out


def _slice_ref(wl: Workload, ins) -> np.ndarray:
    idx = [slice(None)] * ins[0].ndim
    idx[wl["axis"]] = slice(wl["start"], wl["end"])
    return np.ascontiguousarray(ins[0][tuple(idx)])


register_op(OpDef(
    name="slice", summary="a contiguous range along one axis (dims=AxBxC..., axis, start, end): a data movement",
    family="elemwise", defaults=SLICE_DEFAULTS, dtypes=EW_DTYPES, compute_fn=_slice_compute, reference_fn=_slice_ref,
    input_specs=lambda wl: [("x", tuple(int(d) for d in str(wl["dims"]).split("x")), wl.dtype)],
    flops_fn=lambda wl: 0, validate_fn=_validate_slice,
))
