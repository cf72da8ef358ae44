"""The blocked GEMM of the dsp matmul template (`algo=gemm`): C[M, N] = A[M, K] @ B[K, N] (+ bias,
ReLU) blocked for GSM, SM and AM the way the FT-M7032 GEMM libraries do, with the VPU pass
spelled out as vector instructions (`opcompiler.backend.dsp.vector`).

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

Edges (M, N, K not multiples of the blocks) run smaller register blocks and shorter loops; lanes
beyond N compute on whatever the AM tile holds and are never stored. Functional mode executes
every instruction on the simulated memories; timing list-schedules the same streams and runs
the DMA program on the shared channels (`engine.timing`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from opcompiler.backend.dsp.machine import DspMachine
from opcompiler.backend.dsp.program import F32, Allocator, Op, View, compress, dma_op
from opcompiler.backend.dsp.vector import VI, Mem, Nest, VKernel

from .stream import cdiv, vpu_op

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

    @staticmethod
    def of(m: DspMachine, M: int, K: int, N: int, cfg: Mapping[str, Any], epi: tuple[str, ...]) -> "GemmGeo":
        L = m.lanes
        mb = min(int(cfg["mb"]), M)
        nb = min(int(cfg["nb"]), cdiv(N, L) * L)
        return GemmGeo(M=M, K=K, N=N, L=L, pw=int(cfg["pw"]), kv=int(cfg["kv"]), ms=min(int(cfg["rows"]), mb),
                       kc=min(int(cfg["kc"]), K), mb=mb, nb=nb, nbp=cdiv(nb, L) * L, dbuf=int(cfg["dbuf"]),
                       w_path=str(cfg["w_path"]), epi=epi)

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
        """C blocks (m0, rows, n0, cols), M blocks inner."""
        return [(m0, min(self.mb, self.M - m0), n0, min(self.nb, self.N - n0))
                for n0 in range(0, self.N, self.nb) for m0 in range(0, self.M, self.mb)]

    def panels(self, cores: int) -> int:
        """The most distinct N blocks (B panels) one round of `cores` consecutive blocks touches."""
        bl = self.blocks()
        return max((len({b[2] for b in bl[i:i + cores]}) for i in range(0, len(bl), cores)), default=1)


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
    fp = g.footprint(m.cores)
    for lv in ("AM", "SM", "GSM"):
        if fp[lv] > m.cap(lv):
            return f"{lv} needs {fp[lv]} B > {m.cap(lv)} B"
    if fp["REG"] > m.registers:
        return f"register block needs {fp['REG']} vector registers > {m.registers}"
    return None


def gemm_features(m: DspMachine, g: GemmGeo) -> dict[str, float]:
    blocks = g.blocks()
    nk = cdiv(g.K, g.kc)
    rounds = cdiv(len(blocks), m.cores)
    a = sum(r for _, r, _, _ in blocks) * g.K
    b = (rounds * g.panels(m.cores) if g.w_path == "gsm" else len(blocks)) * g.K * g.nb
    ddr = (a + b + g.M * g.N) * F32
    fp = g.footprint(m.cores)
    chains = g.pw * g.kv
    return {"ddr_bytes": float(ddr), "arith_intensity": 2.0 * g.M * g.N * g.K / ddr,
            "am_occupancy": fp["AM"] / m.cap("AM"), "sm_occupancy": fp["SM"] / m.cap("SM"),
            "gsm_occupancy": fp["GSM"] / m.cap("GSM"), "reg_occupancy": fp["REG"] / m.registers,
            "fma_chains": float(chains), "fmac_latency_cover": min(1.0, chains / (m.fmac_units * m.fmac_latency)),
            "stages": float(len(blocks) * nk * cdiv(g.mb, g.ms)),
            "work_per_core": len(blocks) / min(m.cores, len(blocks)),
            "barriers": float(rounds * nk if g.w_path == "gsm" else 0), "kc": float(g.kc)}


def _nests(g: GemmGeo, a0: int, b0: int, c0: int, rows: int, cols: int, kcv: int, first: bool, last: bool,
           bias0: int) -> tuple[Nest, ...]:
    """The register-blocked pass over `rows` x `cols` of the C tile (A stage at SM a0, pitch kc;
    B tile at AM b0; C at AM c0; pitch nbp) for `kcv` reduction steps."""
    L, kcp, nbp = g.L, g.kc, g.nbp
    nvec = cdiv(cols, L)
    out = []
    rfull, rtail = divmod(rows, g.pw)
    cfull, ctail = divmod(nvec, g.kv)
    for nr, pw, r0 in ((rfull, g.pw, 0), (1 if rtail else 0, rtail, rfull * g.pw)):
        for nc, kv, v0 in ((cfull, g.kv, 0), (1 if ctail else 0, ctail, cfull * g.kv)):
            if not (nr and nc and pw and kv):
                continue
            acc = [[f"c{p}_{v}" for v in range(kv)] for p in range(pw)]
            cmem = [[Mem("AM", c0 + (r0 + p) * nbp + (v0 + v) * L, (pw * nbp, kv * L, 0)) for v in range(kv)]
                    for p in range(pw)]
            pre = tuple(VI("vmov", acc[p][v], (0.0,)) if first else VI("vld", acc[p][v], (cmem[p][v],))
                        for p in range(pw) for v in range(kv))
            body = tuple(VI("vld", f"b{v}", (Mem("AM", b0 + (v0 + v) * L, (0, kv * L, nbp)),)) for v in range(kv))
            body += tuple(VI("sld", f"a{p}", (Mem("SM", a0 + (r0 + p) * kcp, (pw * kcp, 0, 1), 0),)) for p in range(pw))
            body += tuple(VI("vfma", acc[p][v], (f"a{p}", f"b{v}", acc[p][v])) for p in range(pw) for v in range(kv))
            post: tuple = ()
            if last and g.bias:
                post += tuple(VI("vld", f"bias{v}", (Mem("AM", bias0 + (v0 + v) * L, (0, kv * L, 0)),))
                              for v in range(kv))
                post += tuple(VI("vadd", acc[p][v], (acc[p][v], f"bias{v}")) for p in range(pw) for v in range(kv))
            if last and "relu" in g.epi:
                post += tuple(VI("vmax", acc[p][v], (acc[p][v], 0.0)) for p in range(pw) for v in range(kv))
            post += tuple(VI("vst", cmem[p][v], (acc[p][v],)) for p in range(pw) for v in range(kv))
            out.append(Nest(outer=(nr, nc), inner=(kcv,), pre=pre, body=body, post=post, contract=True))
    return tuple(out)


class GemmLowering:
    """Builds every core's op list for `algo=gemm`."""

    def __init__(self, m: DspMachine, g: GemmGeo, names: dict[str, str], functional: bool):
        self.m, self.g, self.names, self.fn = m, g, names, functional
        self.cache: dict[tuple, Any] = {}  # timing mode: ops of the same kind share Op objects
        blocks = g.blocks()
        self.rounds = [blocks[i:i + m.cores] for i in range(0, len(blocks), m.cores)]
        self.nk = cdiv(g.K, g.kc)

    # -- one op, shared between identical uses in timing mode -----------------------------

    def _op(self, key: tuple, make) -> Op:
        if self.fn:
            return make()
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def group_key(self, core: int) -> tuple:
        """What a core's timing depends on: its blocks' shapes round by round and its slices of
        the B blocks it brings into GSM."""
        kks = {self.g.kc, self.g.K - (self.nk - 1) * self.g.kc}
        m = self.m
        return (tuple((r[core][1], r[core][3]) if core < len(r) else None for r in self.rounds),
                tuple((core + 1) * kk // m.cores - core * kk // m.cores for kk in sorted(kks)))

    def core_ops(self, core: int) -> list:
        m, g = self.m, self.g
        am, smem = Allocator("AM", m.cap("AM"), 128), Allocator("SM", m.cap("SM"), 8)
        nbuf = 1 + g.dbuf
        c_am = am.alloc("C tile", g.mb * g.nbp)
        b_am = [am.alloc(f"B tile[{i}]", g.kc * g.nbp) for i in range(nbuf)]
        bias_am = am.alloc("bias", g.nbp) if g.bias else 0
        a_sm = [smem.alloc(f"A stage[{i}]", g.ms * g.kc) for i in range(nbuf)]
        panels = g.panels(m.cores)
        gsm = Allocator("GSM", m.cap("GSM"), 64)
        g_b = [[gsm.alloc(f"B panel {p} [{i}]", g.kc * g.nbp) for p in range(panels)] for i in range(2)] \
            if g.w_path == "gsm" else []
        # the K blocks of every round this core takes part in, in order
        steps: list[tuple[int, int]] = [(r, t) for r in range(len(self.rounds)) for t in range(self.nk)]
        blocks: list[tuple] = []  # the prologue, then per K step: its ops

        def mine(r: int):
            rnd = self.rounds[r]
            return rnd[core] if core < len(rnd) else None

        def panel_of(r: int, n0: int) -> int:
            return sorted({b[2] for b in self.rounds[r]}).index(n0)

        def a_stages(r: int, t: int) -> list[tuple[int, int]]:
            blk = mine(r)
            if blk is None:
                return []
            return [(s0, min(g.ms, blk[1] - s0)) for s0 in range(0, blk[1], g.ms)]

        def kcv(t: int) -> int:
            return min(g.kc, g.K - t * g.kc)

        # -- DMA ops -------------------------------------------------------------------
        def a_dma(r: int, t: int, s0: int, ns: int, slot: int) -> Op:
            m0 = mine(r)[0]
            kk = kcv(t)
            return self._op(("a", slot, ns, kk), lambda: dma_op(
                m, View(("DDR", self.names["data"]), (m0 + s0) * g.K + t * g.kc, (ns, kk), (g.K, 1)),
                View(("SM",), a_sm[slot], (ns, kk), (g.kc, 1)), (), (f"a{slot}",), self.fn, "A stage DDR->SM"))

        def slice_rows(kk: int) -> tuple[int, int]:
            return core * kk // m.cores, (core + 1) * kk // m.cores

        def b_to_gsm(i: int) -> list[Op]:
            """This core's slice of K step i (round r, K block t) of every B panel of the round,
            DDR -> GSM (GSM buffer i % 2)."""
            if g.w_path != "gsm":
                return []
            r, t = steps[i]
            kk = kcv(t)
            lo, hi = slice_rows(kk)
            ops = []
            for p, n0 in enumerate(sorted({b[2] for b in self.rounds[r]})):
                nv = min(g.nb, g.N - n0)
                if hi > lo:
                    ops.append(self._op(("bg", i % 2, p, hi - lo, nv), lambda n0=n0, nv=nv, p=p: dma_op(
                        m, View(("DDR", self.names["weight"]), (t * g.kc + lo) * g.N + n0, (hi - lo, nv), (g.N, 1)),
                        View(("GSM",), g_b[i % 2][p] + lo * g.nbp, (hi - lo, nv), (g.nbp, 1)), (),
                        (f"g{i % 2}",), self.fn, "B slice DDR->GSM")))
            return ops

        def b_to_am(i: int) -> list[Op]:
            """K step i's B block for this core's C block -> AM buffer i % nbuf."""
            r, t = steps[i]
            blk = mine(r)
            if blk is None:
                return []
            kk, nv, slot = kcv(t), blk[3], i % nbuf
            if g.w_path == "gsm":
                p = panel_of(r, blk[2])
                return [self._op(("ba", slot, i % 2, p, kk, nv), lambda: dma_op(
                    m, View(("GSM",), g_b[i % 2][p], (kk, nv), (g.nbp, 1)),
                    View(("AM",), b_am[slot], (kk, nv), (g.nbp, 1)), (f"g{i % 2}",), (f"b{slot}",), self.fn,
                    "B block GSM->AM"))]
            n0 = blk[2]
            return [self._op(("bd", slot, kk, nv), lambda: dma_op(
                m, View(("DDR", self.names["weight"]), t * g.kc * g.N + n0, (kk, nv), (g.N, 1)),
                View(("AM",), b_am[slot], (kk, nv), (g.nbp, 1)), (), (f"b{slot}",), self.fn, "B block DDR->AM"))]

        def bias_dma(r: int) -> list[Op]:
            blk = mine(r)
            if not g.bias or blk is None:
                return []
            n0, nv = blk[2], blk[3]
            return [self._op(("bias", nv), lambda: dma_op(
                m, View(("DDR", self.names["bias"]), n0, (nv,), (1,)), View(("AM",), bias_am, (nv,), (1,)), (),
                ("bias",), self.fn, "bias -> AM"))]

        def c_out(r: int, s0: int, ns: int) -> Op:
            m0, _, n0, nv = mine(r)
            return self._op(("c", s0, ns, nv), lambda: dma_op(
                m, View(("AM",), c_am + s0 * g.nbp, (ns, nv), (g.nbp, 1)),
                View(("DDR", self.names["out"]), (m0 + s0) * g.N + n0, (ns, nv), (g.N, 1)),
                (f"c{s0}",), ("out",), self.fn, "C rows AM->DDR"))

        def vpu(i: int, s0: int, ns: int, slot: int) -> Op:
            r, t = steps[i]
            blk = mine(r)
            kk, first, last = kcv(t), t == 0, t == self.nk - 1
            bslot = i % nbuf
            reads = (f"a{slot}", f"b{bslot}") + (("bias",) if last and g.bias else ())

            def make():
                k = VKernel(_nests(g, a_sm[slot], b_am[bslot], c_am + s0 * g.nbp, ns, blk[3], kk, first, last, bias_am),
                            f"gemm {ns}x{blk[3]}x{kk}")
                return vpu_op(m, k, reads, (f"c{s0}",), self.fn, k.label)
            return self._op(("v", slot, bslot, s0, ns, blk[3], kk, first, last), make)

        # -- program order ---------------------------------------------------------------
        # prologue: K block 0 (and 1) of the first round into GSM, block 0 into AM, first A stage
        pending_a: list[tuple] = []  # A stages in issue order: (r, t, s0, ns)
        for r, t in steps:
            pending_a += [(r, t, s0, ns) for s0, ns in a_stages(r, t)]
        a_slot = {}
        for i, st in enumerate(pending_a):
            a_slot[st] = i % nbuf
        a_iter = iter(pending_a)
        nxt = [next(a_iter, None)]

        def issue_a() -> list[Op]:
            st = nxt[0]
            if st is None:
                return []
            nxt[0] = next(a_iter, None)
            return [a_dma(*st, a_slot[st])]

        gsm_mode = g.w_path == "gsm"
        n = len(steps)
        head: list[Op] = []
        if gsm_mode:
            head += b_to_gsm(0)
            head.append(Op("barrier", "sync", label="B K-block 0 in GSM"))
        head += bias_dma(steps[0][0]) + b_to_am(0)
        if gsm_mode and n > 1:
            head += b_to_gsm(1)
        if g.dbuf:
            head += issue_a()  # the first A stage; later ones go one stage ahead of the VPU
        if gsm_mode:
            head.append(Op("barrier", "sync", label="B K-block 1 in GSM"))
        blocks.append(tuple(head))
        for i, (r, t) in enumerate(steps):
            ops: list[Op] = []
            if i + 1 < n and g.dbuf:
                ops += b_to_am(i + 1)  # next K block's B into the other AM buffer, during this one
            # K step i+2's B slice goes into the GSM buffer every core finished reading before the
            # last barrier; issued after this step's first stage, so the DMA queue first fetches
            # what the VPU needs next
            to_gsm = b_to_gsm(i + 2) if gsm_mode and i + 2 < n else []
            for j, (s0, ns) in enumerate(a_stages(r, t)):
                ops += issue_a()  # dbuf: the next stage's A (other SM buffer); else this stage's
                ops.append(vpu(i, s0, ns, a_slot[(r, t, s0, ns)]))
                if t == self.nk - 1:
                    ops.append(c_out(r, s0, ns))  # final rows leave while the next stage computes
                if j == 0:
                    ops += to_gsm
                    to_gsm = []
            ops += to_gsm  # (a core without a block this round)
            if i + 1 < n:
                if not g.dbuf:
                    ops += b_to_am(i + 1)
                if steps[i + 1][1] == 0:
                    ops += bias_dma(steps[i + 1][0])  # after the last reads of this block's bias
                if gsm_mode:
                    ops.append(Op("barrier", "sync", label="B K-block in GSM"))
            blocks.append(tuple(ops))
        if self.fn:
            return [op for b in blocks for op in b]
        return compress(blocks, (2, 1))
