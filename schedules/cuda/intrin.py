"""TVM's CUDA tensor intrinsics (WMMA, mma.sync / ldmatrix), imported in seconds instead of most of a minute.

`import tvm.s_tir.tensor_intrin.cuda` runs the package's `__init__`, which parses about 250
TVMScript functions (every target's intrinsics). For each, TVM's `T.prim_func` entry calls
`inspect.stack()`, which resolves the source file and module of every frame on the stack. For the
importer's frozen frames (no file on disk) `inspect.getmodule` scans all of `sys.modules` (about
2,000 modules once TVM is loaded), so the import took 52 s on a 2-core machine, paid by every
process that builds a CUDA kernel.

TVM keeps that stack only to read frames, their locals and the current source line
(`tvm.script.parser.core.utils.is_defined_in_class`, `resolve_closure_vars`). `_light_stack` builds
the same `inspect.FrameInfo` records from the frames and `linecache`, without the module lookup;
it stands in for `inspect.stack` in TVM's parser entry only while the intrinsics are imported.
The intrinsics it gives print the same TVMScript as a plain import (all 110 registered names;
`tests/cuda/test_cuda_intrin.py`). Import time here: 5.5 s.
"""
from __future__ import annotations

import dis
import inspect
import linecache
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.Lock()


def _light_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """`inspect.stack(context)` for the caller, each record's line from `linecache` (one line of
    context, as TVM asks for) and no source-file or module resolution."""
    frame = sys._getframe(1)
    out = []
    while frame is not None:
        code = frame.f_code
        try:  # the instruction's own lines and columns, as inspect.getframeinfo gives them
            pos = dis.Positions(*inspect._get_code_position(code, frame.f_lasti))
        except (AttributeError, IndexError, TypeError):
            pos = None
        lineno = pos.lineno if pos is not None and pos.lineno is not None else frame.f_lineno
        line = linecache.getline(code.co_filename, lineno) if context > 0 else ""
        out.append(inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name,
                                     [line] if line else None, 0 if line else None, positions=pos))
        frame = frame.f_back
    return out


class _Inspect:
    """The `inspect` module as TVM's parser entry sees it: `stack` is `_light_stack`."""

    stack = staticmethod(_light_stack)

    def __getattr__(self, name: str):
        return getattr(inspect, name)


@contextmanager
def light_tvmscript_stack() -> Iterator[None]:
    """While inside, TVMScript's `T.prim_func` walks the stack with `_light_stack`."""
    from tvm.tirx.script.parser import entry

    if getattr(entry, "inspect", None) is not inspect:  # a TVM whose entry no longer walks the stack this way
        yield
        return
    with _LOCK:
        saved = entry.inspect
        entry.inspect = _Inspect()
        try:
            yield
        finally:
            entry.inspect = saved


def _load():
    if "tvm.s_tir.tensor_intrin.cuda" in sys.modules:
        return sys.modules["tvm.s_tir.tensor_intrin.cuda"]
    with light_tvmscript_stack():
        from tvm.s_tir.tensor_intrin import cuda
    return cuda


_cuda = _load()
get_wmma_intrin_group = _cuda.get_wmma_intrin_group
# mma.sync m16n8k16 + ldmatrix (the intrinsics MetaSchedule's tensor-core rule uses)
get_mma_intrin_group = _cuda.get_mma_intrin_group
shared_16x16_to_ldmatrix_32x8_layout = _cuda.shared_16x16_to_ldmatrix_32x8_layout
