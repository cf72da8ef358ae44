"""The attention kernel's stage events -> per-core DSP programs (lowering "attention").

`schedules/dsp/attention.py` writes flash attention as a TIR loop nest: query tiles over the
cores (`opc.dsp.cores`), key / value tiles inside (`opc.dsp.stage`, the causal bound on their
loop), each stage one `T.call_packed(EVENT, stage, bh, q0[, k0])`. This module evaluates the
nest (its loops, bounds and branches, by the simulator core's TIR expression evaluator) and
turns each event into what it stands for. The layout puts the query rows on the 32 lanes, so
the softmax statistics of a tile are vectors and every row reduction of the online softmax is
an element-wise chain down the key rows (no lane reduction anywhere):

    q     Q tile DDR -> AM transposed (Q^T: d rows x q_tile lanes; one DMA run per element),
          x scale in place (one vector pass a tile)
    kv    K and V tiles DDR -> SM (key rows x d, contiguous: the scalars the products broadcast);
          with a mask, its tile DDR -> AM from the mask relaid once to (skv, mask batches, sq)
    qk    S^T = K Q^T on the VPEs: register blocks of pw key rows x kv query vectors, per step of
          d one vector load of Q^T per query vector, one scalar load of K per key row, pw x kv
          FMAs (the GEMM micro-kernel); S^T stays in AM
    sm    per query vector, down the tile's key rows: + mask tile, + the causal band (a constant
          AM table, NEG left of the diagonal, read at an offset that moves one element a key
          row) where the tile crosses the diagonal; m' = max(m, max_j S); alpha = exp(m - m');
          P = exp(S - m') in place; l = alpha l + sum_j P (fp32; exp is the VPU's sequence)
    pv    O^T = alpha O^T + V^T P^T: register blocks of pw head-dim rows x kv query vectors,
          per key row one vector load of P^T per query vector, one scalar load of V per row
    out   1 / l (reciprocal estimate + Newton), O^T x 1/l, AM -> DDR transposed

The score tile S / P lives in AM only: nothing of it goes to DDR. Stages are issued in the
software-pipelined order of `program.stage_order` (with `dbuf` two K / V / mask slots, two Q^T
and O^T slots by query tile; the next step's loads are issued before this step's VPU passes, a
query tile's Q^T arrives in pieces (query vectors) over the previous tile's steps and its O^T
leaves in pieces over the next tile's: only a core's first Q^T and last O^T are not overlapped).
With layout=sbhd (Q, K, V, O sequence first) a head's rows are `b h d` elements apart in DDR:
the same copies with that row pitch. Every VPU pass is a `program.VKernel` of vector instructions: functional mode
executes them on the simulated memories, timing list-schedules them, and the functional clock
(`fclock`) costs what executed.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR
from opcompiler.sim.program import deal
from opcompiler.sim.tir_expr import Compiler

from .. import program as vx  # the VPU's vector instructions

from .. import timing as tm

from .. import execute as ex
from ..intrin import ALIGN, EVENT
from ..machine import DspMachine
from ..program import Allocator, Op, View, dma_op, stage_order
from ..program import VI, Mem, Nest, VKernel

NEG = -1.0e30  # a masked score (the catalogue's NEG): its exp is exp's clamp, ~1e-38
_INT = Compiler(integer=True)
_EVENTS: dict[int, tuple[Any, list[tuple]]] = {}  # id(func) -> (func, its events): traced once per lowered function


# ------------------------------------------------------------------ the event stream


def events_of(func) -> list[tuple]:
    """The stage events of the kernel, in program order: the lowered function's loops run with
    their bounds (the causal bound included) and branches evaluated; every
    `T.call_packed(EVENT, tag, ...)` one (tag, ints...) tuple."""
    got = _EVENTS.get(id(func))
    if got is not None and got[0] is func:
        return got[1]
    fns: dict[int, Callable] = {}

    def val(e, env: dict) -> int:
        if isinstance(e, TIR.IntImm):
            return int(e.value)
        k = e.__chandle__()
        f = fns.get(k)
        if f is None:
            f = fns[k] = _INT.fn(e)
        return int(f(env, None))

    out: list[tuple] = []

    def walk(st, env: dict) -> None:
        if isinstance(st, TIR.For):
            lo, n = val(st.min, env), val(st.extent, env)
            k = st.loop_var.__chandle__()
            for i in range(lo, lo + max(n, 0)):
                env[k] = i
                walk(st.body, env)
            env.pop(k, None)
        elif isinstance(st, TIR.SeqStmt):
            for s in st.seq:
                walk(s, env)
        elif isinstance(st, TIR.IfThenElse):
            if val(st.condition, env):
                walk(st.then_case, env)
            elif st.else_case is not None:
                walk(st.else_case, env)
        elif isinstance(st, TIR.Evaluate):
            c = st.value
            args = getattr(c, "args", ())
            if not (isinstance(c, TIR.Call) and len(args) >= 2 and isinstance(args[0], TIR.StringImm)
                    and args[0].value == EVENT and isinstance(args[1], TIR.StringImm)):
                raise OpcFailure(f"attention lowering: an evaluation that is not a stage event: {c}")
            out.append((args[1].value, *(val(a, env) for a in args[2:])))
        elif isinstance(st, (TIR.AttrStmt, TIR.DeclBuffer)):
            walk(st.body, env)
        else:
            raise OpcFailure(f"attention lowering: no rule for {type(st).__name__} in the stage-event nest")

    walk(func.body, {})
    if len(_EVENTS) >= 256:
        _EVENTS.clear()
    _EVENTS[id(func)] = (func, out)
    return out


class _Tile:
    """One query tile's events: (bh, q0) and its key / value tiles' k0 in order."""

    __slots__ = ("bh", "q0", "k0s")

    def __init__(self, bh: int, q0: int):
        self.bh, self.q0, self.k0s = bh, q0, []


def tiles_of(events: list[tuple]) -> list[_Tile]:
    """The events grouped by query tile, checked to come in the kernel's order (q, then per
    key / value tile kv qk sm pv, then out)."""
    tiles: list[_Tile] = []
    want = ("kv", "qk", "sm", "pv")
    cur: _Tile | None = None
    pos = 0
    for ev in events:
        tag = ev[0]
        if tag == "q":
            if cur is not None:
                raise OpcFailure("attention lowering: a query tile starts before the last one wrote its output")
            cur = _Tile(ev[1], ev[2])
            continue
        if cur is None or tuple(ev[1:3]) != (cur.bh, cur.q0):
            raise OpcFailure(f"attention lowering: event {ev} outside its query tile")
        if tag == "out":
            if pos:
                raise OpcFailure("attention lowering: a query tile ends inside a key / value tile")
            tiles.append(cur)
            cur = None
            continue
        if tag != want[pos] or (pos and ev[3] != cur.k0s[-1]):
            raise OpcFailure(f"attention lowering: event {ev} out of order (expected {want[pos]})")
        if pos == 0:
            cur.k0s.append(ev[3])
        pos = (pos + 1) % len(want)
    if cur is not None:
        raise OpcFailure("attention lowering: the last query tile has no output event")
    return tiles


# ------------------------------------------------------------------ register-blocked products


def block_shape(nvec: int) -> tuple[int, int]:
    """(pw rows, kv vectors) of a product's register block: up to 4 query vectors and as many
    rows as keep about 48 of the 64 registers busy (accumulators + operands), enough
    independent FMAs to cover the FMAC latency."""
    kv = max(1, min(nvec, 4))
    return max(1, (48 - 2 * kv) // (kv + 1)), kv


def gemm_nests(L: int, rows: int, nvec: int, steps: int, a: tuple[int, int, int], b: tuple[int, int],
               c: tuple[int, int], alpha: int | None, zero: bool) -> tuple[Nest, ...]:
    """C[row, vec] = (0 | C[row, vec] | C[row, vec] * alpha[vec]) + sum over steps of A[row, step] * B[step, vec]
    in register blocks (`block_shape`), tails for the rest: A scalars in SM (base, row pitch, step
    pitch; one `sld` broadcast a row and step), B vectors in AM (base, step pitch; vector v at
    + 32 v), C vectors in AM (base, row pitch). Each block: accumulators zeroed (`zero`), loaded
    (`alpha` None) or loaded and scaled by the alpha vector of their query vector, per step kv vector loads, pw scalar
    loads, pw x kv FMAs, then the stores (functional mode contracts the step loop)."""
    pw, kv = block_shape(nvec)
    pw = min(pw, rows)
    a0, arow, astep = a
    b0, bstep = b
    c0, crow = c
    out = []
    rfull, rtail = divmod(rows, pw)
    cfull, ctail = divmod(nvec, kv)
    for nr, pw_, r0 in ((rfull, pw, 0), (1 if rtail else 0, rtail, rfull * pw)):
        for nc, kv_, v0 in ((cfull, kv, 0), (1 if ctail else 0, ctail, cfull * kv)):
            if not (nr and nc and pw_ and kv_):
                continue
            acc = [[f"c{p}_{v}" for v in range(kv_)] for p in range(pw_)]

            def cm(p: int, v: int) -> Mem:
                return Mem("AM", c0 + (r0 + p) * crow + (v0 + v) * L, (pw * crow, kv * L, 0), 1)
            if zero:
                pre = tuple(VI("vmov", acc[p][v], (0.0,)) for p in range(pw_) for v in range(kv_))
            elif alpha is None:  # accumulate onto C as it is
                pre = tuple(VI("vld", acc[p][v], (cm(p, v),)) for p in range(pw_) for v in range(kv_))
            else:
                pre = tuple(VI("vld", f"al{v}", (Mem("AM", alpha + (v0 + v) * L, (0, kv * L, 0), 1),))
                            for v in range(kv_))
                pre += tuple(x for p in range(pw_) for v in range(kv_)
                             for x in (VI("vld", acc[p][v], (cm(p, v),)), VI("vmul", acc[p][v], (acc[p][v], f"al{v}"))))
            body = tuple(VI("vld", f"b{v}", (Mem("AM", b0 + (v0 + v) * L, (0, kv * L, bstep), 1),)) for v in range(kv_))
            body += tuple(VI("sld", f"a{p}", (Mem("SM", a0 + (r0 + p) * arow, (pw * arow, 0, astep), 0),))
                          for p in range(pw_))
            body += tuple(VI("vfma", acc[p][v], (f"a{p}", f"b{v}", acc[p][v])) for p in range(pw_) for v in range(kv_))
            post = tuple(VI("vst", cm(p, v), (acc[p][v],)) for p in range(pw_) for v in range(kv_))
            out.append(Nest(outer=(nr, nc), inner=(steps,), pre=pre, body=body, post=post, contract=True))
    return tuple(out)


def exp_seq(x: str, y: str) -> list[VI]:
    """y = exp(x) for x <= 0 (a score minus its row's running max): the VPU's exp sequence
    (`program.emit_exp`) without its upper clamp, which such an x never reaches."""
    return [i for i in vx.emit_exp(x, y, "r", "n") if i.op != "vmin"]


# ------------------------------------------------------------------ the lowering


class StageOps:
    """What a stage-event lowerer (attention, the recurrent cell) emits with: memoised ops in
    timing mode and VPU passes costed by the timing model. Needs `m`, `L`, `fn` and `memo`."""

    def _op(self, key: tuple, make: Callable[[], Op]) -> Op:
        """Timing mode: ops of one kind, shape and slot are one object (repeated steps compress)."""
        if self.fn:
            return make()
        op = self.memo.get(key)
        if op is None:
            op = self.memo[key] = make()
        return op

    def _vpu(self, nests: tuple, reads: tuple, writes: tuple, label: str) -> Op:
        kern = VKernel(tuple(nests), label)
        cost = tm.kernel_cost(self.m, kern)
        fn = (lambda mem, k=kern, L=self.L: ex.execute_pass(mem, k, L)) if self.fn else None
        return Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=writes, cost=cost, nruns=len(kern.nests),
                  fn=fn, label=label)


class AttentionLowerer(StageOps):
    """The attention events -> one op list per core (see the module docstring). `p` (the
    template's params): bh, sq, skv, d, heads, mq (query tile, a multiple of the lanes), nk (key /
    value tile), dbuf, causal, mask_batches, scale, cores, tiles, seq_first (Q, K, V and O are
    (s, b, h, d) in DDR: a head's rows `b h d` apart, else (b, h, s, d))."""

    def __init__(self, m: DspMachine, func, p: dict, functional: bool):
        self.m, self.p, self.fn = m, p, functional
        self.tiles = tiles_of(events_of(func))
        if len(self.tiles) != int(p["tiles"]):
            raise OpcFailure(f"attention lowering: {len(self.tiles)} query tiles traced, {p['tiles']} scheduled")
        self.L = m.lanes
        self.d, self.mq, self.nk = int(p["d"]), int(p["mq"]), int(p["nk"])
        if self.mq % self.L:
            raise OpcFailure(f"attention lowering: the query tile ({self.mq}) is not a multiple of the {self.L} lanes")
        self.slots = 2 if p["dbuf"] else 1
        self.causal, self.mb = bool(p["causal"]), int(p["mask_batches"])
        self.sf = bool(p.get("seq_first", False))
        self.pitch = int(p["bh"]) * self.d if self.sf else self.d  # elements between a head's rows in DDR
        self.memo: dict[tuple, Op] = {}
        self._allocate()

    # ---- buffers --------------------------------------------------------------------------
    def _allocate(self) -> None:
        """AM / SM buffers in the order `schedules/dsp/attention.attention_buffers` lists them."""
        d, mq, nk, S = self.d, self.mq, self.nk, self.slots
        am, sm = Allocator("AM", self.m.cap("AM"), ALIGN["AM"]), Allocator("SM", self.m.cap("SM"), ALIGN["SM"])
        self.qT = [am.alloc(f"qT_AM_{s}", d * mq) for s in range(S)]
        self.oT = [am.alloc(f"oT_AM_{s}", d * mq) for s in range(S)]
        self.s = am.alloc("s_AM", nk * mq)
        self.mx = [am.alloc(f"m_AM_{s}", mq) for s in range(2)]
        self.l = am.alloc("l_AM", mq)
        self.al = am.alloc("alpha_AM", mq)
        self.mk = [am.alloc(f"mask_AM_{s}", nk * mq) for s in range(S)] if self.mb else []
        self.x0, ulen = band_extent(mq, nk)
        self.band = am.alloc("band_AM", ulen) if self.causal else None
        self.k = [sm.alloc(f"k_SM_{s}", nk * d) for s in range(S)]
        self.v = [sm.alloc(f"v_SM_{s}", nk * d) for s in range(S)]
        self.ulen = ulen

    # ---- ops ------------------------------------------------------------------------------

    def _dma(self, src: View, dst: View, reads: tuple, writes: tuple, label: str) -> Op:
        return dma_op(self.m, src, dst, reads, writes, self.fn, label)

    def _row(self, bh: int, i: int, seq: int) -> int:
        """DDR offset of row i of head bh in a (b, h, seq, d) or (seq, b, h, d) tensor."""
        return (i * int(self.p["bh"]) + bh) * self.d if self.sf else (bh * seq + i) * self.d

    def _rows(self, q0: int) -> int:
        return min(self.mq, int(self.p["sq"]) - q0)

    def _kn(self, k0: int) -> int:
        return min(self.nk, int(self.p["skv"]) - k0)

    # -- per event
    def q_in(self, t: _Tile, slot: int, vecs: tuple[int, int] | None = None) -> Op:
        """Q tile DDR -> AM as Q^T (d rows x the tile's query lanes; the query vectors `vecs` of
        it, all by default): one run per element."""
        d, rows, mq, L = self.d, self._rows(t.q0), self.mq, self.L
        v0, v1 = vecs or (0, -(-rows // L))
        r0, nr = v0 * L, min(rows, v1 * L) - v0 * L
        src = View(("DDR", "q"), self._row(t.bh, t.q0 + r0, int(self.p["sq"])), (d, nr), (1, self.pitch))
        dst = View(("AM",), self.qT[slot] + r0, (d, nr), (mq, 1))
        return self._op(("q", nr, slot, r0), lambda: self._dma(src, dst, (), (f"qT{slot}",), "Q DDR->AM (transposed)"))

    def q_scale(self, t: _Tile, slot: int) -> Op:
        L, nv = self.L, -(-self._rows(t.q0) // self.L)
        at = Mem("AM", self.qT[slot], (self.mq, L), 1)
        n = Nest(outer=(self.d, nv), post=(VI("vld", "x", (at,)), VI("vmul", "x", ("x", float(self.p["scale"]))),
                                           VI("vst", at, ("x",))))
        return self._op(("scale", nv, slot), lambda: self._vpu((n,), (f"qT{slot}",), (f"qT{slot}",), "Q^T x scale"))

    def kv_in(self, t: _Tile, k0: int, slot: int) -> list[Op]:
        d, kn = self.d, self._kn(k0)
        base = self._row(t.bh, k0, int(self.p["skv"]))
        out = []
        for name, buf in (("k", self.k), ("v", self.v)):
            src = View(("DDR", name), base, (kn, d), (self.pitch, 1))
            dst = View(("SM",), buf[slot], (kn, d), (d, 1))
            out.append(self._op((name, kn, slot), lambda src=src, dst=dst, name=name: self._dma(
                src, dst, (), (f"{name}{slot}",), f"{name.upper()} DDR->SM")))
        if self.mb:
            rows, sq, mb = self._rows(t.q0), int(self.p["sq"]), self.mb
            n = 0 if mb == 1 else t.bh // int(self.p["heads"])
            src = View(("DDR", "maskT"), (k0 * mb + n) * sq + t.q0, (kn, rows), (mb * sq, 1))
            dst = View(("AM",), self.mk[slot], (kn, rows), (self.mq, 1))
            out.append(self._op(("mask", kn, rows, slot), lambda: self._dma(
                src, dst, (), (f"mk{slot}",), "mask^T DDR->AM")))
        return out

    def qk(self, t: _Tile, k0: int, qs: int, slot: int) -> Op:
        d, mq, kn, nv = self.d, self.mq, self._kn(k0), -(-self._rows(t.q0) // self.L)
        nests = gemm_nests(self.L, kn, nv, d, (self.k[slot], d, 1), (self.qT[qs], mq), (self.s, mq), None, True)
        return self._op(("qk", kn, nv, qs, slot), lambda: self._vpu(
            nests, (f"qT{qs}", f"k{slot}"), ("S",), f"S^T = K Q^T ({kn} x {nv * self.L}, d {d})"))

    def softmax(self, t: _Tile, k0: int, j: int, slot: int) -> Op:
        L, mq, kn = self.L, self.mq, self._kn(k0)
        nv = -(-self._rows(t.q0) // L)
        first = j == 0
        diag = self.causal and k0 + kn - 1 > t.q0
        s_at = Mem("AM", self.s, (L, mq), 1)
        m_new, m_old = self.mx[j % 2], self.mx[(j + 1) % 2]

        def vec(base: int) -> Mem:
            return Mem("AM", base, (L, 0), 1)
        # the running max: down the key rows of each query vector (mask and band added first)
        pre = (VI("vmov", "mx", (NEG,)),) if first else (VI("vld", "mx", (vec(m_old),)),)
        body = [VI("vld", "x", (s_at,))]
        if self.mb:
            body += [VI("vld", "mk", (Mem("AM", self.mk[slot], (L, mq), 1),)), VI("vadd", "x", ("x", "mk"))]
        if diag:  # band[x0 + i - (k0 - q0) - j]: NEG where key k0 + j > query q0 + i
            off = self.x0 - (k0 - t.q0)
            if off - (kn - 1) < 0 or off + nv * L > self.ulen:
                raise OpcFailure("attention lowering: a diagonal tile reads past the causal band")
            body += [VI("vld", "bd", (Mem("AM", self.band + off, (L, -1), 1),)), VI("vadd", "x", ("x", "bd"))]
        if self.mb or diag:
            body.append(VI("vst", s_at, ("x",)))
        body.append(VI("vmax", "mx", ("mx", "x")))
        post = [VI("vst", vec(m_new), ("mx",))]
        if not first:  # alpha = exp(m - m')
            post += [VI("vld", "mo", (vec(m_old),)), VI("vsub", "dd", ("mo", "mx"))] + exp_seq("dd", "al")
            post.append(VI("vst", vec(self.al), ("al",)))
        nmax = Nest(outer=(nv,), inner=(kn,), pre=tuple(pre), body=tuple(body), post=tuple(post))
        # P = exp(S - m') in place, l = alpha l + its sum down the key rows
        pre2 = [VI("vld", "mn", (vec(m_new),))]
        if first:
            pre2.append(VI("vmov", "s", (0.0,)))
        else:
            pre2 += [VI("vld", "lv", (vec(self.l),)), VI("vld", "a", (vec(self.al),)), VI("vmul", "s", ("lv", "a"))]
        body2 = [VI("vld", "x", (s_at,)), VI("vsub", "x", ("x", "mn"))] + exp_seq("x", "e")
        body2 += [VI("vst", s_at, ("e",)), VI("vadd", "s", ("s", "e"))]
        nexp = Nest(outer=(nv,), inner=(kn,), pre=tuple(pre2), body=tuple(body2),
                    post=(VI("vst", vec(self.l), ("s",)),))
        reads = ("S",) + ((f"mk{slot}",) if self.mb else ()) + (("band",) if diag else ())
        return self._op(("sm", kn, nv, first, diag, slot if self.mb else 0, self.mx.index(m_new)), lambda: self._vpu(
            (nmax, nexp), reads, ("S", "stats"), f"online softmax ({kn} keys x {nv * L} queries)"))

    def pv(self, t: _Tile, k0: int, j: int, qs: int, slot: int) -> Op:
        d, mq, kn, nv = self.d, self.mq, self._kn(k0), -(-self._rows(t.q0) // self.L)
        nests = gemm_nests(self.L, d, nv, kn, (self.v[slot], 1, d), (self.s, mq), (self.oT[qs], mq), self.al, j == 0)
        return self._op(("pv", kn, nv, j == 0, qs, slot), lambda: self._vpu(
            nests, ("S", f"v{slot}", "stats"), (f"oT{qs}",), f"O^T = alpha O^T + V^T P^T ({kn} keys)"))

    def finish(self, t: _Tile, qs: int) -> Op:
        """O^T x (1 / l)."""
        L, nv = self.L, -(-self._rows(t.q0) // self.L)
        vec = Mem("AM", self.l, (L,), 1)
        rcp = Nest(outer=(nv,), post=tuple([VI("vld", "lv", (vec,))] + vx.emit_rcp("lv", "y", "e")
                                           + [VI("vst", Mem("AM", self.al, (L,), 1), ("y",))]))
        at = Mem("AM", self.oT[qs], (self.mq, L), 1)
        scale = Nest(outer=(self.d, nv), post=(VI("vld", "o", (at,)), VI("vld", "r", (Mem("AM", self.al, (0, L), 1),)),
                                               VI("vmul", "o", ("o", "r")), VI("vst", at, ("o",))))
        return self._op(("fin", nv, qs), lambda: self._vpu((rcp, scale), ("stats", f"oT{qs}"), (f"oT{qs}", "stats"),
                                                            "O^T / l"))

    def o_out(self, t: _Tile, qs: int, vecs: tuple[int, int] | None = None) -> Op:
        """O^T AM -> DDR as O (the query vectors `vecs` of the tile, all by default)."""
        d, rows, L = self.d, self._rows(t.q0), self.L
        v0, v1 = vecs or (0, -(-rows // L))
        r0, nr = v0 * L, min(rows, v1 * L) - v0 * L
        src = View(("AM",), self.oT[qs] + r0, (nr, d), (1, self.mq))
        dst = View(("DDR", "out"), self._row(t.bh, t.q0 + r0, int(self.p["sq"])), (nr, d), (self.pitch, 1))
        return self._op(("o", nr, qs, r0), lambda: self._dma(src, dst, (f"oT{qs}",), ("O",),
                                                            "O AM->DDR (transposed)"))

    def band_fill(self) -> Op:
        L = self.L
        nests = vx.fill_nests(NEG, self.band, (1, 1, self.x0), (0, 0), L)
        nests += vx.fill_nests(0.0, self.band + self.x0, (1, 1, self.ulen - self.x0), (0, 0), L)
        return self._op(("band",), lambda: self._vpu(tuple(nests), (), ("band",), "causal band fill"))

    # ---- per core ---------------------------------------------------------------------------
    def share(self, core: int) -> list[_Tile]:
        """Core `core`'s query tiles: under the causal bound tiles differ in their key tiles, so
        they are dealt longest first to the least loaded core (LPT); without it every tile is
        equal and the split is even and contiguous."""
        k = max(1, min(int(self.p["cores"]), self.m.cores))
        if core >= k:
            return []
        if not self.causal:
            n = len(self.tiles)
            return self.tiles[core * n // k:(core + 1) * n // k]
        return [self.tiles[ti] for ti in deal([len(t.k0s) + 1 for t in self.tiles], k)[core]]

    def group_key(self, core: int) -> tuple:
        """What a core's timing depends on: per query tile its rows and, per key / value tile,
        its keys and whether it crosses the diagonal."""
        return tuple((self._rows(t.q0), tuple((self._kn(k0), self.causal and k0 + self._kn(k0) - 1 > t.q0)
                                              for k0 in t.k0s)) for t in self.share(core))

    def core_ops(self, core: int) -> list:
        tiles = self.share(core)
        dbuf = self.slots == 2
        stages: list[tuple[list, list, list]] = []
        starts: list[int] = []  # the first stage of each query tile
        step = 0
        for ti, t in enumerate(tiles):
            qs = ti % self.slots
            if not t.k0s:
                raise OpcFailure(f"attention lowering: query tile at row {t.q0} has no key / value tile")
            starts.append(len(stages))
            for j, k0 in enumerate(t.k0s):
                slot = step % self.slots
                step += 1
                ins = ([self.q_in(t, qs)] if j == 0 else []) + self.kv_in(t, k0, slot)
                comp = ([self.q_scale(t, qs)] if j == 0 else [])
                comp += [self.qk(t, k0, qs, slot), self.softmax(t, k0, j, slot), self.pv(t, k0, j, qs, slot)]
                outs: list = []
                if j == len(t.k0s) - 1:
                    comp.append(self.finish(t, qs))
                    outs.append(self.o_out(t, qs))
                stages.append((ins, comp, outs))
        if dbuf:
            nv = [-(-self._rows(t.q0) // self.L) for t in tiles]
            ends = starts[1:] + [len(stages)]
            for ti in range(1, len(tiles)):
                a, b = starts[ti - 1], starts[ti]
                if b - a >= 2:  # this tile's Q^T in pieces before the previous tile's passes (its slot is free)
                    stages[b][0].pop(0)
                    for i, vecs in enumerate(_pieces(nv[ti], b - a - 1)):
                        stages[a + 1 + i][0].append(self.q_in(tiles[ti], ti % 2, vecs))
                # the previous tile's O^T leaves in pieces after this tile's passes
                stages[b - 1][2].pop()  # (its own O^T: the last of that stage's)
                for i, vecs in enumerate(_pieces(nv[ti - 1], ends[ti] - b)):
                    stages[b + i][2].insert(0, self.o_out(tiles[ti - 1], (ti - 1) % 2, vecs))
        if self.causal and stages:
            stages[0][0].insert(0, self.band_fill())
        return stage_order(stages, dbuf, self.fn)


def _pieces(n: int, k: int) -> list[tuple[int, int]]:
    """n query vectors in at most k contiguous, balanced pieces (one a step)."""
    k = max(1, min(n, k))
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def band_extent(mq: int, nk: int) -> tuple[int, int]:
    """(x0, length) of the causal band table: element x0 + x is NEG for x < 0, else 0; a
    diagonal tile reads x = i - (k0 - q0) - j over its query lanes i and key rows j, which lies
    in (-(mq + nk), mq + nk)."""
    x0 = mq + nk
    return x0, -(-(x0 + mq + nk) // 32) * 32


__all__ = ["AttentionLowerer", "StageOps", "band_extent", "block_shape", "events_of", "gemm_nests", "tiles_of"]
