"""Embedding lookup: `gather` (rows of a table picked by runtime integer indices; nn.Embedding,
ONNX Gather on axis 0 with a constant table). No arithmetic: FLOPs 0, the bytes are the cost.

    table    (rows, cols)  in the op dtype (the vocabulary x the row length)
    indices  (n,)          int32 or int64 (`idx`), each in [0, rows)
    out      (n, cols)     out[i] = table[indices[i]]

An index outside the table is an error on the simulators (a one-line OpcFailure naming the index
and the table size: a kernel never reads outside the table); the cpu kernel does not check."""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError, OpcFailure
from ...workload import Workload
from ..registry import OpDef, register_op
from .common import placeholders

GATHER_DEFAULTS = {"rows": 1000, "cols": 64, "n": 128, "idx": "int64"}
GATHER_DTYPES = ("float32", "float16")
INDEX_DTYPES = ("int32", "int64")


def _inputs(wl: Workload) -> list:
    return [("table", (wl["rows"], wl["cols"]), wl.dtype), ("indices", (wl["n"],), str(wl["idx"]))]


def _validate(wl: Workload) -> None:
    for key in ("rows", "cols", "n"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    if str(wl["idx"]) not in INDEX_DTYPES:
        raise OpcError("unknown index dtype", arg="idx", value=wl["idx"], expected=" or ".join(INDEX_DTYPES))


def _compute(wl: Workload):
    table, idx = placeholders(_inputs(wl))
    out = te.compute((wl["n"], wl["cols"]), lambda i, j: table[idx[i], j], name="gather", tag="gather")
    return [table, idx], out


def check_index(value: int, rows: int, where: str = "gather") -> int:
    """The row an index names; an index outside [0, rows) is a one-line OpcFailure."""
    v = int(value)
    if not 0 <= v < rows:
        raise OpcFailure(f"{where}: index {v} is out of range for a table of {rows} rows (valid: 0..{rows - 1})")
    return v


def _reference(wl: Workload, ins) -> np.ndarray:
    table, idx = ins
    idx = np.asarray(idx).reshape(-1)
    bad = idx[(idx < 0) | (idx >= wl["rows"])]
    if bad.size:
        check_index(bad[0], wl["rows"])
    return np.ascontiguousarray(np.asarray(table)[idx.astype(np.int64)])


def make_indices(wl: Workload, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, wl["rows"], size=(wl["n"],)).astype(str(wl["idx"]))


class _GatherDef(OpDef):
    def make_inputs(self, wl: Workload, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        table = rng.standard_normal(size=(wl["rows"], wl["cols"])).astype(wl.dtype)
        return [table, make_indices(wl, seed + 1)]


register_op(_GatherDef(
    name="gather", summary="embedding lookup: rows of a table (rows, cols) by runtime int indices (n,)",
    family="gather", defaults=GATHER_DEFAULTS, dtypes=GATHER_DTYPES, compute_fn=_compute, reference_fn=_reference,
    input_specs=_inputs, flops_fn=lambda wl: 0, validate_fn=_validate,
))
