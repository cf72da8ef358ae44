"""The recurrent kernel's stage events -> per-core DSP programs (lowering "recurrent").

`schedules/dsp/recurrent.py` writes the fused LSTM / GRU cell as a TIR loop nest: the core grid
(`opc.dsp.cores`), the steps inside (`opc.dsp.stage`), each stage one
`T.call_packed(EVENT, stage, core, pos[, chunk])`. The nest is evaluated as the attention
lowering's is (`lower.attention.events_of`) and every event becomes what it stands for:

    init  biases: per gate block its Wb / Rb slices DDR -> AM, one vector pass summing them;
          c0 (lstm) and the core's slice of h0 (the cell's h_{t-1} at the first step) DDR -> AM;
          the resident K chunks of W^T / R^T DDR -> AM (a run per K row and gate block); with
          w_path=gsm the streamed chunks DDR -> GSM, dealt over the cores of the hidden group,
          then a barrier
    x     x_pos rows n0..n1, K chunk DDR -> SM; the W^T chunk (resident, or GSM -> AM / DDR ->
          AM into a stream slot); gates += A B on the VPEs: register blocks of pw rows x kv
          vectors, per K row one scalar load of A per row, one vector load of B per vector,
          pw x kv FMAs (the GEMM micro-kernel), the accumulators loaded from and stored to the
          gates in AM
    h     the same with h_{s-1}'s chunk GSM -> SM (h0 from DDR at the first step) and R^T
    rh    gru lbr=0: r = sigmoid(g_r), r * h_{s-1} of the core's units AM -> GSM; a barrier
          when the hidden units are split
    g     the same product with (r h)'s chunk and R_n^T into the hn block
    cell  the gate activations (sigmoid = 1 / (1 + exp(-x)), tanh = 2 sigmoid(2x) - 1: the VPU's
          exp and reciprocal sequences), c and h; a pass over (rows, vectors of the core's units)
    out   h AM -> Y[pos] (DDR) and AM -> GSM (the next step's A scalars); a barrier when the
          hidden units are split (one a step: the GSM h buffers alternate by step, so a core's
          write of h_s cannot overtake another's read of h_{s-1})

Every step opens with a vector pass writing the biases into the gates, so the products only
accumulate. The stages of a step (one per K chunk, the cell and the write-back on the last) are
issued software-pipelined (`dbuf`: the next chunk's copies before this chunk's product), also
across the step boundary for the x chunks, which depend on no other core; a chunk that reads
what a barrier published is issued after it. Functional mode executes every vector instruction
on the simulated memories; timing list-schedules them.
"""
from __future__ import annotations

from opcompiler.errors import OpcFailure

from .. import program as vx  # the VPU's vector instructions
from ..intrin import ALIGN
from ..machine import DspMachine
from ..program import VI, Allocator, Mem, Nest, Op, View, compress, dma_op
from .attention import StageOps, events_of, gemm_nests


def acc_nests(L: int, rows: int, nvec: int, steps: int, a: tuple[int, int, int], b: tuple[int, int],
              c: tuple[int, int]) -> tuple[Nest, ...]:
    """C[row, vec] += sum over steps of A[row, step] * B[step, vec]: the attention lowering's
    register-block GEMM nests (`lower.attention.gemm_nests`) accumulating onto C as it is."""
    return gemm_nests(L, rows, nvec, steps, a, b, c, None, False)


def sigmoid_seq(x: str, y: str) -> list[VI]:
    """y = 1 / (1 + exp(-x)) (the VPU's exp and reciprocal sequences; scratch s*)."""
    return ([VI("vmul", "st", (x, -1.0))] + vx.emit_exp("st", "se", "sr", "sn") + [VI("vadd", "sd", ("se", 1.0))]
            + vx.emit_rcp("sd", y, "sq"))


def tanh_seq(x: str, y: str) -> list[VI]:
    """y = tanh(x) = 2 / (1 + exp(-2x)) - 1."""
    return ([VI("vmul", "st", (x, -2.0))] + vx.emit_exp("st", "se", "sr", "sn") + [VI("vadd", "sd", ("se", 1.0))]
            + vx.emit_rcp("sd", y, "sq") + [VI("vfma", y, (y, 2.0, -1.0))])


class _Stage:
    __slots__ = ("ins", "comp", "outs", "hoist")

    def __init__(self, ins: list, comp: list, outs: list, hoist: bool = True):
        self.ins, self.comp, self.outs, self.hoist = ins, comp, outs, hoist


