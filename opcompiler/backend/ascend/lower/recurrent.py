"""The recurrent kernels' trace -> AI Core programs (lowering "recurrent": lstm and gru).

`schedules/ascend/recurrent.py` writes the kernel as a TIR loop nest (batch tiles, steps, hidden
tiles, and a cross-core exchange per step when the hidden units are split over cores), each
stage a `T.call_packed(EVENT, stage, tile, ...)`; `trace.trace` evaluates it and this module
turns each stage into instructions:

    init  h0 rows GM -> L1 (slot 0); the carried state GM -> UB fp16 -> fp32 (per hidden tile,
          (nj, bt, hn)): c0 for an LSTM, h0 for a GRU; on the core's first tile: bias GM -> UB,
          and its weight columns GM -> L1 when they fit
    x     x_s rows GM -> L1 (slot s % 2); s is the input position (t-1 .. 0 when reverse)
    cell  (this core's hidden tiles only) per K chunk: L1 -> L0A (ND -> zZ), weights L1 (or
          GM -> L1) -> L0B, MMAD into the tile's L0C accumulator (x_s W_j^T then h R_j^T);
          L0C -> UB (NZ -> ND, fp32); + bias; the cell on the vector unit:
            lstm  sigmoid on the four gates (muls -1, exp, adds 1, rec), the c gate pre-scaled
                  by 2 and mapped back (2 s - 1 = tanh); c = f c + i c~; h = o tanh(c)
            gru   columns [z | r | n_x | n_h] (W packed [z r n 0], R packed [z r 0 n], so one
                  accumulator holds both halves of n); sigmoid on z, r; n = tanh(n_x + r n_h);
                  h = n + z (h - n), h carried in UB in fp32
          fp16; UB -> GM (Y at position s); without a hidden split also UB -> L1 (the next
          step's h, slot (s + 1) % 2: the 910's UB -> L1 path)
    sync  (hidden split over cores) SyncAll; the whole h_s of the batch tile Y GM -> L1 (slot
          (s + 1) % 2): every core's columns, written before the barrier
"""
from __future__ import annotations

from collections.abc import Sequence

from .builder import KernelBuilder, split_even
from ..program import Program, VOp
from ..machine import Machine

LANES32 = 64


