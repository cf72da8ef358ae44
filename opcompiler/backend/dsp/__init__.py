"""dsp-sim: a simulator of one FT-M7032 DSP cluster (seed 004) as an opcompiler backend.

Modules: `intrin` (the scopes, annotations and intrinsic names a schedule uses, and the machine's
figures: the one module the templates import), `lower` (a template's `Scheduled` -> the cluster
program: picks the `tir_*` Lowerer and assembles), `machine` (figures from the target file),
`core` (VPU micro-kernel scheduling), `program` (the lowered kernel: per-core DMA / VPU ops over
flat memories), `engine` (functional execution and multi-core timing), `backend` (the Backend
interface).

`backend.DspSimBackend` is not imported here: the templates import `intrin`, and the backend
looks templates up, so importing a template never runs it.
"""
