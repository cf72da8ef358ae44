"""The manifest of an export folder: what the kernel is, what it takes, where it came from."""
from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..backend import Kernel, capabilities
from ..ops import get_op
from ..records import jsonable
from ..target import Target
from ..workload import Workload
from .runtime import FORMAT_VERSION, MANIFEST


def tensor_layout(wl: Workload, name: str, shape: tuple[int, ...]) -> str:
    """The axis order of one operand, spelled like the framework layouts (NCHW, OIHW, HWIO, MK...)."""
    op = get_op(wl.op)
    p = wl.p
    lay = p.get("layout", "NCHW")
    if len(shape) == 1:
        return "N" if op.family == "matmul" else "C"
    if op.family == "conv2d" and name == "weight":
        return "OIHW" if lay == "NCHW" else "HWIO"
    if op.family == "matmul":
        if name == "tensor_a":
            return "KM" if p.get("trans_a") else "MK"
        if name == "tensor_b":
            return "NK" if p.get("trans_b") else "KN"
        return "MN"
    if len(shape) == 4:
        return str(lay)
    return "MN"[:len(shape)] if len(shape) <= 2 else f"{len(shape)}-D row-major"


def io_specs(wl: Workload) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Inputs (in call order) and the output, each with name, shape, dtype and layout."""
    op = get_op(wl.op)
    ins = [{"name": n, "shape": list(s), "dtype": d, "layout": tensor_layout(wl, n, tuple(s))}
           for n, s, d in op.inputs(wl)]
    shape, dt = op.output_spec(wl)
    out_layout = tensor_layout(wl, "out", shape)
    if op.family == "reduce":
        out_layout = "M"
    return ins, {"name": "out", "shape": list(shape), "dtype": dt, "layout": out_layout}


def default_name(wl: Workload) -> str:
    """A Python/torch identifier for the op: the op name (torch.ops.opcompiler.<name>)."""
    return re.sub(r"\W", "_", wl.op)


def versions() -> dict[str, str]:
    import tvm

    from ..settings import __version__
    return {"opcompiler": __version__, "tvm": str(tvm.__version__), "numpy": np.__version__,
            "python": platform.python_version()}


def build_manifest(*, name: str, wl: Workload, target: Target, kernel: Kernel, config_source: str,
                   record: dict[str, Any] | None, record_key: dict[str, Any], artifact: dict[str, Any],
                   bindings: list[str], verification: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a JSON-able dict (docs/export.md, "What the folder holds", lists every field)."""
    op = get_op(wl.op)
    ins, out = io_specs(wl)
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "op": wl.op,
        "summary": op.summary,
        "fusion": op.fusion,
        "unfused": [{"op": s.op, "params": dict(s.params), "inputs": list(s.inputs)} for s in op.unfused(wl)],
        "params": dict(wl.params),
        "dtype": wl.dtype,
        "layout": wl.p.get("layout", ""),
        "inputs": ins,
        "output": out,
        "calling_convention": "destination-passing: inputs in order, then the preallocated output",
        "target": {"name": target.name, "family": target.family, "description": target.description,
                   "digest": target.digest, "simulator": target.is_simulator,
                   "device": capabilities(target).rpc_device},  # the TVM device a library runs on
        "template": kernel.template,
        "template_version": kernel.template_version,
        "config": dict(kernel.config),
        "config_source": config_source,
        "record": record,
        "record_key": record_key,
        "artifact": artifact,
        "bindings": bindings,
        "verification": verification,
        "flops": op.flops(wl),
        "versions": versions(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, default=jsonable) + "\n")
    return path
