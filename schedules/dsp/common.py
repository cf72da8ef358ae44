"""Checks shared by the dsp-sim templates (below every template module, so none imports another for them)."""
from __future__ import annotations

from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.workload import Workload


def require_fp32(wl: Workload, target: Target) -> None:
    if wl.dtype != "float32":
        raise OpcError(f"{target.name} computes in fp32 on its VPEs (no {wl.dtype} arithmetic)", arg="--dtype",
                       value=wl.dtype, expected="float32")
