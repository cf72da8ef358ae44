"""The blocked GEMM of the dsp matmul template (`algo=gemm`): C[M, N] = A[M, K] @ B[K, N] (+ bias,
ReLU) blocked for GSM, SM and AM the way the FT-M7032 GEMM libraries do, with the VPU pass
spelled out as vector instructions (the dsp backend's `vector.py`).

* **C blocks** of `mb` x `nb` live in a core's AM for the whole reduction (accumulated there
  across K blocks) and leave AM -> DDR row stage by row stage after the last K block. The blocks
  are dealt to the cores in rounds of `cores` consecutive blocks (M blocks inner), so the cores
  of a round mostly share their N block.
* **B blocks** (`kc` x `nb`): with `w_path=gsm` each K block of the round's B panels is brought
  DDR -> GSM once for the cluster (every core DMAs a slice of its rows; a barrier publishes it)
  and each core copies the block it needs GSM -> AM; with `w_path=ddr` every core DMAs its own
  B block DDR -> AM. With `dbuf` the next K block is fetched while this one is computed (two
  AM buffers; the GSM buffers are always two, the slice for K block t+2 being written during
  K block t).
* **A stages** (`rows` x `kc`) go DDR -> SM (strided: one run per row), two SM buffers with
  `dbuf`; the A elements are broadcast to the lanes by scalar loads.
* **Micro-kernel**: register blocks of `pw` rows of C x `kv` vectors of 32 columns. The block's
  accumulators are loaded from the AM C tile (set to zero in the first K block), then for each
  of the `kc` reduction steps: `kv` vector loads of B from AM, `pw` scalar loads of A from SM,
  `pw x kv` FMAs (3 FMACs, 6-cycle latency: pw x kv >= 18 independent chains keep them busy),
  then the accumulators are stored back (after the bias add / ReLU in the last K block).

The template is a TVM schedule of the op's own compute (`gemm_schedule`): the C blocks, K
blocks, A stages and register blocks are splits of its loops, the tiles are `cache_read` /
`cache_write` stages in `local.GSM` / `local.AM` / `local.SM`, and the loops carry `opc.dsp.*`
annotations; `scheduled` hands it to the backend, whose `tir_gemm.GemmLowerer` lowers it (copies to DMA descriptors, the
register-block nest to vector instructions, the software pipeline above). Edges (M, N, K not
multiples of the blocks) are the block predicates: smaller register blocks and shorter loops;
lanes beyond N compute on whatever the AM tile holds and are never stored. Functional mode
executes every instruction on the simulated memories; timing list-schedules the same streams
and runs the DMA program on the shared channels (`engine.timing`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import DMA, F32, MK_GEMM, OP, SCOPE_AM, SCOPE_GSM, SCOPE_SM, STAGE, DspMachine
from opcompiler.ops import get_op
from opcompiler.template_base import Scheduled
from opcompiler.workload import Workload

from .common import capacity_why, matmul_schedule
from .stream import cdiv

KC = (32, 64, 96, 128, 192, 256)
MB = (32, 64, 96, 128, 192, 256, 384, 512)
NB = (64, 96, 128, 192, 256, 384, 512, 768, 1024)
MAX_PASSES = 16_384  # VPU passes per core a program may hold (keeps building a timing program cheap)


@dataclass(frozen=True)
class GemmGeo:
    """Block sizes of one config on one workload (clipped to the problem)."""

    M: int
    K: int
    N: int
    L: int  # lanes
    pw: int
    kv: int
    ms: int  # A rows per SM stage
    kc: int
    mb: int
    nb: int
    nbp: int  # AM row pitch of the B and C tiles (nb rounded up to whole vectors)
    dbuf: int
    w_path: str
    epi: tuple[str, ...]
    batch: int = 1  # batch_matmul: GEMMs of M x K x N, one after another
    shared_b: bool = True  # every batch reads the same B (False: each batch its own B panels)

    @staticmethod
    def of(m: DspMachine, M: int, K: int, N: int, cfg: Mapping[str, Any], epi: tuple[str, ...], batch: int = 1,
           shared_b: bool = True) -> "GemmGeo":
        L = m.lanes
        mb = min(int(cfg["mb"]), M)
        nb = min(int(cfg["nb"]), cdiv(N, L) * L)
        return GemmGeo(M=M, K=K, N=N, L=L, pw=int(cfg["pw"]), kv=int(cfg["kv"]), ms=min(int(cfg["rows"]), mb),
                       kc=min(int(cfg["kc"]), K), mb=mb, nb=nb, nbp=cdiv(nb, L) * L, dbuf=int(cfg["dbuf"]),
                       w_path=str(cfg["w_path"]), epi=epi, batch=batch, shared_b=shared_b)

    @property
    def bias(self) -> bool:
        return "bias" in self.epi

    def footprint(self, cores: int) -> dict[str, int]:
        nbuf = 1 + self.dbuf
        am = (self.mb * self.nbp + nbuf * self.kc * self.nbp + (self.nbp if self.bias else 0)) * F32
        sm = nbuf * self.ms * self.kc * F32
        gsm = 2 * self.panels(cores) * self.kc * self.nbp * F32 if self.w_path == "gsm" else 0
        regs = self.pw * self.kv + self.pw + self.kv + (self.kv if self.bias else 0)
        return {"AM": am, "SM": sm, "GSM": gsm, "REG": regs}

    def blocks(self) -> list[tuple[int, int, int, int]]:
        """C blocks (m0, rows, n0, cols), M blocks inner (batches outermost)."""
        return [(m0, min(self.mb, self.M - m0), n0, min(self.nb, self.N - n0))
                for n0 in range(0, self.N, self.nb) for m0 in range(0, self.M, self.mb)] * self.batch

    def panels(self, cores: int) -> int:
        """The most distinct B panels (N blocks; of each batch unless B is shared) one round of
        `cores` consecutive blocks touches."""
        bl = self.blocks()
        per = len(bl) // self.batch
        key = (lambda i: bl[i][2]) if self.shared_b else (lambda i: (i // per, bl[i][2]))
        return max((len({key(j) for j in range(i, min(i + cores, len(bl)))}) for i in range(0, len(bl), cores)),
                   default=1)


def check_gemm(m: DspMachine, g: GemmGeo, cfg: Mapping[str, Any]) -> str | None:
    if cfg["split"] != "items" or cfg["out_path"] != "ddr":
        return "algo=gemm deals C blocks to the cores and stores C from AM: use split=items, out_path=ddr"
    if g.w_path not in ("gsm", "ddr"):
        return "algo=gemm brings B blocks through GSM or from DDR: use w_path=gsm or ddr"
    if g.ms % g.pw and g.ms < g.mb:
        return f"rows={g.ms} is not a whole number of {g.pw}-row register blocks (pw)"
    passes = cdiv(len(g.blocks()), m.cores) * cdiv(g.K, g.kc) * cdiv(g.mb, g.ms)
    if passes > MAX_PASSES:
        return (f"{passes} VPU passes per core (rounds x K blocks x A stages) > {MAX_PASSES}: "
                "use larger rows, kc or C blocks")
    return capacity_why(m, g.footprint(m.cores))


def gemm_features(m: DspMachine, g: GemmGeo) -> dict[str, float]:
    blocks = g.blocks()
    nk = cdiv(g.K, g.kc)
    rounds = cdiv(len(blocks), m.cores)
    a = sum(r for _, r, _, _ in blocks) * g.K
    b = (rounds * g.panels(m.cores) if g.w_path == "gsm" else len(blocks)) * g.K * g.nb
    ddr = (a + b + g.batch * g.M * g.N) * F32
    fp = g.footprint(m.cores)
    chains = g.pw * g.kv
    return {"ddr_bytes": float(ddr), "arith_intensity": 2.0 * g.batch * g.M * g.N * g.K / ddr,
            "am_occupancy": fp["AM"] / m.cap("AM"), "sm_occupancy": fp["SM"] / m.cap("SM"),
            "gsm_occupancy": fp["GSM"] / m.cap("GSM"), "reg_occupancy": fp["REG"] / m.registers,
            "fma_chains": float(chains), "fmac_latency_cover": min(1.0, chains / (m.fmac_units * m.fmac_latency)),
            "stages": float(len(blocks) * nk * cdiv(g.mb, g.ms)),
            "work_per_core": len(blocks) / min(m.cores, len(blocks)),
            "barriers": float(rounds * nk if g.w_path == "gsm" else 0), "kc": float(g.kc)}


def gemm_schedule(wl: Workload, g: GemmGeo):
    """The blocked GEMM as a TVM schedule of the op's own compute (see the module docstring)::

        blocks (N blocks outer, M blocks inner, batches outermost; opc.dsp.blocks): the C tile in local.AM
          [bias -> local.AM]
          ko (K blocks of kc; opc.dsp.kblock): B block -> [local.GSM ->] local.AM
            stages of `rows` rows (opc.dsp.stage): A rows -> local.SM
              register blocks of pw rows (opc.dsp.op = mk_gemm)
                vb (kv*32 columns), ki (steps), pr (rows), vl (lanes): C += A * B
          bias, ReLU over the tile (fused into the last K block by the lowering)
          output tile local.AM -> DDR
    """
    sch, epi, mm, last = matmul_schedule(wl)
    *batch, i, j, k = sch.get_loops(mm)  # batch_matmul: the batch, outermost in the blocks
    io, ii = sch.split(i, [None, g.mb])
    jo, ji = sch.split(j, [None, g.nb])
    ko, ki = sch.split(k, [None, g.kc])
    sch.reorder(*batch, jo, io, ko, ii, ji, ki)
    blk = sch.fuse(*batch, jo, io)
    st, ip = sch.split(ii, [None, g.ms])
    rb, pr = sch.split(ip, [None, g.pw])
    vb, vl = sch.split(ji, [None, g.kv * g.L])
    sch.reorder(rb, vb, ki, pr, vl)
    sch.annotate(blk, "opc.dsp.blocks", 1)
    sch.annotate(blk, "opc.dsp.tiles", {"acc": [g.mb, g.nbp], "b": [g.kc, g.nbp], "a": [g.ms, g.kc], "bias": [g.nbp]})
    sch.annotate(ko, "opc.dsp.kblock", 1)
    sch.annotate(st, STAGE, 1)
    sch.annotate(rb, OP, MK_GEMM)
    for lp, ax in ((vb, "vb"), (ki, "ki"), (pr, "pr"), (vl, "vl")):
        sch.annotate(lp, "opc.dsp.ax", ax)
    if epi:  # the sum and the epilogue's tiles in AM (the lowering keeps them in the C tile)
        for b in ["matmul"] + epi[:-1]:
            sch.set_scope(sch.get_sblock(b), 0, SCOPE_AM)
        for b in epi:
            sch.reverse_compute_at(sch.get_sblock(b), blk)
    out = sch.cache_write(last, 0, SCOPE_AM)
    sch.reverse_compute_at(out, blk)
    copies = [(out, 1)]  # (copy block, depth of its outermost loop)
    b_am = sch.cache_read(mm, 1, SCOPE_AM)
    sch.compute_at(b_am, ko)
    copies.append((b_am, 2))
    if g.w_path == "gsm":
        b_gsm = sch.cache_read(b_am, 0, SCOPE_GSM)
        sch.compute_at(b_gsm, ko)
        copies.append((b_gsm, 2))
    a_sm = sch.cache_read(mm, 0, SCOPE_SM)
    sch.compute_at(a_sm, st)
    copies.append((a_sm, 3))
    if "bias" in g.epi:
        bias = sch.cache_read(sch.get_sblock("matmul_bias"), 1, SCOPE_AM)
        sch.compute_at(bias, blk)
        copies.append((bias, 1))
    for c, depth in copies:
        lps = sch.get_loops(c)
        sch.annotate(lps[depth] if len(lps) > depth else sch.add_unit_loop(c), OP, DMA)
    return sch


def scheduled(m: DspMachine, wl: Workload, g: GemmGeo, names: dict[str, str], ddr: dict, pre: list[tuple],
              out_shape: tuple, info: dict) -> Scheduled:
    """The blocked GEMM's scheduled module (`lowering="gemm"`: the backend's GemmLowerer deals the
    C blocks to the cores and pipelines the K blocks), framed as the other matmul routes
    (transposed operands relaid by DMA, host work). The module does not depend on `dbuf` (double
    buffering is the lowering's): it is built with dbuf=0, once for both."""
    op = get_op(wl.op)
    g0 = dataclasses.replace(g, dbuf=0)
    args = {0: names["data"], 1: names["weight"], -1: names["out"]}
    if g.bias:
        args[2] = names["bias"]
    return Scheduled(
        "gemm", key=("gemm", wl, g0), module=lambda: gemm_schedule(wl, g0).mod,
        params={"inputs": tuple((n, tuple(s)) for n, s, _ in op.inputs(wl)), "ddr": ddr, "out_shape": out_shape,
                "args": args, "pre": tuple(pre), "post": (), "dbuf": bool(g.dbuf),
                "cores_used": min(m.cores, len(g.blocks()))},
        flops=op.flops(wl), info=info)
