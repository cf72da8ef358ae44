"""The backend registry: which backend serves a target, and what each family can do.

Exactly one backend claims each target family; `get_backend(target)` picks it, importing
its module by the name in `_BACKENDS`. A family's capabilities (simulator or not, default
dtype and trials, RPC, source kinds, ...) are declared in `opcompiler.capabilities`; code elsewhere
asks them (`capabilities(target).simulator`) rather than comparing family names. The
interface itself (`Backend`, `Kernel`, `RunResult`) lives in `base.py` and is re-exported here.
"""
from __future__ import annotations

from importlib import import_module

from ..errors import OpcError
from ..target import Target
from .base import Backend, Kernel, RunResult, device_args
from ..capabilities import FAMILIES, Capabilities, capabilities, families_with

_BACKENDS: dict[str, str] = {
    "cpu": "opcompiler.backend.cpu:CpuBackend",
    "ascend": "opcompiler.backend.ascend.backend:AscendSimBackend",
    "dsp": "opcompiler.backend.dsp.backend:DspSimBackend",
    "cuda": "opcompiler.backend.cuda:CudaBackend",
}
assert set(_BACKENDS) == set(FAMILIES), "every declared family needs a backend, and only those"


def backend_class(target: Target) -> type[Backend]:
    """The backend class of `target`'s family (its module imported on first use)."""
    spec = _BACKENDS.get(target.family)
    if spec is None:
        raise OpcError(f"no backend for target family {target.family!r}", expected=", ".join(_BACKENDS))
    mod, cls = spec.split(":")
    try:
        module = import_module(mod)
    except ModuleNotFoundError as e:
        if e.name == mod:
            raise OpcError(f"the {target.family} backend is not available in this build") from None
        raise
    return getattr(module, cls)


def get_backend(target: Target) -> Backend:
    """The one backend that claims `target`'s family."""
    return backend_class(target)(target)


__all__ = ["Backend", "Capabilities", "FAMILIES", "Kernel", "RunResult", "backend_class", "capabilities",
           "device_args", "families_with", "get_backend"]
