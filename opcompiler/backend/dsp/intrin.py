"""The FT-M7032 DSP's intrinsics and scopes as a schedule names them: the one backend module the
dsp templates (`schedules/dsp/`) import, as TVM's `tir.tensor_intrin` modules are for theirs.

A dsp template builds a TVM schedule of the op's own compute and marks it with what is here:
buffer scopes (where a tile lives), the `opc.dsp.*` loop annotations and the intrinsic names
their `opc.dsp.op` takes (what a nest is on the chip), and reads the machine's published figures
(`machine(target)`: lanes, capacities, registers, cores) to state its knob ranges and checks. It
returns an `opcompiler.template_base.Scheduled`; the backend (`lower.lower`) picks the lowering,
walks the module and assembles the program. Nothing here lowers or assembles anything.

The register-blocked micro-kernels (`mk_out`: a pw x kv block of accumulators fed by the FMACs;
`mk_ws`: weight-stationary taps; `mk_ew`: the epilogue pass) are the DSP's tensor intrinsics, as
`mma.sync` is a GPU's: a template chooses their shape, and what one call issues per slot
(`MkCost`, list-scheduled from the machine's slots and latencies) is the intrinsic's description
that the direct convolution's `check` and features read. Their execution stays in the lowering.
"""
from __future__ import annotations

from ...sim.tir_expr import TIR  # noqa: F401  (TVM's TIR node classes, resolved on first use, for schedules' walkers)
from .machine import F32, DspMachine, machine
# the micro-kernel intrinsics (see above)
from .timing import EPI_REGS, EPI_TEMPS, MkCost, mk_ew, mk_out, mk_ws, sum_costs

F32_NAME = "float32"

# buffer scopes: where a tile lives (DDR is a parameter's scope; REG: vector registers)
SCOPE_GSM = "local.GSM"  # the cluster's shared memory
SCOPE_AM = "local.AM"  # a core's array memory (vector loads / stores)
SCOPE_SM = "local.SM"  # a core's scalar memory (scalar loads, broadcast to the lanes)
SCOPE_REG = "local.REG"  # vector registers (accumulators)
SCOPES = (SCOPE_GSM, SCOPE_AM, SCOPE_SM, SCOPE_REG)
ALIGN = {"GSM": 64, "AM": 128, "SM": 8}  # bytes: where a level's next tile may start

# loop annotations ("pragmas") the lowerings read
OP = "opc.dsp.op"  # what the nest is: one of the intrinsic names below
STAGE = "opc.dsp.stage"  # each iteration one DMA-in / VPU / DMA-out stage (double-buffered with dbuf)
CORES = "opc.dsp.cores"  # iterations split in contiguous ranges across the cores
ITEMS = "opc.dsp.items"  # a loop over stage loops in sequence: one item list the cores share

# intrinsic names (values of `opc.dsp.op`)
DMA = "dma"  # one DMA descriptor per execution of the copy nest
DMA_SHARED = "dma_shared"  # a copy into GSM split across the cores, then a barrier
VEC = "vec"  # a vector nest: lanes innermost, one VPU pass per stage
GCONV = "gconv"  # a register-blocked grouped / depthwise convolution nest
MK = "mk"  # each iteration one output-stationary micro-kernel call (a register block)
MK_WS = "mk_ws"  # the weight-stationary pass per input channel
MK_EW = "mk_ew"  # the element-wise epilogue pass over a tile
MK_GEMM = "mk_gemm"  # the blocked GEMM's register block
INTRINSICS = (DMA, DMA_SHARED, VEC, GCONV, MK, MK_WS, MK_EW, MK_GEMM)
# a kernel written as a TIR loop nest of stage events (attention: `schedules/dsp/attention.py`):
# each stage one `T.call_packed(EVENT, stage, ...)`, turned into its ops by the lowering it names
EVENT = "opc.dsp.event"

# epilogue blocks of the conv / matmul computes, in order, by the lowerings' names for them
# ("vadd": a residual tensor added, the conv + eltwise fusion; its tile is a stage input in AM;
# "vmul": the HardSwish step's last block, x * (clip(x + 3, 0, 6) * 1/6), the step's other blocks
# inlined into it by the template, `HSWISH_INLINE`)
EPI_BLOCKS = {"conv2d_bias": "bias", "matmul_bias": "bias", "batch_norm": "bn", "vadd": "res", "vrelu": "relu",
              "vmul": "hswish"}
# the blocks of the HardSwish step's compute (`opcompiler.ops.steps`) a conv template inlines into its
# last block ("vmul"), so that the step is one epilogue block
HSWISH_INLINE = ("vadds", "broadcast_scalar", "vmin", "broadcast_scalar_1", "vmax", "vmuls")

__all__ = ["TIR", "MkCost", "mk_ew", "mk_out", "mk_ws", "sum_costs", "ALIGN", "CORES", "DMA", "DMA_SHARED", "DspMachine",
           "EPI_BLOCKS", "EPI_REGS", "EPI_TEMPS", "HSWISH_INLINE", "EVENT", "F32", "F32_NAME", "GCONV",
           "INTRINSICS", "ITEMS", "MK", "MK_EW", "MK_GEMM", "MK_WS", "OP", "SCOPES", "SCOPE_AM", "SCOPE_GSM",
           "SCOPE_REG", "SCOPE_SM", "STAGE", "VEC", "machine"]
