"""Fully connected layers with the reduction split across the cores (`split="k"`), the partial
sums reduced through GSM -- for the small-M layers (MiniGo's FC runs on one sample at a time,
input (1, 722)) where splitting the rows leaves seven of eight cores idle.

Per block of rows and of output features: every core multiplies its slice of the reduction
(DDR -> SM input columns, DDR -> AM weight rows, register blocks as in `direct.py`, no
epilogue), DMAs its partial tile AM -> GSM; a barrier; one core (round robin) DMAs the P
partial tiles GSM -> AM, adds them on the VPU, applies bias/ReLU and DMAs the result to DDR;
a barrier frees the GSM slots.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from opcompiler.backend.dsp.core import EPI_REGS, mk_ew
from opcompiler.backend.dsp.machine import DspMachine
from opcompiler.backend.dsp.program import F32, Allocator, Op, View, dma_op

from .direct import ConvSpec, DirectConfig, _Lowering


def chunks(sp: ConvSpec, cores: int) -> list[tuple[int, int]]:
    return [(c * sp.c // cores, (c + 1) * sp.c // cores) for c in range(cores)]


def footprint_k(m: DspMachine, sp: ConvSpec, cf: DirectConfig) -> dict[str, int]:
    kbp = cf.kv * m.lanes
    chunk = -(-sp.c // m.cores)
    am = (chunk * kbp + cf.rows * kbp + m.cores * cf.rows * kbp + cf.rows * kbp + kbp) * F32
    return {"AM": am, "SM": cf.rows * chunk * F32, "GSM": m.cores * cf.rows * kbp * F32,
            "REG": cf.pw * cf.kv + cf.kv + cf.pw}


def core_ops(m: DspMachine, sp: ConvSpec, cf: DirectConfig, names: dict[str, str], core: int, functional: bool,
             gsm_base: int, stage_cache: dict) -> list[Op]:
    """The op list of one core (every core takes part in every block)."""
    kbp = cf.kv * m.lanes
    c0, c1 = chunks(sp, m.cores)[core]
    part = dataclasses.replace(sp, c=c1 - c0, epi=())
    low = _Lowering(m, part, cf, {}, functional)
    am, smem = Allocator("AM", m.cap("AM"), 128), Allocator("SM", m.cap("SM"), 8)
    w_am = am.alloc("weight slice", part.c * kbp)
    p_am = am.alloc("partial tile", cf.rows * kbp)
    r_am = am.alloc("partials to reduce", m.cores * cf.rows * kbp)
    o_am = am.alloc("output tile", cf.rows * kbp)
    b_am = am.alloc("bias", kbp) if "bias" in sp.epi else 0
    x_sm = smem.alloc("input slice", cf.rows * part.c)
    ops: list[Op] = []
    nk = -(-sp.k // kbp)
    blk = 0
    for kb in range(nk):
        k0 = kb * kbp
        ke = min(kbp, sp.k - k0)
        if part.c:
            ops.append(dma_op(m, View(("DDR", names["weight"]), c0 * sp.k + k0, (part.c, ke), (sp.k, 1)),
                              View(("AM",), w_am, (part.c, ke), (kbp, 1)), (), ("w",), functional, "W slice DDR->AM"))
        if "bias" in sp.epi:
            ops.append(dma_op(m, View(("DDR", names["bias"]), k0, (ke,), (1,)), View(("AM",), b_am, (ke,), (1,)), (),
                              ("w",), functional, "bias -> AM"))
        for r0 in range(0, sp.h, cf.rows):
            nr = min(cf.rows, sp.h - r0)
            g_mine = View(("GSM",), gsm_base + core * cf.rows * kbp, (nr, ke), (kbp, 1))
            if part.c:
                ops.append(dma_op(m, View(("DDR", names["data"]), r0 * sp.c + c0, (nr, part.c), (sp.c, 1)),
                                  View(("SM",), x_sm, (nr, part.c), (part.c, 1)), (), ("sm0",), functional,
                                  "I slice DDR->SM"))
                key = ("pass", nr)
                if key not in stage_cache:
                    from .direct import pass_cost
                    stage_cache[key] = pass_cost(m, part, cf, nr)
                cost, calls = stage_cache[key]
                fn = low._compute_fn(x_sm, w_am, {}, p_am, nr, 1, 1) if functional else None
                ops.append(Op("vpu", "vpu", cycles=cost.cycles, reads=("sm0", "w"), writes=("p",), cost=cost,
                              nruns=calls, fn=fn, label="partial product"))
                ops.append(dma_op(m, View(("AM",), p_am, (nr, ke), (kbp, 1)), g_mine, ("p",), ("g",), functional,
                                  "partial AM->GSM"))
            else:  # more cores than reduction elements: this core contributes zeros
                zf = (lambda mem, v=g_mine: mem.view(v).fill(0.0)) if functional else None
                ops.append(Op("fill", "vpu", cycles=-(-nr * ke // m.lanes), writes=("g",), fn=zf, label="zero partial"))
            ops.append(Op("barrier", "sync", label="partials in GSM"))
            if blk % m.cores == core:
                ops += _reduce(m, sp, cf, names, functional, gsm_base, r_am, o_am, b_am, r0, nr, k0, ke, stage_cache)
            ops.append(Op("barrier", "sync", label="GSM partials consumed"))
            blk += 1
    return ops


def _reduce(m, sp, cf, names, functional, gsm_base, r_am, o_am, b_am, r0, nr, k0, ke, stage_cache) -> list[Op]:
    kbp = cf.kv * m.lanes
    P = m.cores
    src = View(("GSM",), gsm_base, (P, nr, ke), (cf.rows * kbp, kbp, 1))
    dst = View(("AM",), r_am, (P, nr, ke), (cf.rows * kbp, kbp, 1))
    ops = [dma_op(m, src, dst, ("g",), ("r",), functional, "partials GSM->AM")]
    key = ("reduce", nr)
    if key not in stage_cache:
        fm = (P - 1) + ("bias" in sp.epi)
        stage_cache[key] = mk_ew(m, nr * cf.kv, P, fm, int("relu" in sp.epi), sum(EPI_REGS[e] for e in sp.epi))
    cost = stage_cache[key]
    fn = None
    if functional:
        epi = sp.epi

        def fn(mem) -> None:
            acc = mem.view(View(("AM",), r_am, (P, nr, ke), (cf.rows * kbp, kbp, 1))).sum(axis=0, dtype=np.float32)
            if "bias" in epi:
                acc += mem.view(View(("AM",), b_am, (ke,), (1,)))
            if "relu" in epi:
                np.maximum(acc, 0, out=acc)
            mem.view(View(("AM",), o_am, (nr, ke), (kbp, 1)))[...] = acc
    ops.append(Op("vpu", "vpu", cycles=cost.cycles, reads=("r", "w"), writes=("o",), cost=cost, nruns=1, fn=fn,
                  label="reduce partials"))
    ops.append(dma_op(m, View(("AM",), o_am, (nr, ke), (kbp, 1)),
                      View(("DDR", names["out"]), r0 * sp.k + k0, (nr, ke), (sp.k, 1)), ("o",), ("out",), functional,
                      "O AM->DDR"))
    return ops
