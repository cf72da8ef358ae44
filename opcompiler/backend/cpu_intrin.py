"""The cpu family's intrinsics: the host as LLVM sees it, its TVM target and SIMD width.

The one module of the backend that the cpu templates (`schedules/cpu`, which size their vectors
by it) import, as `backend/ascend/intrin.py` and `backend/dsp/intrin.py` are for theirs; the CPU
backend builds for the same target.
"""
from __future__ import annotations

import os
from functools import cache
from typing import Any

import numpy as np
import tvm


@cache
def llvm_target() -> tvm.target.Target:
    """The host as LLVM sees it (mcpu asked of LLVM, never hard-coded), all cores."""
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    spec: dict[str, Any] = {"kind": "llvm", "num-cores": os.cpu_count() or 1}
    if cpu and cpu != "generic":
        spec["mcpu"] = cpu
    return tvm.target.Target(spec)


def vector_lanes(dtype: str = "float32") -> int:
    """SIMD lanes for `dtype` on the host, from LLVM's vector width for the detected CPU."""
    try:
        bits = int(tvm.target.codegen.llvm_get_vector_width(llvm_target()))
    except Exception:  # an LLVM without the query: assume SSE
        bits = 128
    return max(bits // (np.dtype(dtype).itemsize * 8), 1)
