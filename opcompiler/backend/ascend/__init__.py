"""The Ascend DaVinci AI Core simulator backend.

Modules, by stage: `intrin` (what the templates import of this backend: scopes, annotation and
intrinsic names, tensor intrinsics, published figures), `lower` (a template's `Scheduled` ->
the `Plan`, picking the lowering by name: the cube's `tir_trace` / `tir_lower`, the vector
unit's `emit_insn`, `emit_move`, `emit_reduce`, `emit_gather`, `tir_attention`,
`tir_recurrent`), `builder` (the per-core program those lowerings emit, with capacity and
alignment checks), `machine` (the target description as the simulator sees it), `isa`
(buffers, instructions and their semantics), `scheduler` (the six in-order pipes and shared
bandwidth: the timing replay, the functional run and the profile), `fclock` (the functional
clock's tables), `backend` (build / run / measure and the report).

`backend.AscendSimBackend` is not imported here: the backend registry
(`opcompiler.backend`) names it by module, and the templates import only `intrin`.
"""
from .builder import KernelBuilder, Plan, Program, ceil_div, split_even
from .machine import Machine

__all__ = ["KernelBuilder", "Plan", "Program", "Machine", "ceil_div", "split_even"]
