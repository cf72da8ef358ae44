"""dsp-sim: a simulator of one FT-M7032 DSP cluster (seed 004) as an opcompiler backend.

The stages, under the names every simulated machine uses: `intrin` (the scopes, annotations and
intrinsic names a schedule uses, the micro-kernel intrinsics and the machine's figures: the one
module the templates import), `lower` (a package: a template's `Scheduled` -> the cluster
program; `lower/__init__` picks the Lowerer by the lowering's name, one module per kind of nest:
`direct`, `gemm`, `ksplit`, `gconv`, `vector` (+ `vscan`, `vselect`, `vwindow`), `move`,
`attention`, `recurrent`, `gather`, with `eval` and `assemble`), `program` (the instructions
and the program container: per-core DMA / VPU ops over flat memories, the VPU's vector
instructions), `timing` (the cycle model, every cost of it, and the multi-core timing replay),
`execute` (the functional run), `fclock` (the independent clock of a functional run),
`machine` (figures from the target file), `backend` (the Backend interface).

`backend.DspSimBackend` is not imported here: the templates import `intrin`, and the backend
looks templates up, so importing a template never runs it.
"""
