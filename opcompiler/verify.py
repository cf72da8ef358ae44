"""Comparing a kernel's output with the reference, at tolerances stated per dtype."""
from __future__ import annotations

import numpy as np

# (rtol, atol relative to the reference's largest magnitude). fp16: the cube accumulates in
# fp32 and rounds once to fp16 (2^-11 relative), plus the reference's own rounding.
TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (1e-2, 2e-3), "int32": (0.0, 0.0), "int8": (0.0, 0.0)}


def compare(out: np.ndarray, ref: np.ndarray) -> tuple[bool, float]:
    """(all close, max abs error). Shapes must match exactly."""
    if out.shape != ref.shape:
        return False, float("inf")
    rtol, atol = TOLERANCE.get(str(ref.dtype), (1e-4, 1e-5))
    o, r = out.astype(np.float64), ref.astype(np.float64)
    err = np.abs(o - r)
    max_err = float(err.max()) if err.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    ok = bool(np.all(err <= atol * max(scale, 1.0) + rtol * np.abs(r))) and not np.isnan(o).any()
    return ok, max_err