def cols(kb: KernelBuilder, op: str, dst: tuple, srcs: Sequence[tuple], rows: int, ncols: int,
         scalar: float = 0.0) -> None:
    """`op` on a (rows x ncols) block of row-strided operands, each (buf, offset, row elements):
    a repeat a row (row 0: the same row every repeat), 64-lane parts."""
    def vop(o: tuple, c: int) -> VOp:
        buf, off, row = o
        return VOp(buf, off + c, 1, row * buf.itemsize // 32)

    for c in range(0, ncols, LANES32):
        kb.vec_raw(op, vop(dst, c), tuple(vop(s, c) for s in srcs), rows, min(LANES32, ncols - c), scalar=scalar)


def sigmoid(kb: KernelBuilder, o: tuple, rows: int, ncols: int) -> None:
    """1 / (1 + exp(-x)) in place."""
    cols(kb, "muls", o, [o], rows, ncols, -1.0)
    cols(kb, "exp", o, [o], rows, ncols)
    cols(kb, "adds", o, [o], rows, ncols, 1.0)
    cols(kb, "rec", o, [o], rows, ncols)


def tanh(kb: KernelBuilder, dst: tuple, src: tuple, rows: int, ncols: int) -> None:
    """tanh(x) = 2 sigmoid(2x) - 1 into dst."""
    cols(kb, "muls", dst, [src], rows, ncols, -2.0)
    cols(kb, "exp", dst, [dst], rows, ncols)
    cols(kb, "adds", dst, [dst], rows, ncols, 1.0)
    cols(kb, "rec", dst, [dst], rows, ncols)
    cols(kb, "muls", dst, [dst], rows, ncols, 2.0)
    cols(kb, "adds", dst, [dst], rows, ncols, -1.0)


class RecurrentLowering:
    """Stage events -> one core's program: core c runs batch-tile group c // hs (its share of
    the batch tiles) and hidden part c % hs (its share of the hidden tiles)."""

    def __init__(self, m: Machine, events: Sequence[tuple], p: dict):
        self.m, self.p = m, p
        self.groups: list[list[tuple]] = []
        for ev in events:
            if ev[0] == "init":
                self.groups.append([ev])
            elif self.groups:
                self.groups[-1].append(ev)

    def active(self, block_dim: int) -> int:
        """Cores that run: whole hidden-split groups, no more than there are batch tiles."""
        hs = self.p["hs"]
        return max(1, min(len(self.groups), max(1, block_dim // hs))) * hs

    def program(self, core: int, active: int) -> Program:
        p = self.p
        cell = p["cell"]
        t_n, ip, hp, bp, bt, hn, kc, resident, hs = (p[k] for k in ("t", "ip", "hp", "bp", "bt", "hn", "kc",
                                                                     "resident", "hs"))
        reverse = p["reverse"]
        g = 4 * hn
        g1, bt1, nj = g // 16, bt // 16, hp // hn
        ngroups = active // hs
        j0, j1 = split_even(nj, hs, core % hs)
        mine = j1 - j0
        kb = KernelBuilder(self.m, core, active)
        X = kb.gm("X", (t_n, bp, ip), "float16")
        W = kb.gm("W", (ip // 16, 4 * hp // 16, 16, 16), "float16")
        R = kb.gm("R", (hp // 16, 4 * hp // 16, 16, 16), "float16")
        B = kb.gm("B", (4 * hp,), "float32")
        H0 = kb.gm("H0", (bp, hp), "float16")
        S0 = kb.gm("C0", (bp, hp), "float16") if cell == "lstm" else H0  # the state the vector unit carries
        Y = kb.gm("Y", (t_n, bp, hp), "float16")
        hl1 = [kb.alloc("L1", f"h_L1_{s}", (bt, hp), "float16") for s in range(2)]
        xl1 = [kb.alloc("L1", f"x_L1_{s}", (bt, ip), "float16") for s in range(2)]
        wcols = (slice(None), slice(j0 * g1, j1 * g1))
        if resident:
            wl1 = kb.alloc("L1", "W_L1", (ip // 16, mine * g1, 16, 16), "float16")
            rl1 = kb.alloc("L1", "R_L1", (hp // 16, mine * g1, 16, 16), "float16")
            stream = []
        else:
            stream = [kb.alloc("L1", f"w_L1_{s}", (kc // 16, g1, 16, 16), "float16") for s in range(2)]
        a0 = [kb.alloc("L0A", f"a_L0A_{s}", (bt1, kc // 16, 16, 16), "float16") for s in range(2)]
        b0 = [kb.alloc("L0B", f"b_L0B_{s}", (kc // 16, g1, 16, 16), "float16") for s in range(2)]
        gc = [kb.alloc("L0C", f"g_L0C_{s}", (g1, bt, 16), "float32") for s in range(2)]
        gu = kb.alloc("UB", "gates_UB", (bt, g), "float32")
        cu = kb.alloc("UB", "c_UB", (nj, bt, hn), "float32")
        bias = kb.alloc("UB", "bias_UB", (4 * hp,), "float32")
        c16 = kb.alloc("UB", "c16_UB", (bt, hp), "float16")
        h16 = [kb.alloc("UB", f"h16_UB_{s}", (bt, hn), "float16") for s in range(2)]
        lo, hi = split_even(len(self.groups), ngroups, core // hs)
        most = split_even(len(self.groups), ngroups, 0)
        q = 0  # the running K-chunk slot
        n = 0  # the running cell slot
        for gi, events in enumerate(self.groups[lo:hi]):
            b_0 = events[0][1] * bt
            if gi == 0:
                kb.data_move(bias, (slice(0, 4 * hp),), B, (slice(0, 4 * hp),))
                if resident:
                    kb.data_move(wl1, (slice(None),) * 4, W, (*wcols, slice(None), slice(None)))
                    kb.data_move(rl1, (slice(None),) * 4, R, (*wcols, slice(None), slice(None)))
            kb.data_move(hl1[0], (slice(0, bt), slice(0, hp)), H0, (slice(b_0, b_0 + bt), slice(0, hp)))
            kb.data_move(c16, (slice(0, bt), slice(j0 * hn, j1 * hn)), S0, (slice(b_0, b_0 + bt), slice(j0 * hn, j1 * hn)))
            for j in range(j0, j1):
                cols(kb, "conv", (cu, j * bt * hn, hn), [(c16, j * hn, hp)], bt, hn)
            for ev in events[1:]:
                tag, step = ev[0], ev[2]
                pos = t_n - 1 - step if reverse else step
                if tag == "x":
                    kb.data_move(xl1[step % 2], (slice(0, bt), slice(0, ip)), X,
                                 (pos, slice(b_0, b_0 + bt), slice(0, ip)))
                    kb.loop()
                    continue
                if tag == "sync":
                    kb.sync_all()
                    kb.data_move(hl1[(step + 1) % 2], (slice(0, bt), slice(0, hp)), Y,
                                 (pos, slice(b_0, b_0 + bt), slice(0, hp)))
                    continue
                j = ev[3]
                if not j0 <= j < j1:
                    continue
                s = n % 2
                n += 1
                first = True
                for src, kdim, wg, wres in ((xl1[step % 2], ip, W, wl1 if resident else None),
                                            (hl1[step % 2], hp, R, rl1 if resident else None)):
                    for k0 in range(0, kdim, kc):
                        kn = min(kc, kdim - k0)
                        k1, kq = kn // 16, k0 // 16
                        qa = q % 2
                        q += 1
                        kb.data_move(a0[qa], (slice(0, bt1), slice(0, k1)), src, (slice(0, bt), slice(k0, k0 + kn)),
                                     transform="nd2zz")
                        if wres is None:
                            widx = (slice(kq, kq + k1), slice(j * g1, (j + 1) * g1))
                            kb.data_move(stream[qa], (slice(0, k1), slice(0, g1)), wg, widx)
                            kb.data_move(b0[qa], (slice(0, k1), slice(0, g1)), stream[qa], (slice(0, k1), slice(0, g1)))
                        else:
                            widx = (slice(kq, kq + k1), slice((j - j0) * g1, (j - j0 + 1) * g1))
                            kb.data_move(b0[qa], (slice(0, k1), slice(0, g1)), wres, widx)
                        kb.mmad(gc[s], a0[qa], b0[qa], bt1, k1, g1, init=first)
                        first = False
                kb.data_move(gu, (slice(0, bt), slice(0, g)), gc[s], (slice(0, g1), slice(0, bt)), transform="nz2nd")
                cols(kb, "add", (gu, 0, g), [(gu, 0, g), (bias, j * g, 0)], bt, g)
                gate = lambda k: (gu, k * hn, g)  # noqa: E731  (the tile's four column groups)
                st = (cu, j * bt * hn, hn)  # the carried state: c (lstm) or h (gru), fp32
                if cell == "lstm":
                    hnew = self._lstm_cell(kb, gate, st, bt, hn, g)
                else:
                    hnew = self._gru_cell(kb, gate, st, bt, hn)
                cols(kb, "conv", (h16[s], 0, hn), [hnew], bt, hn)
                kb.data_move(Y, (pos, slice(b_0, b_0 + bt), slice(j * hn, (j + 1) * hn)), h16[s],
                             (slice(0, bt), slice(0, hn)))
                if hs == 1:
                    kb.data_move(hl1[(step + 1) % 2], (slice(0, bt), slice(j * hn, (j + 1) * hn)), h16[s],
                                 (slice(0, bt), slice(0, hn)))
        if hs > 1:  # a group with fewer batch tiles still meets every barrier of the others
            for _ in range((most[1] - most[0] - (hi - lo)) * t_n):
                kb.sync_all()
        return kb.finish(gm_inputs=("X", "W", "R", "B", "H0") + (("C0",) if cell == "lstm" else ()))

    @staticmethod
    def _lstm_cell(kb: KernelBuilder, gate, c: tuple, bt: int, hn: int, g: int) -> tuple:
        """Columns [i | o | f | c~] -> c = f c + i c~ (in `c`), h = o tanh(c) (gate 0, returned)."""
        gu = gate(0)[0]
        cols(kb, "muls", gate(3), [gate(3)], bt, hn, 2.0)
        kb.vec("muls", VOp(gu), (VOp(gu),), bt * g, scalar=-1.0)
        kb.vec("exp", VOp(gu), (VOp(gu),), bt * g)
        kb.vec("adds", VOp(gu), (VOp(gu),), bt * g, scalar=1.0)
        kb.vec("rec", VOp(gu), (VOp(gu),), bt * g)
        cols(kb, "muls", gate(3), [gate(3)], bt, hn, 2.0)
        cols(kb, "adds", gate(3), [gate(3)], bt, hn, -1.0)
        cols(kb, "mul", c, [c, gate(2)], bt, hn)
        cols(kb, "mul", gate(0), [gate(0), gate(3)], bt, hn)
        cols(kb, "add", c, [c, gate(0)], bt, hn)
        tanh(kb, gate(3), c, bt, hn)
        cols(kb, "mul", gate(0), [gate(1), gate(3)], bt, hn)
        return gate(0)

    @staticmethod
    def _gru_cell(kb: KernelBuilder, gate, hst: tuple, bt: int, hn: int) -> tuple:
        """Columns [z | r | n_x | n_h] -> n = tanh(n_x + r n_h), h = n + z (h - n) (in `hst`,
        returned)."""
        gu = gate(0)[0]
        sigmoid(kb, (gu, 0, 4 * hn), bt, 2 * hn)  # z and r: one pass over both column groups
        cols(kb, "mul", gate(3), [gate(1), gate(3)], bt, hn)
        cols(kb, "add", gate(2), [gate(2), gate(3)], bt, hn)
        tanh(kb, gate(3), gate(2), bt, hn)
        cols(kb, "sub", gate(2), [hst, gate(3)], bt, hn)
        cols(kb, "mul", gate(2), [gate(0), gate(2)], bt, hn)
        cols(kb, "add", hst, [gate(3), gate(2)], bt, hn)
        return hst
