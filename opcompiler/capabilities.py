"""What each target family's backend can do, declared once: the backend registry's data.

Code outside the registry asks a capability (`capabilities(target).simulator`,
`.rpc_device`, `.source_kinds`), never `target.family == "..."`. Adding a target family is a
backend folder, a template folder, a target file and one `Capabilities` entry here (plus the
backend's class in `opcompiler.backend`'s table).

This module imports nothing of the project, so the lowest layers (`opcompiler.target`,
`opcompiler.ops`) can read it without an import cycle.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """One family's capabilities. Defaults describe a plain compiled backend."""

    family: str
    summary: str
    simulator: bool = False  # simulated: cycles from a machine model, functional + timing modes
    preferred_dtypes: tuple[str, ...] = ()  # tried first when no --dtype is given (an op that has one)
    default_trials: int = 64  # `opcompiler tune` without --trials: a few minutes on 2 cores
    rpc_device: str | None = None  # the device a TVM RPC session opens for its kernels; None: local only
    needs_device: bool = False  # measuring needs the device on this machine or --rpc
    device_runner: bool = False  # tuning measures through one device-owning runner process
    threaded_build: bool = False  # builds run outside Python's lock (LLVM), so graphs prebuild in threads
    source_kinds: tuple[str, ...] = ()  # what `build --emit-source` writes, by suffix; () = no source
    binary_kinds: tuple[str, ...] = ()  # what `build --cubin` writes, by suffix
    run_options: tuple[str, ...] = ()  # target `extra` keys `opcompiler run` may override (--dsp-mode)
    auto_target: str | None = None  # a target name resolved for this machine's device
    auto_target_note: str = ""


_DECLARED: Mapping[str, Capabilities] = MappingProxyType({c.family: c for c in (
    Capabilities(family="cpu", summary="the host CPU through LLVM", default_trials=32, rpc_device="cpu",
                 threaded_build=True, source_kinds=(".ll", ".s", ".asm")),
    Capabilities(family="cuda", summary="NVIDIA GPUs through CUDA", default_trials=64, rpc_device="cuda",
                 needs_device=True, device_runner=True, source_kinds=(".cu", ".cuh"), binary_kinds=(".cubin",),
                 auto_target="cuda",
                 auto_target_note="`cuda` is the target for the GPU in this machine (its compute capability); "
                                  "cuda-sm80 without one"),
    Capabilities(family="ascend", summary="Huawei Ascend DaVinci AI Core simulator", simulator=True,
                 preferred_dtypes=("float16",), default_trials=128),
    Capabilities(family="dsp", summary="FT-M7032 DSP cluster simulator", simulator=True, default_trials=128,
                 run_options=("data_mode",)),
)})

FAMILIES: tuple[str, ...] = tuple(_DECLARED)


def capabilities(target_or_family: Any) -> Capabilities:
    """The capabilities of a `Target` (or a family name). Target files are checked against
    `FAMILIES` when read; a family declared nowhere (a test's fake backend) gets the defaults."""
    family = target_or_family if isinstance(target_or_family, str) else target_or_family.family
    found = _DECLARED.get(family)
    return found if found is not None else Capabilities(family=family, summary="not declared: the defaults")


def families_with(**want: Any) -> tuple[str, ...]:
    """Families whose capabilities match every keyword (`families_with(simulator=True)`)."""
    return tuple(f for f, c in _DECLARED.items() if all(getattr(c, k) == v for k, v in want.items()))
