"""The attention kernel's trace -> AI Core programs (lowering "attention").

`schedules/ascend/attention.py` writes the kernel as a TIR loop nest (the flash-attention
schedule: query tiles over the cores, key / value tiles inside, the causal bound on that loop,
and, double-buffered, the stages skewed as a software pipeline), each stage a
`T.call_packed(EVENT, stage, bh, q0[, k0])`. `trace.trace` evaluates it; this module turns
each stage into the instructions it stands for. Per query tile (`q`): Q GM -> UB, x scale (once, not
per score tile), UB -> L1 -> L0A (ND -> zZ by Load2D), the running max m = -1e30, sum l = 0,
output O = 0 in UB. Per key / value tile:

    qk    K tile GM -> L1 -> L0B (FRACTAL_Z, packed on the host), S = Q K^T on the cube into L0C
    sm    S: L0C -> UB (fp32), + mask tile (fp16 -> fp32), + the causal band where the
          tile crosses the diagonal, -1e30 past the last key; row max (fold + vcmax),
          m' = max(m, rowmax), alpha = exp(m - m'), S = exp(S - m') (m' made a block per row by
          Brcb, read with block stride 0), l = alpha l + row sum, P = fp16(S)
    pv    P: UB -> L1 (MTE3) -> L0A (ND -> zZ), V tile GM -> L1 -> L0B, O_j = P V into L0C
    acc   O_j: L0C -> UB, O = alpha O + O_j
and `out`: O / l (reciprocal, Brcb, multiply), fp16, UB -> GM. The score tile S / P lives in
L0C, UB, L1 and L0A and never goes to GM. Every buffer that a skewed stage reuses across
pipes has two slots (the template's `double_buffer`); m and alpha always have two; S in UB,
read by the vector unit alone, has one.
"""
from __future__ import annotations

from collections.abc import Sequence

from ....sim.program import deal
from .builder import KernelBuilder
from ..program import Buf, Program, VOp
from ..machine import Machine

NEG = -1.0e30
LANES32 = 64  # fp32 elements per 256 B repeat


