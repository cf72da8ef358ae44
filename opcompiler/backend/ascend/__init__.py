"""The Ascend DaVinci AI Core simulator backend.

Modules, by stage (the same names as every simulated machine's):
    intrin      what the templates import of this backend: scopes, annotation and intrinsic
                names, tensor intrinsics, published figures
    lower/      a template's `Scheduled` -> the `Plan`, picking the lowering by name
                (`lower/__init__.py`): `trace` (a scheduled module's event stream), `cube`
                (GEMM / conv nests), `attention`, `recurrent`, `vector` (the TBE emit_insn
                way: element-wise nests), `move`, `reduce`, `gather`; `builder` (the per-core
                program those lowerings emit, with capacity and alignment checks)
    program     buffers, instructions and their semantics (each one's `cost_cycles`), the
                per-core `Program` and the kernel's `Plan`
    timing      the cycle model: six in-order pipes, GM rates under contention, counters
    execute     the functional run: every core's program on simulated memories, timed by
    fclock      the functional clock's own tables
    machine     the target description as the simulator sees it
    backend     build / run / measure and the report

`backend.AscendSimBackend` is not imported here: the backend registry
(`opcompiler.backend`) names it by module, and the templates import only `intrin`.
"""
from .lower.builder import KernelBuilder, ceil_div, split_even
from .machine import Machine
from .program import Plan, Program

__all__ = ["KernelBuilder", "Plan", "Program", "Machine", "ceil_div", "split_even"]
