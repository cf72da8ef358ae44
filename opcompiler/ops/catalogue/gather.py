"""Embedding lookup: `gather` (rows of a table picked by runtime integer indices; nn.Embedding,
ONNX Gather on axis 0 with a constant table). No arithmetic but a bag sum's adds: the bytes are the cost.

    table    (rows, cols)  in the op dtype (the vocabulary x the row length)
    indices  (n,)          int32 or int64 (`idx`), each in [0, rows)
    offsets  (fields,)     only with `fields` > 0: per-field row offsets, in the `idx` dtype
    out      (n, cols)     out[i] = table[indices[i]]                          (fields = 0)
                           out[i] = table[indices[i] + offsets[i % fields]]    (fields > 0)
             (n / bag, cols)  with `bag` > 1: each output row the sum of `bag` consecutive looked-up rows
                           (nn.EmbeddingBag's sum mode; `emb(ids).sum(1)` of ids (batch, bag)),
                           summed in the op dtype, in order

`fields` > 0 is the folded id offset of a recommender (DeepFM's `ids + offsets` into one table
shared by F sparse fields: ids (batch, F), offsets (F,), so flat index i is field i % F): the
kernels add the offset to the index they read before fetching the row. The row read must lie in
the table: indices[i] + offsets[i % fields] in [0, rows).

An index outside the table is an error on the simulators (a one-line OpcFailure naming the index
and the table size: a kernel never reads outside the table); the cpu kernel does not check."""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError, OpcFailure
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

GATHER_DEFAULTS = {"rows": 1000, "cols": 64, "n": 128, "idx": "int64", "fields": 0, "bag": 1}
GATHER_DTYPES = ("float32", "float16")
INDEX_DTYPES = ("int32", "int64")


def _inputs(wl: Workload) -> list:
    ins = [("table", (wl["rows"], wl["cols"]), wl.dtype), ("indices", (wl["n"],), str(wl["idx"]))]
    if fields(wl):
        ins.append(("offsets", (fields(wl),), str(wl["idx"])))
    return ins


def fields(wl: Workload) -> int:
    """The offsets input's length (0: no offsets input)."""
    return int(wl.p.get("fields", 0) or 0)


def bag(wl: Workload) -> int:
    """Looked-up rows summed into one output row (1: a plain lookup)."""
    return int(wl.p.get("bag", 1) or 1)


def _validate(wl: Workload) -> None:
    for key in ("rows", "cols", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    if bag(wl) < 1 or wl["n"] % bag(wl):
        raise OpcError(f"must be >= 1 and divide n={wl['n']} (each output row sums `bag` looked-up rows)",
                       arg="bag", value=wl.p.get("bag"))
    if fields(wl) < 0:
        raise OpcError("must be >= 0 (0: no offsets input)", arg="fields", value=wl["fields"])
    if str(wl["idx"]) not in INDEX_DTYPES:
        raise OpcError("unknown index dtype", arg="idx", value=wl["idx"], expected=" or ".join(INDEX_DTYPES))


def _compute(wl: Workload):
    ph = placeholders(_inputs(wl))
    table, idx = ph[0], ph[1]
    if len(ph) == 3:
        off, f = ph[2], fields(wl)
        out = te.compute((wl["n"], wl["cols"]), lambda i, j: table[idx[i] + off[i % f], j], name="gather",
                         tag="gather")
    else:
        out = te.compute((wl["n"], wl["cols"]), lambda i, j: table[idx[i], j], name="gather", tag="gather")
    if bag(wl) > 1:  # the bag sum: a second stage over the looked-up rows, in order
        b, rows = bag(wl), out
        k = te.reduce_axis((0, b), name="k")
        out = te.compute((wl["n"] // b, wl["cols"]), lambda i, j: te.sum(rows[i * b + k, j], axis=k),
                         name="bag_sum", tag="bag_sum")
    return ph, out


def check_index(value: int, rows: int, where: str = "gather") -> int:
    """The row an index names; an index outside [0, rows) is a one-line OpcFailure."""
    v = int(value)
    if not 0 <= v < rows:
        raise OpcFailure(f"{where}: index {v} is out of range for a table of {rows} rows (valid: 0..{rows - 1})")
    return v


def rows_read(wl: Workload, idx, offsets=None) -> np.ndarray:
    """The table row each output row reads: indices[i] (+ offsets[i % fields])."""
    idx = np.asarray(idx).reshape(-1).astype(np.int64)
    if fields(wl):
        off = np.asarray(offsets).reshape(-1).astype(np.int64)
        idx = idx + off[np.arange(idx.size) % fields(wl)]
    return idx


def _reference(wl: Workload, ins) -> np.ndarray:
    table = ins[0]
    idx = rows_read(wl, ins[1], ins[2] if fields(wl) else None)
    bad = idx[(idx < 0) | (idx >= wl["rows"])]
    if bad.size:
        check_index(bad[0], wl["rows"])
    rows = np.asarray(table)[idx.astype(np.int64)]
    if bag(wl) > 1:  # summed in float64, rounded once to the op dtype
        rows = rows.reshape(-1, bag(wl), wl["cols"]).astype(np.float64).sum(axis=1).astype(wl.dtype)
    return np.ascontiguousarray(rows)


def make_offsets(wl: Workload) -> np.ndarray:
    """Per-field offsets for a run of the op alone: the table split into `fields` equal vocabularies
    (field f's rows start at f * (rows // fields))."""
    return (np.arange(fields(wl), dtype=np.int64) * (wl["rows"] // fields(wl))).astype(str(wl["idx"]))


def make_indices(wl: Workload, seed: int = 0) -> np.ndarray:
    """Indices in [0, rows), or with offsets each in its field's vocabulary [0, rows // fields)."""
    hi = wl["rows"] // fields(wl) if fields(wl) else wl["rows"]
    return np.random.default_rng(seed).integers(0, max(hi, 1), size=(wl["n"],)).astype(str(wl["idx"]))


class _GatherDef(OpDef):
    def make_inputs(self, wl: Workload, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        table = rng.standard_normal(size=(wl["rows"], wl["cols"])).astype(wl.dtype)
        return [table, make_indices(wl, seed + 1)] + ([make_offsets(wl)] if fields(wl) else [])


register_op(_GatherDef(
    name="gather", summary="embedding lookup: rows of a table (rows, cols) by runtime int indices (n,) (+ per-field "
                           "offsets; summed in bags of `bag` rows: EmbeddingBag)",
    family="gather", defaults=GATHER_DEFAULTS, dtypes=GATHER_DTYPES, compute_fn=_compute, reference_fn=_reference,
    input_specs=_inputs, flops_fn=lambda wl: (wl["n"] - wl["n"] // bag(wl)) * wl["cols"], validate_fn=_validate,
))
