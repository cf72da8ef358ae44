"""opcompiler: an operator compiler and autotuner on Apache TVM."""
from __future__ import annotations

from .settings import init_tvm_threads

init_tvm_threads()

from . import settings as _settings  # noqa: E402
from .errors import OpcError, OpcFailure  # noqa: E402
from .settings import __version__  # noqa: E402


def _load_shipped_templates() -> None:
    """Register every shipped template (imports TVM): called by the core's registry on the first
    lookup that finds it empty, so `get_backend(...).build(...)` needs no import ritual."""
    from importlib import import_module
    import_module("opcompiler.schedules")


_settings.template_loader = _load_shipped_templates

__all__ = ["OpcError", "OpcFailure", "__version__"]
