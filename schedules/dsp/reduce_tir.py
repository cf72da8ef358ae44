"""Row reductions (reduce_sum, reduce_max over the last axis of (m, n)) as the TVM schedule the
DSP simulator executes: the op's own TE compute with the reduce template's knobs as primitives.

    rows per stage                 split of the row axis; the outer loop opc.dsp.stage and
                                   opc.dsp.cores (contiguous shares of row blocks)
    the row tile                   cache_read into local.AM at the stage (a DMA nest), rows
                                   storage_align'ed to a multiple of 32 x `acc` (the pitch)
    acc accumulators               split of the reduction axis into (vectors / acc, acc, lanes):
                                   the lowering keeps one accumulator per `acc` iteration, walks
                                   the first loop, reduces the lanes (rotate-and-combine)
    the result                     cache_write into local.AM (one element per row), copied back

`opcompiler.backend.dsp.tir_vector` lowers the function; nothing here emits an instruction.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.tir_vector import VEC, VecLowerer
from opcompiler.ops import get_op, op_prim_func
from opcompiler.target import Target
from opcompiler.workload import Workload

_WL: dict[str, Workload] = {}


def reduce_schedule(wl: Workload, rows: int, acc: int, lanes: int):
    import tvm

    key = wl.key_str()
    _WL[key] = wl
    sch = tvm.s_tir.Schedule(op_prim_func(_WL[key]))
    root = sch.get_sblock("root")
    blk = sch.get_child_blocks(root)[-1]
    i, k = sch.get_loops(blk)
    io, ii = sch.split(i, [None, rows])
    sch.split(k, [None, acc, lanes])  # (vectors / acc, acc, lanes)
    sch.annotate(io, "opc.dsp.stage", 1)
    sch.annotate(io, "opc.dsp.cores", 1)
    o = sch.cache_write(blk, 0, "local.AM")
    sch.reverse_compute_at(o, io, preserve_unit_loops=True)
    rd = sch.cache_read(blk, 0, "local.AM")
    sch.compute_at(rd, io, preserve_unit_loops=True)
    sch.storage_align(rd, 0, 0, lanes * acc, 0)
    sch.annotate(sch.get_loops(rd)[1], "opc.dsp.op", "dma")
    sch.annotate(ii, "opc.dsp.op", VEC)
    sch.annotate(ii, "opc.dsp.reduce_lanes", 1)
    sch.annotate(sch.get_loops(o)[1], "opc.dsp.op", "dma")
    return sch


_FUNCS: dict[tuple, Any] = {}


def lowered_func(wl: Workload, target: Target, rows: int, acc: int, lanes: int,
                 schedule: Callable = reduce_schedule) -> Any:
    """The lowered function of a row schedule (this module's, or softmax_tir's), cached per
    workload, target and tiling."""
    from opcompiler.backend.dsp.tir_lower import lowered

    key = (schedule.__name__, wl.key_str(), getattr(target, "digest", target.name), rows, acc, lanes)
    if key not in _FUNCS:
        if len(_FUNCS) >= 256:
            _FUNCS.clear()
        _FUNCS[key] = lowered(schedule(wl, rows, acc, lanes))
    return _FUNCS[key]


def build_program(wl: Workload, target: Target, config: Mapping[str, Any], functional: bool, g,
                  shares: list, group_key: Callable[[int], Hashable], tamper: Callable | None = None,
                  vtamper: Callable | None = None, func: Any = None):
    """The cluster program: per-core ops lowered from the TIR (`func`: another row schedule's
    lowered function, softmax_tir's), the host's launch / copies."""
    m = machine(target)
    op = get_op(wl.op)
    if func is None:
        func = lowered_func(wl, target, g.rows, g.acc, g.L)
    ddr_names = {func.params[0].name: "x", func.params[-1].name: "out"}
    out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
    ddr = {"x": (g.m_, g.n), "out": out_shape}
    tir_shapes = {ddr_names[p.name]: tuple(int(s) for s in p.shape) for p in func.params}
    low = VecLowerer(m, func, ddr_names, tir_shapes, bool(config["dbuf"]), functional, tamper, vtamper,
                     tile_tags=True)
    k = max(1, min(int(config.get("cores", m.cores)), m.cores))
    hpre, hpost = host_ops(m, [("x", nbytes(ddr["x"]))], [("out", nbytes(out_shape))], [])

    def core_ops(c: int) -> list:
        return low.core_ops(c, k, 1) if c < k else []
    return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops, group_key=group_key, pre=[], post=[],
                    host_pre=hpre, host_post=hpost, ddr_tensors=ddr, inputs=["x"], output="out", out_shape=out_shape,
                    flops=op.flops(wl), cores_used=sum(1 for s in shares if s),
                    info={"layout_change": "none", "lane_use": round(g.n / g.npad, 4), "lowering": "tir"})


__all__ = ["build_program", "lowered_func", "reduce_schedule"]
