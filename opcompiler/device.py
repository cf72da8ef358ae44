"""The accelerator in this machine: is there a CUDA GPU, and of which compute capability.

This module imports nothing of the project (TVM only, and only when asked), so the lowest
layer can read it: `opcompiler.target` resolves `--target cuda` to the target file for the GPU
present, and the CUDA backend checks what it may run, both through here.

A process that must never initialise CUDA (a tuning build process) calls `forbid_cuda` first;
asking for the GPU there is then an error instead of a silent driver start.
"""
from __future__ import annotations

import os
import re
from functools import cache
from typing import Any

_FORBIDDEN = ""  # set in build processes: asking for the GPU there is a bug (they must never initialise CUDA)
_TOUCHED = False  # whether this process asked TVM's device API about a CUDA device
_ARCH = re.compile(r"(?:sm_|compute_)?(\d+)\.?(\d)?[af]?")


def forbid_cuda(why: str = "this is a build process") -> None:
    """Make this process unable to initialise CUDA: hide every device from the driver
    (CUDA_VISIBLE_DEVICES="", read when CUDA initialises) and make `has_gpu`/`tvm.cuda` raise."""
    global _FORBIDDEN
    import tvm

    _FORBIDDEN = why
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

    def _refuse(*_: Any, **__: Any) -> Any:
        raise RuntimeError(f"CUDA must not be initialised here ({_FORBIDDEN})")
    tvm.cuda = _refuse  # type: ignore[assignment]
    tvm.runtime.cuda = _refuse  # type: ignore[attr-defined]


def cuda_forbidden() -> str:
    """Why this process may not initialise CUDA ('' when it may)."""
    return _FORBIDDEN


def cuda_touched() -> bool:
    """Whether this process asked TVM's device API about a CUDA device."""
    return _TOUCHED


def has_gpu() -> bool:
    """Whether this process sees a CUDA device (False when TVM has no CUDA runtime)."""
    global _TOUCHED
    if _FORBIDDEN:
        raise RuntimeError(f"CUDA must not be initialised here ({_FORBIDDEN})")
    _TOUCHED = True
    import tvm
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a TVM build without the CUDA runtime
        return False


@cache
def device_arch(device: int = 0) -> str | None:
    """The compute capability of the GPU in this machine as `sm_XX` (TVM's device API), None without one."""
    if not has_gpu():
        return None
    import tvm
    return "sm_" + tvm.cuda(device).compute_version.replace(".", "")


def arch_digits(arch: str) -> int | None:
    """`sm_90` / `sm_90a` / `compute_80` / `9.0` -> 90 / 90 / 80 / 90; None for anything else."""
    m = _ARCH.fullmatch(str(arch).strip())
    return int(m.group(1) + (m.group(2) or "")) if m else None
