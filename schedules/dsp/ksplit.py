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
the epilogue in registers (`ksplit_schedule`); the parts are balanced as c*K//P (`balance_parts`),
and the backend's `tir_ksplit.KsplitLowerer` lowers it.
"""
from __future__ import annotations

from functools import lru_cache

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Program
from opcompiler.backend.dsp.tir_ksplit import KsplitLowerer
from opcompiler.backend.dsp.tir_lower import lowered
from opcompiler.ops import get_op
from opcompiler.workload import Workload

from .common import copy_loop, matmul_schedule
from .direct import ConvSpec, DirectConfig


def footprint_k(m: DspMachine, sp: ConvSpec, cf: DirectConfig) -> dict[str, int]:
    kbp = cf.kv * m.lanes
    chunk = -(-sp.c // m.cores)
    am = (chunk * kbp + cf.rows * kbp + m.cores * cf.rows * kbp + cf.rows * kbp + kbp) * F32
    return {"AM": am, "SM": cf.rows * chunk * F32, "GSM": m.cores * cf.rows * kbp * F32,
            "REG": cf.pw * cf.kv + cf.kv + cf.pw}


@lru_cache(maxsize=256)
def _lowered(wl: Workload, lanes: int, cores: int, rows: int, kv: int, pw: int):
    """The lowered TIR of one split=k config (the schedule depends on these knobs only)."""
    return balance_parts(lowered(ksplit_schedule(wl, lanes, cores, rows, kv, pw)), wl["k"], cores)


def balance_parts(func, k: int, cores: int):
    """The index map of the K parts: part c covers [c*K//P, (c+1)*K//P) (sizes differ by one at
    most, as the FC libraries split a reduction) instead of TVM's split into parts of ceil(K/P)
    with the last one short or empty. Applied to the lowered function: every `kc * ceil(K/P)`
    (the first element of part kc) becomes `kc*K // P`, and every bound `... < K` of an index
    in part kc becomes `... < (kc+1)*K // P`. The buffers of a part keep their ceil(K/P) rows."""
    import tvm_ffi
    from tvm import tirx

    q = -(-k // cores)
    if q * cores == k or q == 1:
        return func  # equal parts already, or parts of one element (the same sizes as TVM's split)
    kc = _cores_var(func.body)

    def mentions(e) -> bool:
        found = []
        tvm_ffi.structural_map(e, (tirx.Var, lambda v: found.append(v.same_as(kc)) or v))
        return any(found)

    def start(e):
        if isinstance(e.b, tirx.IntImm) and int(e.b.value) == q and e.a.same_as(kc):
            dt = "int32"
            return tirx.FloorDiv(tirx.Mul(kc, tirx.const(k, dt)), tirx.const(cores, dt))
        return e

    def bound(e):
        if isinstance(e.b, tirx.IntImm) and int(e.b.value) == k and mentions(e.a):
            dt = "int32"
            nxt = tirx.FloorDiv(tirx.Mul(tirx.Add(kc, tirx.const(1, dt)), tirx.const(k, dt)), tirx.const(cores, dt))
            return tirx.LT(e.a, nxt)
        return e
    return tvm_ffi.structural_map(func, [(tirx.Mul, start), (tirx.LT, bound)])


def _cores_var(st):
    """The loop variable of the loop over the K parts (annotated opc.dsp.cores)."""
    name = type(st).__name__
    if name == "For":
        if "opc.dsp.cores" in st.annotations:
            return st.loop_var
        return _cores_var(st.body)
    if name == "SBlockRealize":
        return _cores_var(st.block.body)
    if name == "SeqStmt":
        for x in st.seq:
            v = _cores_var(x)
            if v is not None:
                return v
    return None


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
    o = sch.cache_write(last, 0, "local.AM")
    _, _, k = sch.get_loops(mm)
    kc, _ = sch.split(k, [cores, None])
    rf = sch.rfactor(kc, 0)
    sch.set_scope(rf, 0, "local.GSM")
    i, j, kc, kk = sch.get_loops(rf)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, kv * lanes])
    sch.reorder(jo, io, kc, ii, ji, kk)
    sch.annotate(kc, "opc.dsp.cores", 1)
    sch.annotate(io, "opc.dsp.rr", 1)
    p = sch.cache_write(rf, 0, "local.AM")
    reg = sch.cache_write(rf, 0, "local.REG")
    sch.reverse_compute_at(reg, ii)
    sch.reverse_compute_at(p, kc)
    w = sch.cache_read(rf, 1, "local.AM")
    a = sch.cache_read(rf, 0, "local.SM")
    sch.compute_at(w, kc)
    sch.compute_at(a, kc)
    mm = sch.get_sblock("matmul")
    if epi:
        for b in ["matmul"] + epi[:-1]:
            sch.set_scope(sch.get_sblock(b), 0, "local.REG")  # the sum and epilogue in registers
        tail = [sch.get_sblock(b) for b in epi]
    else:
        tail = [sch.cache_write(mm, 0, "local.REG")]  # the sum in registers, stored to the tile
    r = sch.cache_read(mm, 0, "local.AM")
    sch.reverse_compute_at(r, io)
    sch.reverse_compute_at(mm, io)
    # under io: the K parts, the rows, the features (TVM leaves out a loop of one iteration)
    lp = sch.get_loops(mm)[2:]
    rk = lp[0]
    if min(rows, wl["m"]) > 1:
        ri = lp[1]
        sch.reorder(ri, rk)
    else:
        ri = sch.add_unit_loop(rk)
    for b in tail:
        sch.reverse_compute_at(b, ri)
    sch.reverse_compute_at(o, io)
    sch.annotate(ri, "opc.dsp.op", "mk_red")
    sch.annotate(ri, "opc.dsp.parts", cores)
    for blk_rv, depth in ((o, 2), (r, 2), (p, 3), (a, 3)):
        sch.annotate(copy_loop(sch, blk_rv, depth), "opc.dsp.op", "dma")
    wl_ = copy_loop(sch, w, 3)
    sch.annotate(wl_, "opc.dsp.op", "dma")
    sch.annotate(wl_, "opc.dsp.resident", 1)
    blk, _ = sch.split(ii, [None, pw])
    sch.annotate(blk, "opc.dsp.op", "mk")
    rfb = sch.get_sblock("matmul_rf")
    sch.decompose_reduction(rfb, sch.get_loops(rfb)[5])  # init outside the K-part predicate
    for b in epi:
        blk_rv = sch.get_sblock(b)
        for n in range(1, len(sch.get(blk_rv).reads)):
            c = sch.cache_read(blk_rv, n, "local.AM")
            sch.compute_at(c, jo)
            sch.annotate(copy_loop(sch, c, 1), "opc.dsp.op", "dma")
    return sch


def build_program(tmpl, wl: Workload, target, config, functional: bool, tamper=None) -> Program:
    """The cluster program of split=k: per-core ops lowered from the rfactored TIR by the backend's
    `KsplitLowerer`, framed as the other FC routes (transposed operands relaid by DMA, host work)."""
    m = machine(target)
    sp = tmpl.spec(wl, target)
    cf = DirectConfig.of(config)
    op = get_op(wl.op)
    in_specs = op.inputs(wl)
    names, ddr, pre, post, out_shape = tmpl.tensors(wl, sp)
    func = _lowered(wl, m.lanes, m.cores, cf.rows, cf.kv, cf.pw)
    params = [p.name for p in func.params]
    ddr_names = {params[0]: names["data"], params[1]: names["weight"], params[-1]: names["out"]}
    if "bias" in sp.epi:
        ddr_names[params[2]] = names["bias"]
    low = KsplitLowerer(m, func, ddr_names, ddr, cf.kv, functional, tamper)
    hpre, hpost = host_ops(m, [(n, nbytes(s)) for n, s, _ in in_specs], [("out", nbytes(out_shape))], [])
    parts = [(c + 1) * sp.c // m.cores - c * sp.c // m.cores for c in range(m.cores)]  # each core's K part
    prog = assemble(m, functional=functional, cores=m.cores, core_ops=lambda c: low.core_ops(c, m.cores),
                    group_key=lambda c: (c, parts[c]), pre=pre, post=post, host_pre=hpre, host_post=hpost,
                    ddr_tensors=ddr, inputs=[n for n, _, _ in in_specs], output="out", out_shape=out_shape,
                    flops=op.flops(wl), cores_used=sum(1 for n in parts if n))
    prog.info = {"layout_change": "none" if not pre else "transposes by DMA (counted)",
                 "reduction": f"split over {m.cores} cores, partials reduced through GSM", "lowering": "tir"}
    return prog
