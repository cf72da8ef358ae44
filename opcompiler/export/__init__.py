"""Export tuned kernels to frameworks: a self-contained folder with the compiled kernel (or the
simulator program), `manifest.json`, and bindings for plain Python (`lib`), PyTorch (`torch`)
and ONNX (`onnx`).

    >>> from opcompiler.export import export, load, import_folder
    >>> export(wl, load_target("cpu"), "best", to="torch,onnx", out="out/conv")
    >>> k = load("out/conv"); y = k(x, w, scale, shift)      # numpy in, numpy out
    >>> pkg = import_folder("out/conv")                        # registers torch.ops.opcompiler.<name>
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

from .folder import BINDINGS, export, parse_bindings
from .runtime import ExportedKernel, KernelInputError, aligned_empty, load, read_manifest


def folder_name(name: str) -> str:
    """`name` made a Python identifier (`conv2d-ascend910-sim` -> `conv2d_ascend910_sim`), so that
    `sys.path.insert(0, parent); import <folder>` works for the export folder."""
    out = re.sub(r"\W", "_", name)
    return out if out and not out[0].isdigit() else f"_{out}"


def import_folder(folder: str | os.PathLike) -> ModuleType:
    """Import an export folder as a package (whatever its name); importing a torch export
    registers its `torch.ops.opcompiler.<name>`. Imported once per process per folder."""
    path = Path(folder).resolve()
    read_manifest(path)  # a clear error for a folder that is not an export
    mod_name = "opc_export_" + re.sub(r"\W", "_", str(path))
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return mod


__all__ = [
    "BINDINGS",
    "ExportedKernel",
    "KernelInputError",
    "aligned_empty",
    "export",
    "folder_name",
    "import_folder",
    "load",
    "parse_bindings",
    "read_manifest",
]
