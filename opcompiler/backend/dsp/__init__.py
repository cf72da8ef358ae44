"""dsp-sim: a simulator of one FT-M7032 DSP cluster (seed 004) as an opcompiler backend.

Modules: `machine` (figures from the target file), `core` (VPU micro-kernel scheduling),
`program` (the lowered kernel: per-core DMA / VPU ops over flat memories), `engine`
(functional execution and multi-core timing), `backend` (the Backend interface).

`backend.DspSimBackend` is not imported here: the templates import this package's
internals, and the backend looks templates up, so importing a template never runs it.
"""