def _rows_raw(kb: KernelBuilder, op: str, dst: VOp, srcs: tuple[VOp, ...], rows: int, mask: int) -> None:
    """One instruction per 255 rows (a row per repeat) for reductions, whose destination
    advances one element a repeat (the builder's `vec_raw` advances by the repeat stride)."""
    for r0 in range(0, rows, 255):
        n = min(255, rows - r0)

        def at(o: VOp, red: bool = False) -> VOp:
            step = r0 if red else r0 * o.rep_stride * (32 // o.buf.itemsize)
            return VOp(o.buf, o.offset + step, o.blk_stride, o.rep_stride)

        kb.vec_raw(op, at(dst, True), tuple(at(s) for s in srcs), n, mask)


def row_reduce(kb: KernelBuilder, fold: str, red: str, dst: Buf, src: Buf, tmp: Buf, rows: int, cols: int,
               row_stride: int) -> None:
    """dst[r] = red over src[r, :cols] (fp32 rows `row_stride` elements apart): the row's
    64-lane parts folded element-wise into `tmp` (rows x 64), then one vcadd / vcmax a row."""
    rs = row_stride // 8
    parts = -(-cols // LANES32)
    if parts == 1:
        _rows_raw(kb, red, VOp(dst), (VOp(src, 0, 1, rs),), rows, cols)
        return
    kb.vec_raw(fold if cols >= 2 * LANES32 else "copy", VOp(tmp, 0, 1, 8),
               (VOp(src, 0, 1, rs), VOp(src, LANES32, 1, rs)) if cols >= 2 * LANES32 else (VOp(src, 0, 1, rs),),
               rows)
    for p in range(2 if cols >= 2 * LANES32 else 1, parts):
        kb.vec_raw(fold, VOp(tmp, 0, 1, 8), (VOp(tmp, 0, 1, 8), VOp(src, p * LANES32, 1, rs)), rows,
                   min(LANES32, cols - p * LANES32))
    _rows_raw(kb, red, VOp(dst), (VOp(tmp, 0, 1, 8),), rows, LANES32)


def row_bcast(kb: KernelBuilder, op: str, buf: Buf, off: int, cols: int, row_stride: int, rows: int, bc: Buf) -> None:
    """buf[r, :cols] = buf[r, :cols] <op> bc[r] (bc: one 32 B block per row, from Brcb)."""
    rs = row_stride // 8
    for p in range(-(-cols // LANES32)):
        o = VOp(buf, off + p * LANES32, 1, rs)
        kb.vec_raw(op, o, (o, VOp(bc, 0, 0, 1)), rows, min(LANES32, cols - p * LANES32))


def brcb(kb: KernelBuilder, bc: Buf, src: Buf, rows: int) -> None:
    kb.vec_raw("brcb", VOp(bc, 0, 1, 8), (VOp(src, 0, 1, 1),), -(-rows // 8))


class AttentionLowering:
    """An attention trace -> one core's program. GM: Q and O (BH, SQ, D) ND (sequence first:
    (SQ, BH, D), a head's rows a strided DMA), K as FRACTAL_Z of
    K^T (BH, D1, SKV1, 16, 16), V as FRACTAL_Z (BH, SKV1, D1, 16, 16), the additive mask (MB, SQ,
    SKV) fp16, the causal band (mq, mq + 2 nk) fp32 (-1e30 where column - row > nk, else 0: a tile
    crossing the diagonal reads the window its offset selects), all padded to 16."""

    def __init__(self, m: Machine, events: Sequence[tuple], p: dict):
        self.m, self.p = m, p
        self.groups: list[list[tuple]] = []
        for ev in events:
            if ev[0] == "q":
                self.groups.append([ev])
            elif self.groups:
                self.groups[-1].append(ev)

    def share(self, core: int, active: int) -> list[list[tuple]]:
        """The query tiles core `core` of `active` runs. Under the causal bound tiles differ in their
        number of key tiles, so they are dealt longest first to the least loaded core (LPT), and
        the cores are numbered by load, heaviest first: core 0, the one the timing replays, is
        the last to finish. Without the bound this is an even contiguous split."""
        loads = [1 + sum(ev[0] == "qk" for ev in g) for g in self.groups]  # 1: Q in, normalise, write
        return [self.groups[gi] for gi in deal(loads, active)[core]]

    def program(self, core: int, active: int) -> Program:  # noqa: C901 (one stage per branch)
        p = self.p
        bh, sqp, skvp, dp = p["bh"], p["sqp"], p["skvp"], p["dp"]
        mq, nk, slots = p["mq"], p["nk"], p["slots"]
        sq, skv, heads, mb = p["sq"], p["skv"], p["heads"], p["mask_batches"]
        d1, nk1, mq1 = dp // 16, nk // 16, mq // 16
        kb = KernelBuilder(self.m, core, active)
        sf = p.get("seq_first", False)
        Q = kb.gm("Q", (sqp, bh, dp) if sf else (bh, sqp, dp), "float16")
        K = kb.gm("K", (bh, d1, skvp // 16, 16, 16), "float16")
        V = kb.gm("V", (bh, skvp // 16, d1, 16, 16), "float16")
        O = kb.gm("O", (sqp, bh, dp) if sf else (bh, sqp, dp), "float16")

        def rows_of(b_h: int, q0: int, rows: int) -> tuple:  # a head's rows of Q / O in GM
            return (slice(q0, q0 + rows), b_h, slice(0, dp)) if sf else (b_h, slice(q0, q0 + rows), slice(0, dp))

        Mk = kb.gm("M", (mb, sqp, skvp), "float16") if mb else None
        T = kb.gm("T", (mq, mq + 2 * nk), "float32") if p["causal"] else None
        q1 = kb.alloc("L1", "q_L1", (mq, dp), "float16")
        k1 = [kb.alloc("L1", f"k_L1_{s}", (d1, nk1, 16, 16), "float16") for s in range(slots)]
        v1 = [kb.alloc("L1", f"v_L1_{s}", (nk1, d1, 16, 16), "float16") for s in range(slots)]
        p1 = [kb.alloc("L1", f"p_L1_{s}", (mq, nk), "float16") for s in range(slots)]
        qa = kb.alloc("L0A", "q_L0A", (mq1, d1, 16, 16), "float16")
        pa = [kb.alloc("L0A", f"p_L0A_{s}", (mq1, nk1, 16, 16), "float16") for s in range(slots)]
        kl0 = kb.alloc("L0B", "k_L0B", (d1, nk1, 16, 16), "float16")
        vl0 = kb.alloc("L0B", "v_L0B", (nk1, d1, 16, 16), "float16")
        sc = [kb.alloc("L0C", f"s_L0C_{s}", (nk1, mq, 16), "float32") for s in range(slots)]
        oc = [kb.alloc("L0C", f"o_L0C_{s}", (d1, mq, 16), "float32") for s in range(slots)]
        pu = [kb.alloc("UB", f"p_UB_{s}", (mq, nk), "float16") for s in range(slots)]
        S = kb.alloc("UB", "s_UB", (mq, nk), "float32")  # read by the vector unit only: one slot
        ou = kb.alloc("UB", "o_UB", (mq, dp), "float32")
        otu = kb.alloc("UB", "ot_UB", (mq, dp), "float32")  # also the row folds' scratch (d >= 64)
        o16 = kb.alloc("UB", "out_UB", (mq, dp), "float16")  # also Q on its way to L1
        red = otu if dp >= LANES32 else kb.alloc("UB", "fold_UB", (mq, LANES32), "float32")
        rowv = kb.alloc("UB", "row_UB", (mq,), "float32")
        mv = [kb.alloc("UB", f"m_UB_{s}", (mq,), "float32") for s in range(2)]
        al = [kb.alloc("UB", f"alpha_UB_{s}", (mq,), "float32") for s in range(2)]
        lv = kb.alloc("UB", "l_UB", (mq,), "float32")
        bc = kb.alloc("UB", "bcast_UB", (mq, 8), "float32")
        mk16 = kb.alloc("UB", "mask_UB", (mq, nk), "float16") if mb else None
        band = kb.alloc("UB", "band_UB", (mq, nk), "float32") if (mb or p["causal"]) else None
        for events in self.share(core, active):
            _, b_h, q0 = events[0][:3]
            rows = min(mq, -(-(sq - q0) // 16) * 16)  # the tile's rows, 16-aligned (pad rows: zeros)
            r1 = rows // 16
            kb.data_move(o16, (slice(0, rows), slice(0, dp)), Q, rows_of(b_h, q0, rows))
            kb.vec("muls", VOp(o16), (VOp(o16),), rows * dp, scalar=p["scale"])  # Q x scale, once a tile
            kb.data_move(q1, (slice(0, rows), slice(0, dp)), o16, (slice(0, rows), slice(0, dp)))
            kb.data_move(qa, (slice(0, r1), slice(0, d1)), q1, (slice(0, rows), slice(0, dp)), transform="nd2zz")
            kb.vec("dup", VOp(mv[0]), (), rows, scalar=NEG)
            kb.vec("dup", VOp(lv), (), rows, scalar=0.0)
            kb.vec("dup", VOp(ou), (), rows * dp, scalar=0.0)
            for ev in events[1:]:
                tag = ev[0]
                if tag == "out":
                    kb.vec("rec", VOp(rowv), (VOp(lv),), rows)
                    brcb(kb, bc, rowv, rows)
                    row_bcast(kb, "mul", ou, 0, dp, dp, rows, bc)
                    kb.vec("conv", VOp(o16), (VOp(ou),), rows * dp)
                    kb.data_move(O, rows_of(b_h, q0, rows), o16, (slice(0, rows), slice(0, dp)))
                    kb.loop()
                    continue
                k0 = ev[3]
                j = k0 // nk
                s = j % slots
                kn = min(nk, skvp - k0)  # the tile's keys, 16-aligned
                n1, c0 = kn // 16, k0 // 16
                if tag == "qk":
                    kb.data_move(k1[s], (slice(0, d1), slice(0, n1)), K, (b_h, slice(0, d1), slice(c0, c0 + n1)))
                    kb.data_move(kl0, (slice(0, d1), slice(0, n1)), k1[s], (slice(0, d1), slice(0, n1)))
                    kb.mmad(sc[s], qa, kl0, r1, d1, n1)
                elif tag == "sm":
                    kb.data_move(S, (slice(0, rows), slice(0, kn)), sc[s], (slice(0, n1), slice(0, rows)),
                                 transform="nz2nd")
                    if mb:
                        mb_i = 0 if mb == 1 else b_h // heads
                        kb.data_move(mk16, (slice(0, rows), slice(0, kn)), Mk,
                                     (mb_i, slice(q0, q0 + rows), slice(k0, k0 + kn)))
                        kb.vec("conv", VOp(band), (VOp(mk16),), rows * nk)
                        kb.vec("add", VOp(S), (VOp(S), VOp(band)), rows * nk)
                    if p["causal"] and k0 + kn - 1 > q0:  # the tile crosses the diagonal
                        off = nk - (q0 - k0)  # band[i, c] = -1e30 where c - i > nk
                        kb.data_move(band, (slice(0, rows), slice(0, kn)), T,
                                     (slice(0, rows), slice(off, off + kn)))
                        kb.vec("add", VOp(S), (VOp(S), VOp(band)), rows * nk)
                    if k0 + kn > skv:  # keys past the sequence (the 16-padding): -1e30
                        first = skv - k0
                        for c in range(first, kn, LANES32):
                            kb.vec_raw("dup", VOp(S, c, 1, nk // 8), (), rows, min(LANES32, kn - c), scalar=NEG)
                    m_old, m_new = mv[j % 2], mv[(j + 1) % 2]
                    row_reduce(kb, "max", "cmax", rowv, S, red, rows, kn, nk)
                    kb.vec("max", VOp(m_new), (VOp(m_old), VOp(rowv)), rows)
                    kb.vec("sub", VOp(al[j % 2]), (VOp(m_old), VOp(m_new)), rows)
                    kb.vec("exp", VOp(al[j % 2]), (VOp(al[j % 2]),), rows)
                    brcb(kb, bc, m_new, rows)
                    row_bcast(kb, "sub", S, 0, kn, nk, rows, bc)
                    kb.vec("exp", VOp(S), (VOp(S),), rows * nk)
                    row_reduce(kb, "add", "cadd", rowv, S, red, rows, kn, nk)
                    kb.vec("mul", VOp(lv), (VOp(lv), VOp(al[j % 2])), rows)
                    kb.vec("add", VOp(lv), (VOp(lv), VOp(rowv)), rows)
                    kb.vec("conv", VOp(pu[s]), (VOp(S),), rows * nk)
                elif tag == "pv":
                    kb.data_move(p1[s], (slice(0, rows), slice(0, kn)), pu[s], (slice(0, rows), slice(0, kn)))
                    kb.data_move(pa[s], (slice(0, r1), slice(0, n1)), p1[s], (slice(0, rows), slice(0, kn)),
                                 transform="nd2zz")
                    kb.data_move(v1[s], (slice(0, n1), slice(0, d1)), V, (b_h, slice(c0, c0 + n1), slice(0, d1)))
                    kb.data_move(vl0, (slice(0, n1), slice(0, d1)), v1[s], (slice(0, n1), slice(0, d1)))
                    kb.mmad(oc[s], pa[s], vl0, r1, n1, d1)
                elif tag == "acc":
                    kb.data_move(otu, (slice(0, rows), slice(0, dp)), oc[s], (slice(0, d1), slice(0, rows)),
                                 transform="nz2nd")
                    brcb(kb, bc, al[j % 2], rows)
                    row_bcast(kb, "mul", ou, 0, dp, dp, rows, bc)
                    kb.vec("add", VOp(ou), (VOp(ou), VOp(otu)), rows * dp)
                    kb.loop()
        return kb.finish(gm_inputs=("Q", "K", "V", "M", "T"))
