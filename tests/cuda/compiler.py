"""Whether this machine can compile CUDA (NVRTC or nvcc): the compile-side tests skip with the reason when not."""
from __future__ import annotations

import pytest


def compiler_missing() -> str | None:
    """Why no CUDA compiler is usable here, or None."""
    try:
        from opcompiler.backend.cuda_compile import cuda_compiler
        cuda_compiler()
    except Exception as e:  # noqa: BLE001 - OpcError(NO_COMPILER)
        return str(e)
    return None


WHY = compiler_missing()
needs_compiler = pytest.mark.skipif(WHY is not None, reason=f"no CUDA compiler (NVRTC or nvcc): {WHY}")
