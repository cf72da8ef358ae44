"""opcompiler: an operator compiler and autotuner on Apache TVM."""
from __future__ import annotations

from .settings import init_tvm_threads

init_tvm_threads()

__version__ = "0.1.0"

from .errors import OpcError, OpcFailure  # noqa: E402

__all__ = ["OpcError", "OpcFailure", "__version__"]
