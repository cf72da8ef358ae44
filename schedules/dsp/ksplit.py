"""Fully connected layers with the reduction split across the cores (`split="k"`), the partial
sums reduced through GSM -- for the small-M layers (MiniGo's FC runs on one sample at a time,
input (1, 722)) where splitting the rows leaves seven of eight cores idle.

Per block of rows and of output features: every core multiplies its slice of the reduction
(DDR -> SM input columns, DDR -> AM weight rows, register blocks as in `direct.py`, no
epilogue), DMAs its partial tile AM -> GSM; a barrier; one core (round robin) DMAs the P
partial tiles GSM -> AM, adds them on the VPU, applies bias/ReLU and DMAs the result to DDR;
a barrier frees the GSM slots.

The program is a TVM schedule of the op's own compute: the K axis split into one part per core
and `rfactor`ed, the partial tiles in local.GSM, the sum over the parts (the `matmul` block) and
the epilogue in registers (`ksplit_schedule`); the backend's `tir_ksplit.KsplitLowerer` lowers it,
the parts balanced as c*K//P (`tir_ksplit.balance_parts`).
"""
from __future__ import annotations

from opcompiler.backend.dsp.intrin import (
    CORES, DMA, F32, MK, OP, SCOPE_AM, SCOPE_GSM, SCOPE_REG, SCOPE_SM, DspMachine, machine,
)
from opcompiler.ops import get_op
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from .common import copy_loop, matmul_schedule
from .direct import ConvSpec, DirectConfig


def footprint_k(m: DspMachine, sp: ConvSpec, cf: DirectConfig) -> dict[str, int]:
    kbp = cf.kv * m.lanes
    chunk = -(-sp.c // m.cores)
    am = (chunk * kbp + cf.rows * kbp + m.cores * cf.rows * kbp + cf.rows * kbp + kbp) * F32
    return {"AM": am, "SM": cf.rows * chunk * F32, "GSM": m.cores * cf.rows * kbp * F32,
            "REG": cf.pw * cf.kv + cf.kv + cf.pw}


def ksplit_schedule(wl: Workload, lanes: int, cores: int, rows: int, kv: int, pw: int):
    """The rfactored schedule (see the module docstring)::

        jo (kv*32 output features): epilogue vectors -> local.AM
          io (row blocks; opc.dsp.rr: partials, barrier, one core reduces, barrier)
            kc (the K parts, opc.dsp.cores): A slice -> local.SM, B slice -> local.AM (resident),
              register blocks of pw rows (matmul_rf in local.REG -> partial tile in local.AM),
              partial tile -> local.GSM (the cluster's P partial tiles)
            P partial tiles GSM -> local.AM; mk_red: their sum (matmul), bias, ReLU -> local.AM
            output tile -> DDR
    """
    sch, epi, mm, last = matmul_schedule(wl)
    o = sch.cache_write(last, 0, SCOPE_AM)
    _, _, k = sch.get_loops(mm)
    kc, _ = sch.split(k, [cores, None])
    rf = sch.rfactor(kc, 0)
    sch.set_scope(rf, 0, SCOPE_GSM)
    i, j, kc, kk = sch.get_loops(rf)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, kv * lanes])
    sch.reorder(jo, io, kc, ii, ji, kk)
    sch.annotate(kc, CORES, 1)
    sch.annotate(io, "opc.dsp.rr", 1)
    p = sch.cache_write(rf, 0, SCOPE_AM)
    reg = sch.cache_write(rf, 0, SCOPE_REG)
    sch.reverse_compute_at(reg, ii)
    sch.reverse_compute_at(p, kc)
    w = sch.cache_read(rf, 1, SCOPE_AM)
    a = sch.cache_read(rf, 0, SCOPE_SM)
    sch.compute_at(w, kc)
    sch.compute_at(a, kc)
    mm = sch.get_sblock("matmul")
    if epi:
        for b in ["matmul"] + epi[:-1]:
            sch.set_scope(sch.get_sblock(b), 0, SCOPE_REG)  # the sum and epilogue in registers
        tail = [sch.get_sblock(b) for b in epi]
    else:
        tail = [sch.cache_write(mm, 0, SCOPE_REG)]  # the sum in registers, stored to the tile
    r = sch.cache_read(mm, 0, SCOPE_AM)
    sch.reverse_compute_at(r, io)
    sch.reverse_compute_at(mm, io)
    # under io: the K parts, the rows, the features. TVM leaves out a loop of one iteration: the
    # K parts' when only one holds data (K = 1: the parts past K are empty, and the read-back
    # covers the written ones), the rows' with one row per block, the features' with N = 1
    lp = sch.get_loops(mm)[2:]
    rk = lp.pop(0) if min(wl["k"], cores) > 1 else None
    if min(rows, wl["m"]) > 1:
        ri = lp[0]
        if rk is not None:
            sch.reorder(ri, rk)
    else:
        ri = sch.add_unit_loop(rk if rk is not None else lp[0] if lp else mm)
    for b in tail:
        sch.reverse_compute_at(b, ri)
    sch.reverse_compute_at(o, io)
    sch.annotate(ri, OP, "mk_red")
    sch.annotate(ri, "opc.dsp.parts", cores)
    for blk_rv, depth in ((o, 2), (r, 2), (p, 3), (a, 3)):
        sch.annotate(copy_loop(sch, blk_rv, depth), OP, DMA)
    wl_ = copy_loop(sch, w, 3)
    sch.annotate(wl_, OP, DMA)
    sch.annotate(wl_, "opc.dsp.resident", 1)
    blk, _ = sch.split(ii, [None, pw])
    sch.annotate(blk, OP, MK)
    rfb = sch.get_sblock("matmul_rf")
    sch.decompose_reduction(rfb, sch.get_loops(rfb)[5])  # init outside the K-part predicate
    for b in epi:
        blk_rv = sch.get_sblock(b)
        for n in range(1, len(sch.get(blk_rv).reads)):
            c = sch.cache_read(blk_rv, n, SCOPE_AM)
            sch.compute_at(c, jo)
            sch.annotate(copy_loop(sch, c, 1), OP, DMA)
    return sch


