"""The Ascend DaVinci AI Core simulator backend.

Modules, by concept: `machine` (the target description as the simulator sees it), `isa`
(buffers, instructions and their semantics), `builder` (TIK-style program emission with
capacity and alignment checks), `scheduler` (the six in-order pipes and shared bandwidth),
`backend` (build / run / measure and the report).
"""
from .backend import AscendSimBackend
from .builder import KernelBuilder, Plan, Program, ceil_div, split_even
from .machine import Machine

__all__ = ["AscendSimBackend", "KernelBuilder", "Plan", "Program", "Machine", "ceil_div", "split_even"]