class RecurrentLowerer(StageOps):
    """The recurrent events -> one op list per core (see the module docstring). `p` (the
    template's params, `schedules/dsp/recurrent.plan`): op, t, b, i, h, G, blocks, kinds, bias,
    chunks ((kind, k0, rows, resident), ...), grid ((n0, n1, u0, u1) per core), nb, hcp, kc,
    slots, hsplit, w_path, dbuf, cores."""

    def __init__(self, m: DspMachine, func, p: dict, functional: bool):
        self.m, self.p, self.fn = m, p, functional
        self.L = m.lanes
        self.op = p["op"]
        self.t, self.b, self.i, self.h = (int(p[k]) for k in ("t", "b", "i", "h"))
        self.G, self.nblk = int(p["G"]), int(p["blocks"])
        self.kinds = [tuple(k) for k in p["kinds"]]
        self.chunks = [tuple(c) for c in p["chunks"]]
        self.grid = [tuple(g) for g in p["grid"]]
        self.kc, self.slots = int(p["kc"]), int(p["slots"])
        self.ch = int(p["hsplit"])
        self.cb = len(self.grid) // self.ch
        self.sync = self.ch > 1  # the hidden units split: every core needs the others' h
        self.lbr0 = any(k[4] == "rh" for k in self.kinds)
        self.streamed = [j for j, c in enumerate(self.chunks) if not c[3]]
        self.gsm_w = bool(self.streamed) and p["w_path"] == "gsm"
        self.steps = self._trace(events_of(func))
        self.memo: dict[tuple, Op] = {}
        self._allocate()

    # ---- the event stream ---------------------------------------------------------------------
    def _trace(self, events: list[tuple]) -> list[list[int]]:
        """Per core its step positions, checked to come in the kernel's order (init; per step
        the chunks of every kind in order, rh before g, cell, out)."""
        want: list[tuple] = []
        for ki, k in enumerate(self.kinds):
            if k[0] == "g":
                want.append(("rh",))
            want += [(k[0], j) for j in range(sum(1 for c in self.chunks if c[0] == ki))]
        want += [("cell",), ("out",)]
        per: dict[int, list[int]] = {}
        cur, pos_i, core = None, 0, -1
        for ev in events:
            tag, g, pos = ev[0], ev[1], ev[2]
            if tag == "init":
                if pos_i:
                    raise OpcFailure(f"recurrent lowering: core {g} starts inside a step of core {core}")
                core, cur = g, per.setdefault(g, [])
                continue
            if g != core or (tag, *ev[3:]) != want[pos_i] or (pos_i and pos != cur[-1]):
                raise OpcFailure(f"recurrent lowering: event {ev} out of order (expected {want[pos_i]})")
            if pos_i == 0:
                cur.append(pos)
            pos_i = (pos_i + 1) % len(want)
        if pos_i or sorted(per) != list(range(len(self.grid))):
            raise OpcFailure("recurrent lowering: the traced nest does not cover every core's steps")
        for g, ps in per.items():
            if sorted(ps) != list(range(self.t)):
                raise OpcFailure(f"recurrent lowering: core {g} visits positions {ps}, not each of 0..{self.t - 1}")
        return [per[g] for g in range(len(self.grid))]

    # ---- buffers ------------------------------------------------------------------------------
    def _allocate(self) -> None:
        """AM / SM / GSM buffers in the order `schedules/dsp/recurrent.plan` lists them."""
        m, nb, hcp, nblk, kc, S = self.m, int(self.p["nb"]), int(self.p["hcp"]), self.nblk, self.kc, self.slots
        am = Allocator("AM", m.cap("AM"), ALIGN["AM"])
        sm = Allocator("SM", m.cap("SM"), ALIGN["SM"])
        gsm = Allocator("GSM", m.cap("GSM"), ALIGN["GSM"])
        self.gates = am.alloc("gates", nb * nblk * hcp)
        self.bias = am.alloc("bias", nblk * hcp)
        self.bias_w = am.alloc("bias_w", nblk * hcp)
        self.bias_r = am.alloc("bias_r", nblk * hcp)
        self.c = am.alloc("c", nb * hcp) if self.op == "lstm" else None
        self.hA = [am.alloc(f"h_{s}", nb * hcp) for s in range(2)]
        self.rhA = am.alloc("rh", nb * hcp) if self.lbr0 else None
        ncols = [len(k[2]) * hcp for k in self.kinds]
        self.wres: dict[int, int] = {}
        if self.streamed:
            self.wstream = [am.alloc(f"wstream_{s}", kc * max(ncols)) for s in range(S)]
        for j, (ki, _, kn, res) in enumerate(self.chunks):
            if res:
                self.wres[j] = am.alloc(f"w_{j}", kn * ncols[ki])
        self.a = [sm.alloc(f"a_{s}", nb * kc) for s in range(S)]
        self.hG = [gsm.alloc(f"hG_{s}", self.b * self.h) for s in range(2)]
        self.rhG = gsm.alloc("rhG", self.b * self.h) if self.lbr0 else None
        self.wG: dict[tuple[int, int], int] = {}
        if self.gsm_w:
            for q in range(self.ch):
                u0, u1 = q * self.h // self.ch, (q + 1) * self.h // self.ch
                hq = -(-(u1 - u0) // self.L) * self.L
                for j in self.streamed:
                    ki, _, kn, _ = self.chunks[j]
                    self.wG[q, j] = gsm.alloc(f"wG_{q}_{j}", kn * len(self.kinds[ki][2]) * hq)

    # ---- ops ----------------------------------------------------------------------------------

    def _dma(self, key: tuple, src: View, dst: View, reads: tuple, writes: tuple, label: str) -> Op:
        return self._op(("dma", src.level, dst.level, src.shape, src.strides, dst.strides, reads, writes) + key, lambda: dma_op(self.m, src, dst, reads, writes, self.fn, label))

    def _barrier(self, label: str) -> Op:
        return self._op(("barrier", label), lambda: Op("barrier", "sync", label=label))

    # -- geometry of one core
    def _geo(self, core: int) -> tuple[int, int, int, int, int, int]:
        n0, n1, u0, u1 = self.grid[core]
        hc = u1 - u0
        return n0, n1 - n0, u0, hc, -(-hc // self.L) * self.L, core % self.ch

    def _wsrc(self, ki: int, k0: int, kn: int, q: int, u0: int, hc: int) -> View:
        """Rows k0.. of the relaid W^T / R^T, gate q's columns of the core's units."""
        wname = self.kinds[ki][1]
        return View(("DDR", wname), k0 * self.G * self.h + q * self.h + u0, (kn, hc), (self.G * self.h, 1))

    def _w_into(self, core: int, j: int, dst_space: tuple, dst_base: int, label: str, writes: tuple) -> list[Op]:
        """Chunk j's weight columns of core `core`, DDR (relaid) -> dst, a descriptor per gate block."""
        _, _, u0, hc, hcp, _ = self._geo(core)
        ki, k0, kn, _ = self.chunks[j]
        ncols = len(self.kinds[ki][2]) * hcp
        out = []
        for bi, q in enumerate(self.kinds[ki][2]):
            src = self._wsrc(ki, k0, kn, q, u0, hc)
            dst = View(dst_space, dst_base + bi * hcp, (kn, hc), (ncols, 1))
            out.append(self._dma(("w", j, bi, hc, ncols), src, dst, (), writes, label))
        return out

    def init_ops(self, core: int) -> list[Op]:
        n0, nb, u0, hc, hcp, q = self._geo(core)
        L = self.L
        ops: list[Op] = []
        # biases: per gate block its W part into bias_w, its R part (if any) into bias_r
        sums = []
        for blk, offs in enumerate(self.p["bias"]):
            for part, (buf, off) in enumerate(zip((self.bias_w, self.bias_r), offs)):
                src = View(("DDR", "B"), off * self.h + u0, (1, hc), (hc, 1))
                dst = View(("AM",), buf + blk * hcp, (1, hc), (hc, 1))
                ops.append(self._dma(("bias", blk, part), src, dst, (), ("biasparts",), "B slice DDR->AM"))
            sums.append(len(offs))
        hv = hcp // L
        nests = []
        for blk, n in enumerate(sums):
            vw = Mem("AM", self.bias_w + blk * hcp, (L,), 1)
            vb = Mem("AM", self.bias + blk * hcp, (L,), 1)
            post = [VI("vld", "x", (vw,))]
            if n == 2:
                post += [VI("vld", "y", (Mem("AM", self.bias_r + blk * hcp, (L,), 1),)), VI("vadd", "x", ("x", "y"))]
            nests.append(Nest(outer=(hv,), post=tuple(post + [VI("vst", vb, ("x",))])))
        ops.append(self._op(("biasvpu", hv), lambda: self._vpu(tuple(nests), ("biasparts",), ("bias",), "Wb + Rb")))
        rows = View(("AM",), 0, (nb, hc), (hcp, 1))
        if self.op == "lstm":
            src = View(("DDR", "c0"), n0 * self.h + u0, (nb, hc), (self.h, 1))
            ops.append(self._dma(("c0",), src, View(("AM",), self.c, rows.shape, rows.strides), (), ("c",),
                                 "c0 DDR->AM"))
        else:  # the cell's h_{t-1} of the core's units at the first step (slot of step -1)
            src = View(("DDR", "h0"), n0 * self.h + u0, (nb, hc), (self.h, 1))
            ops.append(self._dma(("h0A",), src, View(("AM",), self.hA[1], rows.shape, rows.strides), (), ("h1",),
                                 "h0 DDR->AM"))
        for j in self.wres:
            ops += self._w_into(core, j, ("AM",), self.wres[j], "W^T / R^T chunk DDR->AM (resident)", ("wres",))
        if self.gsm_w:  # the group's streamed chunks DDR -> GSM, dealt over its batch groups' cores
            for idx, j in enumerate(self.streamed):
                if self._loader(idx) == core // self.ch:
                    ops += self._w_into(core, j, ("GSM",), self.wG[q, j], "W^T / R^T chunk DDR->GSM", ("wG",))
        return ops

    def a_in(self, core: int, s: int, pos: int, j: int, slot: int) -> Op:
        """Chunk j's A rows (x_pos, h_{s-1} or r h) -> SM slot."""
        n0, nb, *_ = self._geo(core)
        ki, k0, kn, _ = self.chunks[j]
        src_kind = self.kinds[ki][4]
        dst = View(("SM",), self.a[slot], (nb, kn), (self.kc, 1))
        if src_kind == "x":
            src, tag, what = View(("DDR", "X"), (pos * self.b + n0) * self.i + k0, (nb, kn), (self.i, 1)), (), "x"
        elif src_kind == "h" and s == 0:
            src, tag, what = View(("DDR", "h0"), n0 * self.h + k0, (nb, kn), (self.h, 1)), (), "h0"
        elif src_kind == "h":
            par = (s - 1) % 2
            src, tag, what = View(("GSM",), self.hG[par] + n0 * self.h + k0, (nb, kn), (self.h, 1)), (f"hG{par}",), "h"
        else:
            src, tag, what = View(("GSM",), self.rhG + n0 * self.h + k0, (nb, kn), (self.h, 1)), ("rhG",), "r h"
        return self._dma(("a", what, slot), src, dst, tag, (f"a{slot}",), f"{what} chunk ->SM")

    def w_in(self, core: int, j: int, slot: int) -> list[Op]:
        """Streamed chunk j -> AM stream slot (GSM: one contiguous copy; DDR: one per gate block)."""
        *_, hc, hcp, q = self._geo(core)
        ki, _, kn, _ = self.chunks[j]
        if self.gsm_w:
            n = kn * len(self.kinds[ki][2]) * hcp
            src = View(("GSM",), self.wG[q, j], (n,), (1,))
            return [self._dma(("ws", j, slot), src, View(("AM",), self.wstream[slot], (n,), (1,)), ("wG",),
                              (f"w{slot}",), "W^T / R^T chunk GSM->AM")]
        return self._w_into(core, j, ("AM",), self.wstream[slot], "W^T / R^T chunk DDR->AM", (f"w{slot}",))

    def product(self, core: int, j: int, aslot: int, wslot: int | None) -> Op:
        _, nb, _, _, hcp, _ = self._geo(core)
        ki, _, kn, res = self.chunks[j]
        kind = self.kinds[ki]
        ncols = len(kind[2]) * hcp
        nvec = ncols // self.L
        gp = self.nblk * hcp
        wbase, wtag = (self.wres[j], "wres") if res else (self.wstream[wslot], f"w{wslot}")
        nests = acc_nests(self.L, nb, nvec, kn, (self.a[aslot], self.kc, 1), (wbase, ncols),
                          (self.gates + kind[3] * hcp, gp))
        return self._op(("mm", ki, kn, nb, nvec, aslot, wtag), lambda: self._vpu(
            nests, (f"a{aslot}", wtag, "G"), ("G",), f"gates += {kind[0]} chunk ({nb} x {kn} x {ncols})"))

    def gates_init(self, core: int) -> Op:
        _, nb, _, _, hcp, _ = self._geo(core)
        nvt = self.nblk * hcp // self.L
        n = Nest(outer=(nb, nvt), post=(VI("vld", "x", (Mem("AM", self.bias, (0, self.L), 1),)),
                                        VI("vst", Mem("AM", self.gates, (self.nblk * hcp, self.L), 1), ("x",))))
        return self._op(("ginit", nb, nvt), lambda: self._vpu((n,), ("bias", "G"), ("G",), "gates = Wb + Rb"))

    def _gm(self, blk: int, hcp: int) -> Mem:
        return Mem("AM", self.gates + blk * hcp, (self.nblk * hcp, self.L), 1)

    def rh(self, core: int, slot: int) -> Op:
        """gru lbr=0: r = sigmoid(g_r) and r * h_{s-1} of the core's units -> the rh buffer."""
        _, nb, _, _, hcp, _ = self._geo(core)
        hm = lambda base: Mem("AM", base, (hcp, self.L), 1)  # noqa: E731
        post = [VI("vld", "gr", (self._gm(2, hcp),))] + sigmoid_seq("gr", "r")
        post += [VI("vld", "hp", (hm(self.hA[1 - slot]),)), VI("vmul", "x", ("r", "hp")), VI("vst", hm(self.rhA), ("x",))]
        n = Nest(outer=(nb, hcp // self.L), post=tuple(post))
        return self._op(("rh", nb, hcp, slot), lambda: self._vpu((n,), ("G", f"h{1 - slot}"), ("rh",), "r * h"))

    def cell(self, core: int, slot: int) -> Op:
        """The activations and the state update; h_s into h slot `slot` (h_{s-1} in the other)."""
        _, nb, _, _, hcp, _ = self._geo(core)
        hm = lambda base: Mem("AM", base, (hcp, self.L), 1)  # noqa: E731
        gm = lambda blk: self._gm(blk, hcp)  # noqa: E731
        if self.op == "lstm":  # blocks i, o, f, c
            post = [VI("vld", "gi", (gm(0),)), VI("vld", "gf", (gm(2),)), VI("vld", "gc", (gm(3),)),
                    VI("vld", "cp", (hm(self.c),))]
            post += sigmoid_seq("gi", "ig") + sigmoid_seq("gf", "fg") + tanh_seq("gc", "cg")
            post += [VI("vmul", "cn", ("fg", "cp")), VI("vfma", "cn", ("ig", "cg", "cn")), VI("vst", hm(self.c), ("cn",))]
            post += [VI("vld", "go", (gm(1),))] + sigmoid_seq("go", "og") + tanh_seq("cn", "tc")
            post += [VI("vmul", "hn", ("og", "tc")), VI("vst", hm(self.hA[slot]), ("hn",))]
            reads, writes = ("G", "c"), ("c", f"h{slot}")
        else:  # blocks xn, z, r, hn
            post = [VI("vld", "xn", (gm(0),)), VI("vld", "gz", (gm(1),)), VI("vld", "hn", (gm(3),)),
                    VI("vld", "hp", (hm(self.hA[1 - slot]),))]
            post += sigmoid_seq("gz", "z")
            if self.lbr0:  # n = tanh(xn + (r h) Rn^T + Rbn)
                post += [VI("vadd", "a", ("xn", "hn"))]
            else:  # n = tanh(xn + r * (h Rn^T + Rbn))
                post += [VI("vld", "gr", (gm(2),))] + sigmoid_seq("gr", "r") + [VI("vfma", "a", ("r", "hn", "xn"))]
            post += tanh_seq("a", "n")
            post += [VI("vsub", "d", ("hp", "n")), VI("vfma", "y", ("z", "d", "n")), VI("vst", hm(self.hA[slot]), ("y",))]
            reads, writes = ("G", f"h{1 - slot}"), (f"h{slot}",)
        n = Nest(outer=(nb, hcp // self.L), post=tuple(post))
        return self._op(("cell", nb, hcp, slot), lambda: self._vpu((n,), reads, writes, f"{self.op} cell"))

    def outs(self, core: int, s: int, pos: int, slot: int) -> list[Op]:
        n0, nb, u0, hc, hcp, _ = self._geo(core)
        src = View(("AM",), self.hA[slot], (nb, hc), (hcp, 1))
        y = View(("DDR", "out"), (pos * self.b + n0) * self.h + u0, (nb, hc), (self.h, 1))
        g = View(("GSM",), self.hG[s % 2] + n0 * self.h + u0, (nb, hc), (self.h, 1))
        return [self._dma(("y", slot), src, y, (f"h{slot}",), ("Y",), "h AM->DDR (Y)"),
                self._dma(("hG", slot, s % 2), src, g, (f"h{slot}",), (f"hG{s % 2}",), "h AM->GSM")]

    # ---- per core ---------------------------------------------------------------------------
    def _loader(self, idx: int) -> int:
        """The batch group whose core loads streamed chunk `idx` of its hidden group into GSM
        (dealt round robin over the batch groups with rows)."""
        rows = [jb for jb in range(self.cb) if (jb + 1) * self.b // self.cb > jb * self.b // self.cb]
        return rows[idx % len(rows)]

    def n_barriers(self) -> tuple[bool, bool, bool]:
        """(after the GSM weight loads, after r h each step, after h each step)."""
        return self.gsm_w, self.lbr0 and self.sync, self.sync

    def busy(self, core: int) -> bool:
        if core >= len(self.grid):
            return False
        n0, n1, u0, u1 = self.grid[core]
        return n1 > n0 and u1 > u0

    def group_key(self, core: int) -> tuple:
        if not self.busy(core):
            return ("idle",)
        _, nb, _, hc, _, _ = self._geo(core)
        loads = tuple(self._loader(idx) == core // self.ch for idx in range(len(self.streamed))) if self.gsm_w else ()
        return (nb, hc, loads)

    def core_ops(self, core: int) -> list:
        winit, wrh, wstep = self.n_barriers()
        if not self.busy(core):  # the barriers every core reaches
            ops = [self._barrier("weights in GSM")] if winit else []
            for _ in range(self.t):
                ops += ([self._barrier("r h in GSM")] if wrh else []) + ([self._barrier("h in GSM")] if wstep else [])
            return ops
        init = self.init_ops(core)
        if winit:
            init.append(self._barrier("weights in GSM"))
        stages: list[_Stage] = []
        na = nw = 0
        per_step = 0
        for s, pos in enumerate(self.steps[core]):
            slot = s % 2
            first = len(stages)
            for j, (ki, _, _, res) in enumerate(self.chunks):
                kind = self.kinds[ki][0]
                aslot = na % self.slots
                na += 1
                ins = [self.a_in(core, s, pos, j, aslot)]
                wslot = None
                if not res:
                    wslot = nw % self.slots
                    nw += 1
                    ins += self.w_in(core, j, wslot)
                comp = ([self.gates_init(core)] if j == 0 else []) + [self.product(core, j, aslot, wslot)]
                # the first r h chunk reads what this step's rh pass published: never before it
                hoist = not (kind == "g" and self.chunks[j - 1][0] != ki)
                stages.append(_Stage(ins, comp, [], hoist))
                last_h = kind == "h" and (j + 1 == len(self.chunks) or self.chunks[j + 1][0] != ki)
                if last_h and self.lbr0:
                    stages[-1].comp.append(self.rh(core, slot))
                    n0, nb, u0, hc, hcp, _ = self._geo(core)
                    src = View(("AM",), self.rhA, (nb, hc), (hcp, 1))
                    dst = View(("GSM",), self.rhG + n0 * self.h + u0, (nb, hc), (self.h, 1))
                    stages[-1].outs.append(self._dma(("rhG",), src, dst, ("rh",), ("rhG",), "r h AM->GSM"))
                    if wrh:
                        stages[-1].outs.append(self._barrier("r h in GSM"))
            stages[-1].comp.append(self.cell(core, slot))
            stages[-1].outs += self.outs(core, s, pos, slot)
            if wstep:
                stages[-1].outs.append(self._barrier("h in GSM"))
            per_step = len(stages) - first
        blocks: list[tuple] = [tuple(init)]
        if self.p["dbuf"]:
            blocks.append(tuple(stages[0].ins))
            for k, st in enumerate(stages):
                nxt = stages[k + 1] if k + 1 < len(stages) else None
                early = list(nxt.ins) if nxt is not None and nxt.hoist else []
                late = list(nxt.ins) if nxt is not None and not nxt.hoist else []
                blocks.append(tuple(early + st.comp + st.outs + late))
        else:
            blocks += [tuple(st.ins + st.comp + st.outs) for st in stages]
        if self.fn:
            return [op for b in blocks for op in b]
        return compress(blocks, tuple(dict.fromkeys((2 * per_step, per_step))))


__all__ = ["RecurrentLowerer", "acc_nests", "sigmoid_seq", "tanh_seq"]