def scheduled(tmpl, wl: Workload, target, config) -> Scheduled:
    """split=k's scheduled module (`lowering="ksplit"`: the backend's KsplitLowerer, which balances
    the K parts as c*K//P), framed as the other FC routes (transposed operands relaid by DMA,
    host work)."""
    m = machine(target)
    sp = tmpl.spec(wl, target)
    cf = DirectConfig.of(config)
    op = get_op(wl.op)
    names, ddr, pre, post, out_shape = tmpl.tensors(wl, sp)
    args = {0: names["data"], 1: names["weight"], -1: names["out"]}
    if "bias" in sp.epi:
        args[2] = names["bias"]
    parts = [(c + 1) * sp.c // m.cores - c * sp.c // m.cores for c in range(m.cores)]  # each core's K part
    knobs = (m.lanes, m.cores, cf.rows, cf.kv, cf.pw)
    return Scheduled(
        "ksplit", key=("ksplit", wl) + knobs, module=lambda: ksplit_schedule(wl, *knobs).mod,
        params={"inputs": tuple((n, tuple(s)) for n, s, _ in op.inputs(wl)), "ddr": ddr, "out_shape": out_shape,
                "args": args, "pre": tuple(pre), "post": tuple(post), "kv": cf.kv, "k": wl["k"],
                "group_keys": tuple((c, parts[c]) for c in range(m.cores)), "cores_used": sum(1 for n in parts if n)},
        flops=op.flops(wl),
        info={"layout_change": "none" if not pre else "transposes by DMA (counted)",
              "reduction": f"split over {m.cores} cores, partials reduced through GSM", "lowering": "tir"})
