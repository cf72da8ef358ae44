"""The Ascend DaVinci AI Core simulator backend.

Modules, by concept: `machine` (the target description as the simulator sees it), `isa`
(buffers, instructions and their semantics), `builder` (TIK-style program emission with
capacity and alignment checks), `scheduler` (the six in-order pipes and shared bandwidth),
`backend` (build / run / measure and the report).

`backend.AscendSimBackend` is not imported here: the templates import this package's
internals, and the backend looks templates up, so importing a template never runs it.
"""
from .builder import KernelBuilder, Plan, Program, ceil_div, split_even
from .machine import Machine

__all__ = ["KernelBuilder", "Plan", "Program", "Machine", "ceil_div", "split_even"]
