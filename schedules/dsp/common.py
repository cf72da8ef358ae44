"""Checks shared by the dsp-sim templates (below every template module, so none imports another for them)."""
from __future__ import annotations

from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.workload import Workload

# epilogue blocks of the matmul family's computes, in order (the lowerings' names for them)
MATMUL_EPI = ("matmul_bias", "vrelu")


def require_fp32(wl: Workload, target: Target) -> None:
    if wl.dtype != "float32":
        raise OpcError(f"{target.name} computes in fp32 on its VPEs (no {wl.dtype} arithmetic)", arg="--dtype",
                       value=wl.dtype, expected="float32")


def copy_loop(sch, blk, depth: int):
    """The outermost loop of a copy nest at `depth`. TVM drops unit loops when it computes a block
    at a loop, so a tile of one row or one element has fewer loops: a unit loop is added back
    (small M or N, e.g. a 1 x 1 output tile of a batch-1, one-feature fully connected layer)."""
    lps = sch.get_loops(blk)
    return lps[depth] if len(lps) > depth else sch.add_unit_loop(blk)


def matmul_schedule(wl: Workload):
    """A fresh schedule of the matmul family's compute over (m, k, n) only (a transposed operand
    is relaid by DMA before the kernel), with its epilogue blocks (bias, ReLU) in order, the
    reduction block and the block that writes the output: (sch, epilogue names, matmul, last)."""
    import tvm

    from opcompiler.ops import op_prim_func, workload

    base = workload(wl.op, {k: v for k, v in wl.params if k in ("m", "k", "n")}, dtype=wl.dtype)
    sch = tvm.s_tir.Schedule(op_prim_func(base))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    epi = [b for b in names if b in MATMUL_EPI]
    mm = sch.get_sblock("matmul")
    return sch, epi, mm, sch.get_sblock(epi[-1]) if epi else mm
