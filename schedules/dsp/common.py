"""Checks shared by the dsp-sim templates (below every template module, so none imports another for them)."""
from __future__ import annotations

import math

from opcompiler.backend.dsp.intrin import ALIGN, F32, HSWISH_INLINE, SCOPE_GSM, SCOPE_REG, STAGE, TIR, DspMachine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.steps import lowerable
from opcompiler.target import Target
from opcompiler.workload import Workload

# epilogue blocks of the matmul family's computes, in order (the lowerings' names for them)
MATMUL_EPI = ("matmul_bias", "vrelu")


def require_fp32(wl: Workload, target: Target) -> None:
    if wl.dtype != "float32":
        raise OpcError(f"{target.name} computes in fp32 on its VPEs (no {wl.dtype} arithmetic)", arg="--dtype",
                       value=wl.dtype, expected="float32")


def epilogue_steps(wl: Workload, steps: dict[str, str], lowering: str) -> tuple[str, ...]:
    """The op's epilogue as the lowering's steps (`steps`: the catalogue's step -> the lowering's,
    in order), or an OpcError naming the `lowering` and the steps it takes."""
    epi = lowerable(get_op(wl.op).epilogue_steps(wl), steps, ordered=True)
    if epi is None:
        raise OpcError(f"no dsp {lowering} lowering for {wl.op}'s epilogue {get_op(wl.op).epilogue!r}",
                       arg="op", value=wl.op, expected="epilogue steps among " + ", ".join(steps))
    return epi


def refuse_invalid(tmpl, wl: Workload, target: Target, config) -> None:
    """A config the template's `check` refuses cannot be scheduled: an OpcError saying why."""
    why = tmpl.check(wl, target, config)
    if why:
        raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))


def capacity_why(m: DspMachine, fp: dict[str, int]) -> str | None:
    """Why a footprint (bytes per level, vector registers; the ones it names) does not fit the
    machine, or None."""
    for lv in ("AM", "SM", "GSM"):
        if lv in fp and fp[lv] > m.cap(lv):
            return f"{lv} needs {fp[lv]} B > {m.cap(lv)} B"
    if "REG" in fp and fp["REG"] > m.registers:
        return f"register block needs {fp['REG']} vector registers > {m.registers}"
    return None


def inline_hswish(sch, names: list[str]) -> list[str]:
    """A conv compute whose epilogue ends in HardSwish (`opcompiler.ops.steps`: x + 3, min 6 and max 0
    against broadcast constants, times 1/6, times x: one block each) with the step as one epilogue
    block: its blocks but the last (`intrin.HSWISH_INLINE`) inlined into it ("vmul", whose value is
    then x * (max(min(x + 3, 6), 0) * 1/6)). Returns the root blocks' names left; a compute without
    the step is left as it is."""
    if "vmul" not in names:
        return names
    if not all(b in names for b in HSWISH_INLINE):
        raise OpcError("a conv epilogue block vmul that is not the HardSwish step's", arg="op",
                       expected="the HardSwish step's blocks " + ", ".join(HSWISH_INLINE + ("vmul",)))
    for b in HSWISH_INLINE:  # producers first: each into its consumer, ending in vmul
        sch.compute_inline(sch.get_sblock(b))
    return [b for b in names if b not in HSWISH_INLINE]


def reg_blocks(sch, blk, name: str, epi: list[str]) -> list:
    """The blocks computed per register block, in registers: without an epilogue a register copy
    of the accumulator `blk` (block `name`; the block is then stored to the AM tile); with one,
    `blk` and the epilogue blocks but the last (which stores to the AM tile) set to registers, and
    the epilogue's blocks returned."""
    if not epi:
        return [sch.cache_write(blk, 0, SCOPE_REG)]
    for b in [name] + epi[:-1]:
        sch.set_scope(sch.get_sblock(b), 0, SCOPE_REG)  # accumulators live in registers
    return [sch.get_sblock(b) for b in epi]


def copy_loop(sch, blk, depth: int):
    """The outermost loop of a copy nest at `depth`. TVM drops unit loops when it computes a block
    at a loop, so a tile of one row or one element has fewer loops: a unit loop is added back
    (small M or N, e.g. a 1 x 1 output tile of a batch-1, one-feature fully connected layer)."""
    lps = sch.get_loops(blk)
    return lps[depth] if len(lps) > depth else sch.add_unit_loop(blk)


def matmul_schedule(wl: Workload):
    """A fresh schedule of the matmul family's compute over (m, k, n) only (a transposed operand
    is relaid by DMA before the kernel; batch_matmul: under its batch, B shared or not), with its
    epilogue blocks (bias, ReLU) in order, the reduction block and the block that writes the
    output: (sch, epilogue names, matmul, last)."""
    import tvm

    from opcompiler.ops import op_prim_func, workload

    base = workload(wl.op, {k: v for k, v in wl.params if k in ("m", "k", "n", "b", "bcast_b")}, dtype=wl.dtype)
    sch = tvm.s_tir.Schedule(op_prim_func(base))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    epi = [b for b in names if b in MATMUL_EPI]
    mm = sch.get_sblock("matmul")
    return sch, epi, mm, sch.get_sblock(epi[-1]) if epi else mm


def compacted(sch):
    """The scheduled function with its tiles as TVM compacts them (init blocks lowered, allocations
    placed where they are used, blocks opaque, buffers compacted to the regions their loops
    touch): the sizes the backend's lowering allocates."""
    import tvm.s_tir.transform as st

    mod = sch.mod
    for p in (st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
              st.CompactBufferAllocation()):
        mod = p(mod)
    return mod["main"]


def placement(m: DspMachine, func, dbuf: bool) -> dict[str, int]:
    """The bytes each level's tiles reach when placed as the lowering places them: in the order
    they are allocated, each at its level's alignment (`intrin.ALIGN`), a tile inside a stage loop
    once per buffer (two with `dbuf`), a GSM staging tile inside a stage once per core and buffer."""
    found: list[tuple] = []

    def visit(st, in_stage: bool) -> None:
        if isinstance(st, TIR.SBlockRealize):
            found.extend((b, in_stage) for b in st.block.alloc_buffers)
            visit(st.block.body, in_stage)
        elif isinstance(st, TIR.For):
            visit(st.body, in_stage or STAGE in st.annotations)
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                visit(x, in_stage)
        elif isinstance(st, TIR.IfThenElse):
            visit(st.then_case, in_stage)
    visit(func.body, False)
    top = dict.fromkeys(ALIGN, 0)
    for b, in_stage in found:
        level = b.scope().split(".")[-1]
        if level not in ALIGN:  # registers (or a scope the lowering refuses itself)
            continue
        n = (2 if dbuf else 1) if in_stage else 1
        if b.scope() == SCOPE_GSM and in_stage:
            n *= m.cores
        size = math.prod(int(x) for x in b.shape) * F32
        for _ in range(n):
            top[level] = -(-top[level] // ALIGN[level]) * ALIGN[level] + size
    return top
