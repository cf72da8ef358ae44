"""The direct-convolution and fully-connected schedules as TVM `s_tir.Schedule`s.

The DSP program (`direct.py`) is what the simulator executes; this is the same tiling written
as TVM schedule primitives over the op's TE compute: the output loops split into (channel block,
image, row block, column block | rows, columns, lanes), the padded input staged per tile in
`local.SM` (its `pad` block computed at the column-block loop: the DMA-in plus the zero fill),
the weights of a channel block in `local.AM`, the output tile written through `local.AM`, and
the pixel loop split into register blocks of `pw`. After TVM's buffer compaction the staged
buffers are the tiles; `tile_buffers` returns them so a test (and `run`) can check that the
program the simulator runs stages exactly these tiles. The module builds for llvm, so the
schedule's arithmetic can also be checked natively against numpy.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from opcompiler.backend.dsp.machine import machine
from opcompiler.ops import get_op, workload
from opcompiler.target import Target
from opcompiler.workload import Workload

_BUF = re.compile(r"(\w+) = T\.(?:alloc_buffer|decl_buffer|sblock_alloc_buffer)\(\(([^)]*)\)[^\n]*scope=\"(local\.\w+)\"")


def _conv_workload(wl: Workload) -> Workload:
    """The plain NHWC convolution the program computes (relayout and epilogue do not change tiles)."""
    p = dict(wl.params)
    p["layout"] = "NHWC"
    return workload("conv2d", p, dtype=wl.dtype)


def tir_schedule(wl: Workload, target: Target, config: Mapping[str, Any]):
    """An s_tir.Schedule with this config's tiling and memory scopes (k-split FC: None)."""
    import tvm
    from tvm import te

    if config.get("split") == "k":
        return None
    lanes = machine(target).lanes
    kbp = config["kv"] * lanes
    if get_op(wl.op).family == "matmul":
        base = workload("matmul", {k: v for k, v in wl.params if k in ("m", "k", "n")}, dtype=wl.dtype)
        ins, out = get_op("matmul").compute(base)
        sch = tvm.s_tir.Schedule(te.create_prim_func(list(ins) + [out]))
        mm = sch.get_sblock("matmul")
        i, j, k = sch.get_loops(mm)
        io, ii = sch.split(i, [None, config["rows"]])
        jo, ji = sch.split(j, [None, kbp])
        sch.reorder(jo, io, ii, ji, k)
        a = sch.cache_read(mm, 0, "local.SM")
        sch.compute_at(a, io)
        b = sch.cache_read(mm, 1, "local.AM")
        sch.compute_at(b, jo)
        o = sch.cache_write(mm, 0, "local.AM")
        sch.reverse_compute_at(o, io)
        _, pb = sch.split(ii, [None, config["pw"]])
        sch.annotate(io, "opc.dsp.split_across_cores", "items")
        return sch
    base = _conv_workload(wl)
    ins, out = get_op("conv2d").compute(base)
    sch = tvm.s_tir.Schedule(te.create_prim_func(list(ins) + [out]))
    conv = sch.get_sblock("conv2d")
    n, y, x, kk, ry, rx, rc = sch.get_loops(conv)
    yo, yi = sch.split(y, [None, config["rows"]])
    xo, xi = sch.split(x, [None, min(config["cols"], base["w"] + 2 * base["pad"])])
    ko, ki = sch.split(kk, [None, kbp])
    if config["order"] == "ws":  # the paper's pass: input channels outside the pixels
        sch.reorder(ko, n, yo, xo, rc, yi, xi, ki, ry, rx)
    else:
        sch.reorder(ko, n, yo, xo, yi, xi, ki, ry, rx, rc)
    try:
        pad = sch.get_sblock("pad")
        sch.compute_at(pad, xo)
        sch.set_scope(pad, 0, "local.SM")
    except Exception:  # no padding: stage the input itself
        d = sch.cache_read(conv, 0, "local.SM")
        sch.compute_at(d, xo)
    w = sch.cache_read(conv, 1, "local.AM")
    sch.compute_at(w, ko)
    o = sch.cache_write(conv, 0, "local.AM")
    sch.reverse_compute_at(o, xo)
    if config["order"] == "out":
        pix = sch.fuse(yi, xi)
        sch.split(pix, [None, config["pw"]])
    sch.annotate(n if config["split"] == "batch" else yo, "opc.dsp.split_across_cores", config["split"])
    return sch


def tile_buffers(sch) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Staged buffers by scope after TVM's buffer compaction: {scope: [(name, shape)]}."""
    import tvm.s_tir.transform as st

    mod = sch.mod
    for p in (st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
              st.CompactBufferAllocation()):
        mod = p(mod)
    out: dict[str, list] = {}
    for name, shape, scope in _BUF.findall(mod.script()):
        out.setdefault(scope, []).append((name, tuple(int(s) for s in shape.split(",") if s.strip())))
    return out
