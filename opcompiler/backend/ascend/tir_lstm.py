"""The LSTM kernel's trace -> AI Core programs (lowering "lstm").

`schedules/ascend/recurrent.py` writes the kernel as a TIR loop nest (batch tiles over the cores,
steps, hidden tiles), each stage a `T.call_packed(EVENT, stage, tile, ...)`; `tir_trace.trace`
evaluates it and this module turns each stage into instructions:

    init  h0 rows GM -> L1 (slot 0); c0 GM -> UB fp16 -> fp32 (c kept per hidden tile, (nj, bt, hn));
          on the core's first tile: bias GM -> UB, and W, R GM -> L1 when resident
    x     x_t rows GM -> L1 (slot t % 2)
    cell  per K chunk: L1 -> L0A (ND -> zZ), weights L1 (or GM -> L1) -> L0B, MMAD into the
          tile's L0C accumulator (x_t W_j^T then h R_j^T); L0C -> UB (NZ -> ND, fp32);
          + bias; sigmoid on the four gates (muls -1, exp, adds 1, rec), the c gate pre-scaled by
          2 and mapped back (2 s - 1 = tanh); c = f c + i c~; tanh(c) the same way; h = o tanh(c);
          fp16; UB -> GM (Y) and UB -> L1 (the next step's h, slot (t + 1) % 2)
"""
from __future__ import annotations

from collections.abc import Sequence

from .builder import KernelBuilder, Program, split_even
from .isa import Buf, VOp
from .machine import Machine

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


class LstmLowering:
    """Stage events -> one core's program (its share of the batch tiles)."""

    def __init__(self, m: Machine, events: Sequence[tuple], p: dict):
        self.m, self.p = m, p
        self.groups: list[list[tuple]] = []
        for ev in events:
            if ev[0] == "init":
                self.groups.append([ev])
            elif self.groups:
                self.groups[-1].append(ev)

    def program(self, core: int, active: int) -> Program:
        p = self.p
        t_n, ip, hp, bp, bt, hn, kc, resident = (p[k] for k in ("t", "ip", "hp", "bp", "bt", "hn", "kc", "resident"))
        g = 4 * hn
        g1, bt1, nj = g // 16, bt // 16, hp // hn
        kb = KernelBuilder(self.m, core, active)
        X = kb.gm("X", (t_n, bp, ip), "float16")
        W = kb.gm("W", (ip // 16, 4 * hp // 16, 16, 16), "float16")
        R = kb.gm("R", (hp // 16, 4 * hp // 16, 16, 16), "float16")
        B = kb.gm("B", (4 * hp,), "float32")
        H0 = kb.gm("H0", (bp, hp), "float16")
        C0 = kb.gm("C0", (bp, hp), "float16")
        Y = kb.gm("Y", (t_n, bp, hp), "float16")
        hl1 = [kb.alloc("L1", f"h_L1_{s}", (bt, hp), "float16") for s in range(2)]
        xl1 = [kb.alloc("L1", f"x_L1_{s}", (bt, ip), "float16") for s in range(2)]
        if resident:
            wl1 = kb.alloc("L1", "W_L1", W.shape, "float16")
            rl1 = kb.alloc("L1", "R_L1", R.shape, "float16")
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
        lo, hi = split_even(len(self.groups), active, core)
        q = 0  # the running K-chunk slot
        n = 0  # the running cell slot
        for gi, events in enumerate(self.groups[lo:hi]):
            b_0 = events[0][1] * bt
            if gi == 0:
                kb.data_move(bias, (slice(0, 4 * hp),), B, (slice(0, 4 * hp),))
                if resident:
                    kb.data_move(wl1, (slice(None),) * 4, W, (slice(None),) * 4)
                    kb.data_move(rl1, (slice(None),) * 4, R, (slice(None),) * 4)
            kb.data_move(hl1[0], (slice(0, bt), slice(0, hp)), H0, (slice(b_0, b_0 + bt), slice(0, hp)))
            kb.data_move(c16, (slice(0, bt), slice(0, hp)), C0, (slice(b_0, b_0 + bt), slice(0, hp)))
            for j in range(nj):
                cols(kb, "conv", (cu, j * bt * hn, hn), [(c16, j * hn, hp)], bt, hn)
            for ev in events[1:]:
                tag, step = ev[0], ev[2]
                if tag == "x":
                    kb.data_move(xl1[step % 2], (slice(0, bt), slice(0, ip)), X,
                                 (step, slice(b_0, b_0 + bt), slice(0, ip)))
                    kb.loop()
                    continue
                j = ev[3]
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
                        widx = (slice(kq, kq + k1), slice(j * g1, (j + 1) * g1))
                        if wres is None:
                            kb.data_move(stream[qa], (slice(0, k1), slice(0, g1)), wg, widx)
                            kb.data_move(b0[qa], (slice(0, k1), slice(0, g1)), stream[qa], (slice(0, k1), slice(0, g1)))
                        else:
                            kb.data_move(b0[qa], (slice(0, k1), slice(0, g1)), wres, widx)
                        kb.mmad(gc[s], a0[qa], b0[qa], bt1, k1, g1, init=first)
                        first = False
                kb.data_move(gu, (slice(0, bt), slice(0, g)), gc[s], (slice(0, g1), slice(0, bt)), transform="nz2nd")
                cols(kb, "add", (gu, 0, g), [(gu, 0, g), (bias, j * g, 0)], bt, g)
                gate = lambda k: (gu, k * hn, g)  # noqa: E731  (i, o, f, c columns of the tile)
                cj = (cu, j * bt * hn, hn)
                cols(kb, "muls", gate(3), [gate(3)], bt, hn, 2.0)
                kb.vec("muls", VOp(gu), (VOp(gu),), bt * g, scalar=-1.0)
                kb.vec("exp", VOp(gu), (VOp(gu),), bt * g)
                kb.vec("adds", VOp(gu), (VOp(gu),), bt * g, scalar=1.0)
                kb.vec("rec", VOp(gu), (VOp(gu),), bt * g)
                cols(kb, "muls", gate(3), [gate(3)], bt, hn, 2.0)
                cols(kb, "adds", gate(3), [gate(3)], bt, hn, -1.0)
                cols(kb, "mul", cj, [cj, gate(2)], bt, hn)
                cols(kb, "mul", gate(0), [gate(0), gate(3)], bt, hn)
                cols(kb, "add", cj, [cj, gate(0)], bt, hn)
                cols(kb, "muls", gate(3), [cj], bt, hn, -2.0)
                cols(kb, "exp", gate(3), [gate(3)], bt, hn)
                cols(kb, "adds", gate(3), [gate(3)], bt, hn, 1.0)
                cols(kb, "rec", gate(3), [gate(3)], bt, hn)
                cols(kb, "muls", gate(3), [gate(3)], bt, hn, 2.0)
                cols(kb, "adds", gate(3), [gate(3)], bt, hn, -1.0)
                cols(kb, "mul", gate(0), [gate(1), gate(3)], bt, hn)
                cols(kb, "conv", (h16[s], 0, hn), [gate(0)], bt, hn)
                kb.data_move(Y, (step, slice(b_0, b_0 + bt), slice(j * hn, (j + 1) * hn)), h16[s],
                             (slice(0, bt), slice(0, hn)))
                kb.data_move(hl1[(step + 1) % 2], (slice(0, bt), slice(j * hn, (j + 1) * hn)), h16[s],
                             (slice(0, bt), slice(0, hn)))
        return kb.finish(gm_inputs=("X", "W", "R", "B", "H0", "C0"))
