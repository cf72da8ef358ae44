"""The Ascend backend's TIR lowering: a scheduled TVM module -> AI Core programs.

Templates (`schedules/ascend/*_tir.py`) build an `s_tir.Schedule` over the op's TE compute, place
its buffers in the target's scopes and turn every inner block into an instruction, by
`tensorize` with the intrinsics of `intrin.py` or by its `substitute` (the instruction callback
`opc.ascend.tir.event`: every instruction block is a `T.call_packed(EVENT, tag, ...)` carrying
the offsets / block coordinates TVM computed); `lower` (the package) hands this module the module a
template scheduled. This module imports nothing from `schedules/`. It owns:

* `trace` (`lower/trace.py`): the event stream of the scheduled module, evaluated from the
  lowered function in vectorised form and cached per process under a key naming everything the
  schedule depends on (op, padded shape, tiles, L0 chunks, weight residency, epilogue group),
  not what only the emission decides (core count, ping-pong buffers);
* the translation of the event stream into `KernelBuilder` instructions (`GemmLowering`,
  `ConvLowering`): GM -> L1 DMAs, Load2D / Load3D into L0A / L0B, MMAD, L0C -> UB, the UB
  epilogue and the UB -> GM write, each core taking an even share of the output tiles, with
  ping-pong buffers when double buffering. Fractals that exist only as pad_einsum's padding
  (past the 16-padded K / N, pixels past H*W) are not issued, per-channel parameters are loaded
  once (conv: all channels; GEMM: per n tile, as the direct templates), and a feature-map DMA whose rows the same L1 buffer already holds is not
  repeated. The simulator then runs that program.
"""
from __future__ import annotations

from collections.abc import Sequence

from ....errors import OpcFailure
from .builder import KernelBuilder, split_even
from ..program import ConvGeom, Program, VOp
from ..intrin import EVENT, intrin_copy, intrin_init, intrin_mmad, l0c_slots, substitute  # noqa: F401 (re-exported)
from ..machine import Machine
from .trace import TRACES, trace  # noqa: F401 (the event stream of a schedule, re-exported)


def split_groups(events: Sequence[tuple], carry: tuple[str, ...] = ()) -> list[tuple[dict, list[tuple]]]:
    """The events of each output tile (a tile starts at its reduction init), with the last event
    of each `carry` tag seen before it (e.g. the feature-map DMA a pixel tile shares)."""
    groups: list[tuple[dict, list[tuple]]] = []
    state: dict[str, tuple] = {}
    for ev in events:
        if ev[0] in carry:
            state[ev[0]] = ev
        elif ev[0] == "init":
            groups.append((dict(state), [ev]))
        elif groups:
            groups[-1][1].append(ev)
    return groups


# -- events -> instructions ----------------------------------------------------------------------


def _mmad_chunk(kb: KernelBuilder, c0, a, b, m1: int, kn: int, nn: int, ev: tuple, inited: set[int]) -> None:
    """One (k, n) chunk's mmad L0A x L0B -> the L0C tile `c0` at the chunk's first channel block
    (from the `mmad` event `ev`), initialising each channel block with its first chunk; then its
    loop control."""
    nc0 = (ev[1] % ev[2]) // 16  # the chunk's first channel block in the L0C tile
    kb.mmad(c0, a, b, m1, kn, nn, c_n1_off=nc0, init=nc0 not in inited)
    inited.add(nc0)
    kb.loop()


def _close_steps(kb: KernelBuilder, steps: int, pending: tuple | None, flush, n1s: int) -> None:
    """Before a channel group's L0C -> UB: the last k step's loop control (where no group is
    pending), else the pending group's write to GM (`flush`)."""
    if steps and pending is None:
        kb.loop()  # the last k step's loop control
    if pending is not None:
        flush(pending, n1s)


class GemmLowering:
    """A GEMM trace -> one core's program. Events (GEMM coordinates of each instruction's first
    element): `dma_a` / `dma_b` (one k step of A / B, GM -> L1), `ld_a` (one L0 chunk of A, L1 ->
    L0A by Load2D), `ld_b` (one (k, n) chunk of B, L1 -> L0B), `mmad` (its chunk's offset in the
    L0C tile), `l0c`, and the epilogue blocks (`bias`, `cast`, `relu`). GM: A as zZ fractals
    (M1, K1, 16, K0) or ND (M1*16, K1*K0) converted to zZ by Load2D (`a_nd`), B FRACTAL_Z
    (K1, N1, 16, K0), C NZ (N1, M1*16, 16), bias (N1, 16); K0 = 16 for fp16 (fp32 accumulation,
    fp16 out), 32 for int8 (int32 accumulation and out, no cast). Fractals past the padded shape
    (the tile padding pad_einsum adds) are not issued.

    A batched GEMM (`batch` > 0, batch_matmul): the events of A, C and the epilogue (and of B
    unless every batch shares it, `bcast_b`) lead with the batch coordinate, which is the same
    for every event of an output tile; each GM tensor leads with the batch axis (B not when
    shared), and a tile's instructions are its batch's GEMM's."""

    EPILOGUE = ("bias", "cast", "relu")

    def __init__(self, m: Machine, events: Sequence[tuple], dims: tuple[int, int, int],
                 tiles: tuple[int, int, int], chunks: tuple[int, int], slots: int, has_bias: bool, a_nd: bool,
                 group: int, dtype: str = "float16", batch: int = 0, bcast_b: bool = False):
        self.m, self.dims, self.tiles, self.chunks, self.dtype = m, dims, tiles, chunks, dtype
        self.slots, self.has_bias, self.a_nd, self.g = slots, has_bias, a_nd, group // 16
        self.batch, self.bcast_b = batch, bcast_b
        self.groups = [g for _, g in split_groups(events)]
        self.batch_of = [0] * len(self.groups)
        if batch:
            self.batch_of, self.groups = map(list, zip(*(self._unbatch(g) for g in self.groups)))
        self.cslots = l0c_slots(m, slots == 2, tiles[0] * tiles[2] * 4)

    def _unbatch(self, events: Sequence[tuple]) -> tuple[int, list[tuple]]:
        """An output tile's batch and its events with the batch coordinate taken off (the events
        of the unbatched GEMM)."""
        lead = ("dma_a", "ld_a", "l0c", "out", *self.EPILOGUE) + (() if self.bcast_b else ("dma_b", "ld_b"))
        seen = {ev[1] for ev in events if ev[0] in lead}
        if len(seen) != 1:
            raise OpcFailure(f"a batched GEMM tile's events name batches {sorted(seen)}, not one")
        return seen.pop(), [(ev[0], *ev[2:]) if ev[0] in lead else ev for ev in events]

    def program(self, core: int, active: int) -> Program:
        dt = self.dtype
        cast = dt == "float16"  # fp16: fp32 accumulation cast to fp16; int8: int32 throughout
        acc_dt, out_dt, k0 = ("float32", "float16", 16) if cast else ("int32", "int32", 32)
        M1, K1, N1 = self.dims[0] // 16, self.dims[1] // k0, self.dims[2] // 16
        mt, kt, nt = self.tiles
        mt1, kt1, nt1 = mt // 16, kt // k0, nt // 16
        k0c, n0c = self.chunks[0] // k0, self.chunks[1] // 16
        slots, groups, nd = self.slots, self.groups, self.a_nd
        kb = KernelBuilder(self.m, core, active)
        lead = (self.batch,) if self.batch else ()  # the GM tensors' batch axis (B's unless shared)
        A = kb.gm("A", (*lead, M1 * 16, K1 * k0) if nd else (*lead, M1, K1, 16, k0), dt)
        B = kb.gm("B", (() if self.bcast_b else lead) + (K1, N1, 16, k0), dt)
        C = kb.gm("C", (*lead, N1, M1 * 16, 16), out_dt)
        a1 = [kb.alloc("L1", f"A_L1_{s}", (mt, kt) if nd else (mt1, kt1, 16, k0), dt) for s in range(slots)]
        b1 = [kb.alloc("L1", f"B_L1_{s}", (kt1, nt1, 16, k0), dt) for s in range(slots)]
        l0a = [kb.alloc("L0A", f"A_L0A_{s}", (mt1, k0c, 16, k0), dt) for s in range(slots)]
        l0b = [kb.alloc("L0B", f"B_L0B_{s}", (k0c, n0c, 16, k0), dt) for s in range(slots)]
        c0s = [kb.alloc("L0C", f"C_L0C_{s}", (nt1, mt, 16), acc_dt) for s in range(self.cslots)]
        ub = []
        for s in range(slots):
            acc_s = kb.alloc("UB", f"acc_UB_{s}", (self.g, mt, 16), acc_dt)
            ub.append((acc_s, kb.alloc("UB", f"out_UB_{s}", (self.g, mt, 16), out_dt) if cast else acc_s))
        if self.has_bias:
            bias_gm = kb.gm("bias", (N1, 16), out_dt)
            b16 = kb.alloc("UB", "bias_UB", (nt1, 16), out_dt)
            b32 = kb.alloc("UB", "bias32_UB", (nt1, 16), acc_dt) if cast else b16
        lo, hi = split_even(len(groups), active, core)
        nl1 = na = nb = ne = 0
        cur_bias = None
        for gi, events in enumerate(groups[lo:hi]):
            c0 = c0s[gi % self.cslots]
            acc, o16 = ub[0]
            inited: set[int] = set()
            m1s = n1s = qstep = steps = kq = kn = nn = aslot = bslot = gj = gn = 0
            mm1, nn_t = mt1, nt1
            al, bl = a1[0], b1[0]
            pending: tuple | None = None
            pa = (self.batch_of[lo + gi],) if self.batch else ()  # the tile's batch in A and C
            pb = () if self.bcast_b else pa  # and in B

            def flush(pend: tuple, n1s: int) -> None:  # a channel group's last epilogue block wrote GM (MTE3)
                pj, pn, pbuf, pm1s, pmm1 = pend
                kb.data_move(C, (*pa, slice(n1s + pj, n1s + pj + pn), slice(pm1s * 16, (pm1s + pmm1) * 16)), pbuf,
                             (slice(0, pn), slice(0, pmm1 * 16)))
                kb.loop()

            for ev in events:
                tag = ev[0]
                if tag == "dma_a":  # one k step of A: GM -> L1 (A and B share the step's L1 slot)
                    m1s, qstep = ev[1] // 16, ev[2] // k0
                    mm1, kq = min(mt1, M1 - m1s), min(kt1, K1 - qstep)
                    if kq > 0:
                        if steps:
                            kb.loop()  # the previous k step's loop control
                        steps += 1
                        al, bl = a1[nl1 % slots], b1[nl1 % slots]
                        nl1 += 1
                        if nd:
                            kb.data_move(al, (slice(0, mm1 * 16), slice(0, kq * k0)), A,
                                         (*pa, slice(m1s * 16, (m1s + mm1) * 16), slice(qstep * k0, (qstep + kq) * k0)))
                        else:
                            kb.data_move(al, (slice(0, mm1), slice(0, kq)), A,
                                         (*pa, slice(m1s, m1s + mm1), slice(qstep, qstep + kq)))
                elif tag == "dma_b" and kq > 0:  # the step's B: GM (FRACTAL_Z) -> L1
                    n1s = ev[2] // 16
                    nn_t = min(nt1, N1 - n1s)
                    kb.data_move(bl, (slice(0, kq), slice(0, nn_t)), B,
                                 (*pb, slice(qstep, qstep + kq), slice(n1s, n1s + nn_t)))
                elif tag == "ld_a":  # one L0 chunk of K: L1 -> L0A (Load2D; ND -> zZ on the way)
                    kc = ev[2] // k0 - qstep
                    kn = min(k0c, K1 - ev[2] // k0)
                    if kn > 0:
                        aslot = na % slots
                        na += 1
                        if nd:
                            kb.data_move(l0a[aslot], (slice(0, mm1), slice(0, kn)), al,
                                         (slice(0, mm1 * 16), slice(kc * k0, (kc + kn) * k0)), transform="nd2zz")
                        else:
                            kb.data_move(l0a[aslot], (slice(0, mm1), slice(0, kn)), al,
                                         (slice(0, mm1), slice(kc, kc + kn)))
                elif tag == "ld_b" and kn > 0:  # one (k, n) chunk: L1 -> L0B
                    kc, nc0 = ev[1] // k0 - qstep, ev[2] // 16 - n1s
                    nn = min(n0c, nn_t - nc0)
                    if nn > 0:
                        bslot = nb % slots
                        nb += 1
                        kb.data_move(l0b[bslot], (slice(0, kn), slice(0, nn)), bl,
                                     (slice(kc, kc + kn), slice(nc0, nc0 + nn)))
                elif tag == "mmad" and kn > 0 and nn > 0:
                    _mmad_chunk(kb, c0, l0a[aslot], l0b[bslot], mm1, kn, nn, ev, inited)
                elif tag == "l0c":  # one channel group of the tile: L0C -> UB
                    _close_steps(kb, steps, pending, flush, n1s)
                    pending = None
                    gj = ev[2] // 16 - n1s
                    gn = min(self.g, nn_t - gj)  # channel blocks past N: pad_einsum's padding, not issued
                    if gn > 0:
                        acc, o16 = ub[ne % slots]
                        ne += 1
                        kb.data_move(acc, (slice(0, gn), slice(0, mm1 * 16)), c0,
                                     (slice(gj, gj + gn), slice(0, mm1 * 16)))
                        pending = (gj, gn, o16, m1s, mm1)
                elif tag == "bias" and gn > 0:  # the n tile's bias, to fp32 once, added to every row
                    if cur_bias != n1s:
                        kb.data_move(b16, (slice(0, nn_t),), bias_gm, (slice(n1s, n1s + nn_t),))
                        if cast:
                            kb.vec("conv", VOp(b32), (VOp(b16),), nn_t * 16)
                        cur_bias = n1s
                    for jj in range(gn):
                        channel_op(kb, "add", acc, jj * mt * 16, mm1 * 16, b32, (gj + jj) * 16)
                elif tag == "cast" and gn > 0:
                    _rows_op(kb, "conv", o16, acc, gn, mt, mm1 * 16)
                elif tag == "relu" and gn > 0:
                    _rows_op(kb, "relu", o16, o16, gn, mt, mm1 * 16)
            if pending is not None:
                flush(pending, n1s)
            kb.loop()
        return kb.finish(gm_inputs=("A", "B", "bias"))


def channel_op(kb: KernelBuilder, op: str, buf, off: int, rows: int, param, poff: int) -> None:
    """dst[row, c0] = dst[row, c0] <op> param[c0] over `rows` rows of 16 channels in UB (block
    stride 0 broadcasts the 32 B parameter block; 4-byte types take two instructions)."""
    if buf.itemsize == 2:
        kb.vec_raw(op, VOp(buf, off, 1, 8), (VOp(buf, off, 1, 8), VOp(param, poff, 0, 0)), -(-rows // 8))
    else:
        for half in (0, 1):
            o = off + half * 8
            kb.vec_raw(op, VOp(buf, o, 2, 16), (VOp(buf, o, 2, 16), VOp(param, poff + half * 8, 0, 0)),
                       -(-rows // 8))


def _rows_op(kb: KernelBuilder, op: str, dst, srcs, nblk: int, mt: int, rows: int, scalar: float = 0.0) -> None:
    """A vector op over `rows` of each of `nblk` (mt, 16) channel blocks in UB (`srcs`: one buffer
    or several): one contiguous run when every row is live, else one run per block."""
    srcs = srcs if isinstance(srcs, (list, tuple)) else (srcs,)
    if rows == mt:
        kb.vec(op, VOp(dst), tuple(VOp(s) for s in srcs), nblk * mt * 16, scalar=scalar)
    else:
        for jj in range(nblk):
            kb.vec(op, VOp(dst, jj * mt * 16), tuple(VOp(s, jj * mt * 16) for s in srcs), rows * 16, scalar=scalar)


def _hardswish(kb: KernelBuilder, o16, tmp, nblk: int, mt: int, rows: int) -> None:
    """HardSwish in place on the fp16 output tile (the catalogue step's order): t = x + 3,
    clipped to [0, 6] (min, then max), times 1/6; x * t."""
    _rows_op(kb, "adds", tmp, o16, nblk, mt, rows, 3.0)
    _rows_op(kb, "mins", tmp, tmp, nblk, mt, rows, 6.0)
    _rows_op(kb, "maxs", tmp, tmp, nblk, mt, rows, 0.0)
    _rows_op(kb, "muls", tmp, tmp, nblk, mt, rows, 1.0 / 6.0)
    _rows_op(kb, "mul", o16, (o16, tmp), nblk, mt, rows)


class ConvLowering:
    """An implicit-GEMM conv trace -> one core's program. Events: `fmap` (the pixel tile's input
    rows GM -> L1, carried by the tiles that share it), `w_res` (a resident weight slice, carried)
    or `w_l1` (one k step's weights GM -> L1), `load3d` (img2col of one L0 chunk), `ld_b` (one
    (k, n) chunk L1 -> L0B, at GEMM coordinates), `mmad` (its chunk's offset in the L0C tile),
    `l0c`, and the epilogue blocks. GM: data NC1HWC0, weight
    FRACTAL_Z (C1*R*S, K1, 16, C0), out NC1HWC0 with H*W flattened, per-channel params (K1, 16).

    Grouped convolution (`conv_groups` > 1): the trace's GEMMs carry a group axis (image, group,
    M, N, K); each (image, group) pair is one GEMM over its group's channels, each group padded
    to whole C0 / 16 blocks. GM: data (N*G, C1, H, W, C0), weight (G*C1*R*S, K1, 16, C0), out
    (N*G, K1, H*W, 16), params (G*K1, 16), C1 and K1 per group (the direct template's layouts)."""

    EPILOGUE = ("bias", "cast", "bn", "res", "relu", "hswish")

    def __init__(self, m: Machine, events: Sequence[tuple], geom: ConvGeom, n: int, c1: int, n1: int,
                 tiles: tuple[int, int, int], chunks: tuple[int, int], slots: int, bias: bool, bn: bool,
                 resident: bool, group: int, dtype: str = "float16", conv_groups: int = 1, res: bool = False,
                 hswish: bool = False):
        self.hswish = hswish
        self.m, self.geom, self.n, self.c1, self.n1 = m, geom, n * conv_groups, c1, n1
        self.tiles, self.chunks, self.slots, self.bias, self.bn = tiles, chunks, slots, bias, bn
        self.resident, self.g, self.dtype, self.cg, self.res = resident, group // 16, dtype, conv_groups, res
        self.q_all = c1 * geom.r * geom.s  # K fractals (FRACTAL_Z order: c1, ry, rx)
        if conv_groups > 1:
            events = [self._ungroup(ev, c1 * (16 if dtype == "float16" else 32)) for ev in events]
        self.groups = split_groups(events, carry=("fmap", "w_res"))
        self.rows_max = max(hi - lo + 1 for lo, hi in (self.rows(st["fmap"], evs) for st, evs in self.groups))
        self.cslots = l0c_slots(m, slots == 2, tiles[0] * tiles[2] * 4)

    def _ungroup(self, ev: tuple, cpg: int) -> tuple:
        """A grouped trace's event in the ungrouped form, (image, group) as the image index
        image*G + group; the weight events name their group last (its slice starts at group*C1*R*S
        in GM)."""
        tag, G = ev[0], self.cg
        if tag == "fmap":  # (image, first channel, row, col, rows): the group is the channel block
            return (tag, ev[1] * G + ev[2] // cpg, ev[2] % cpg, *ev[3:])
        if tag in ("load3d", "l0c"):  # (image, group, pixel, k or n)
            return (tag, ev[1] * G + ev[2], *ev[3:])
        if tag == "ld_b":  # (group, K, N): the group's slice is the one in L1
            return (tag, *ev[2:])
        if tag in ("w_l1", "w_res"):  # (group, K, N) -> (K, N, group)
            return (tag, *ev[2:], ev[1])
        return ev

    def rows(self, ev: tuple, events: Sequence[tuple]) -> tuple[int, int]:
        """In-image input rows of a feature-map event (its rows are in padded coordinates), without
        those only pad_einsum's pixels past H*W would read (the tile's Load3Ds give its first pixel)."""
        g = self.geom
        lo_p, ext = ev[3], ev[5]
        p0 = next((e[2] for e in events if e[0] == "load3d"), 0)
        last = min(p0 + self.tiles[0], g.ho * g.wo) - 1
        hi_real = (last // g.wo) * g.stride - g.pad_top + (g.r - 1) * g.dilation
        lo, hi = max(lo_p - g.pad_top, 0), min(lo_p + ext - 1 - g.pad_top, hi_real, g.h - 1)
        if hi < lo:  # every row the tile reads is padding: one real row in L1 for Load3D to address
            lo = hi = min(lo, g.h - 1)
        return lo, hi

    def program(self, core: int, active: int) -> Program:
        g, slots, groups, q_all, n1 = self.geom, self.slots, self.groups, self.q_all, self.n1
        mt, kt, nt = self.tiles
        dt = self.dtype
        cast = dt == "float16"  # fp16: fp32 accumulation cast to fp16; int8: int32 throughout
        acc_dt, out_dt, k0 = ("float32", "float16", 16) if cast else ("int32", "int32", 32)
        mt1, kt1, nt1 = mt // 16, kt // k0, nt // 16
        k0c, n0c = self.chunks[0] // k0, self.chunks[1] // 16
        hw = g.ho * g.wo
        kb = KernelBuilder(self.m, core, active)
        X = kb.gm("data", (self.n, self.c1, g.h, g.w, k0), dt)
        G = self.cg
        W = kb.gm("weight", (G * q_all, n1, 16, k0), dt)
        Y = kb.gm("out", (self.n, n1, hw, 16), out_dt)
        fm = [kb.alloc("L1", f"fmap_L1_{i}", (self.c1, self.rows_max, g.w, k0), dt) for i in range(slots)]
        if self.resident:
            wres = kb.alloc("L1", "W_res_L1", (q_all, nt1, 16, k0), dt)
        else:
            wl1 = [kb.alloc("L1", f"W_L1_{i}", (kt1, nt1, 16, k0), dt) for i in range(slots)]
        l0a = [kb.alloc("L0A", f"A_L0A_{i}", (mt1, k0c, 16, k0), dt) for i in range(slots)]
        l0b = [kb.alloc("L0B", f"B_L0B_{i}", (k0c, n0c, 16, k0), dt) for i in range(slots)]
        c0s = [kb.alloc("L0C", f"C_L0C_{i}", (nt1, mt, 16), acc_dt) for i in range(self.cslots)]
        accs = [kb.alloc("UB", f"acc_UB_{i}", (self.g, mt, 16), acc_dt) for i in range(slots)]
        o16s = [kb.alloc("UB", f"out_UB_{i}", (self.g, mt, 16), out_dt) for i in range(slots)] if cast else accs
        pn1 = G * n1  # every group's per-channel parameters
        if self.bias:
            bias_gm = kb.gm("bias", (pn1, 16), out_dt)
            b16 = kb.alloc("UB", "bias_UB", (pn1, 16), out_dt)
            b32 = kb.alloc("UB", "bias32_UB", (pn1, 16), acc_dt) if cast else b16
        if self.bn:
            sc_gm, sh_gm = kb.gm("scale", (pn1, 16), "float16"), kb.gm("shift", (pn1, 16), "float16")
            sc, sh = kb.alloc("UB", "scale_UB", (pn1, 16), "float16"), kb.alloc("UB", "shift_UB", (pn1, 16), "float16")
        if self.res:  # `res`: a residual in the output's layout, added in the epilogue (conv + eltwise)
            R = kb.gm("res", (self.n, n1, hw, 16), out_dt)
            rbufs = [kb.alloc("UB", f"res_UB_{i}", (self.g, mt, 16), out_dt) for i in range(slots)]
        if self.hswish:  # HardSwish's clip(x + 3, 0, 6) / 6 beside x
            hbufs = [kb.alloc("UB", f"hs_UB_{i}", (self.g, mt, 16), out_dt) for i in range(slots)]
        lo_g, hi_g = split_even(len(groups), active, core)
        na = nb = nw = nfm = ne = 0
        cur_fm, cur_w, h0, f = None, None, 0, fm[0]
        params = False  # per-channel parameters in UB
        wbuf = wres if self.resident else wl1[0]
        for gi, (carry, events) in enumerate(groups[lo_g:hi_g]):
            c0, acc, o16 = c0s[gi % self.cslots], accs[0], o16s[0]
            fev = carry["fmap"]
            if fev != cur_fm:  # the pixel tile's input rows, all channel blocks: GM -> L1
                lo, hi = self.rows(fev, events)
                f = fm[nfm % slots]
                nfm += 1
                kb.data_move(f, (slice(None), slice(0, hi - lo + 1)), X, (fev[1], slice(None), slice(lo, hi + 1)))
                cur_fm, h0 = fev, lo
            n1s = 0
            if self.resident:  # the n tile's whole weight slice, loaded once for the tiles that share it
                n1s = carry["w_res"][2] // 16
                if carry["w_res"] != cur_w:
                    nn = min(nt1, n1 - n1s)
                    wq = carry["w_res"][3] * q_all if G > 1 else 0  # the group's slice
                    kb.data_move(wres, (slice(None), slice(0, nn)), W,
                                 (slice(wq, wq + q_all), slice(n1s, n1s + nn)))
                    cur_w = carry["w_res"]
            nn_t = min(nt1, n1 - n1s)
            inited: set[int] = set()
            kn = nn = steps = qstep = gj = gn = poff = 0
            m1 = mt1
            pending: tuple | None = None

            def flush(pend: tuple, n1s: int) -> None:  # a channel group's last epilogue block wrote GM (MTE3)
                pb, pp0, pj, pn, pbuf = pend
                valid = min(mt, hw - pp0)
                kb.data_move(Y, (pb, slice(n1s + pj, n1s + pj + pn), slice(pp0, pp0 + valid)), pbuf,
                             (slice(0, pn), slice(0, valid)))
                kb.loop()

            aslot = bslot = 0
            b = p0 = 0
            for ev in events:
                tag = ev[0]
                if tag == "w_l1":  # one k step's weights: GM -> L1
                    q0, n1s = ev[1] // k0, ev[2] // 16
                    qstep = q0
                    nn_t = min(nt1, n1 - n1s)
                    kq = min(kt1, q_all - q0)  # pad_einsum's K padding is zero on both sides: not issued
                    if kq > 0:
                        wbuf = wl1[nw % slots]
                        nw += 1
                        wq = ev[3] * q_all if G > 1 else 0  # the group's slice
                        kb.data_move(wbuf, (slice(0, kq), slice(0, nn_t)), W,
                                     (slice(wq + q0, wq + q0 + kq), slice(n1s, n1s + nn_t)))
                elif tag == "load3d":  # img2col of one L0 chunk of K
                    b, p0, q0 = ev[1], ev[2], ev[3] // k0
                    m1 = min(mt1, -(-(hw - p0) // 16))  # pad_einsum's pixel padding past H*W: not issued
                    if q0 % kt1 == 0 and q0 < q_all:
                        if steps:
                            kb.loop()  # the previous k step's loop control
                        steps += 1
                    kn = min(k0c, q_all - q0)
                    if kn > 0:
                        aslot = na % slots
                        na += 1
                        kb.load3d(l0a[aslot], f, g, h0=h0, c1_0=0, p0=p0, mt=m1 * 16, q0=q0, kt1=kn)
                elif tag == "ld_b" and kn > 0:  # one (k, n) chunk of the L1 weights -> L0B
                    row, col = ev[1], ev[2]  # (K, N) of the chunk's first element in the GEMM
                    kq0, nc0 = row // k0 - (0 if self.resident else qstep), col // 16 - n1s
                    nn = min(n0c, nn_t - nc0)
                    if nn > 0:
                        bslot = nb % slots
                        nb += 1
                        kb.data_move(l0b[bslot], (slice(0, kn), slice(0, nn)), wbuf,
                                     (slice(kq0, kq0 + kn), slice(nc0, nc0 + nn)))
                elif tag == "mmad" and kn > 0 and nn > 0:
                    _mmad_chunk(kb, c0, l0a[aslot], l0b[bslot], m1, kn, nn, ev, inited)
                elif tag == "l0c":  # one channel group of the tile: L0C -> UB
                    _close_steps(kb, steps, pending, flush, n1s)
                    pending = None
                    b, p0, gj = ev[1], ev[2], ev[3] // 16 - n1s
                    gn = min(self.g, nn_t - gj)  # channel blocks past K: pad_einsum's padding, not issued
                    if gn > 0:
                        acc, o16 = accs[ne % slots], o16s[ne % slots]
                        ne += 1
                        kb.data_move(acc, (slice(0, gn), slice(0, m1 * 16)), c0, (slice(gj, gj + gn), slice(0, m1 * 16)))
                        pending = (b, p0, gj, gn, o16)
                        poff = (b % G) * n1 + n1s  # the group's first parameter block
                elif tag in ("bias", "bn") and gn > 0 and not params:
                    # every output channel's parameters, loaded once and kept in UB (as the direct template)
                    if tag == "bias":
                        kb.data_move(b16, (slice(None),), bias_gm, (slice(None),))
                        if cast:
                            kb.vec("conv", VOp(b32), (VOp(b16),), pn1 * 16)
                    else:
                        kb.data_move(sc, (slice(None),), sc_gm, (slice(None),))
                        kb.data_move(sh, (slice(None),), sh_gm, (slice(None),))
                    params = True
                if gn <= 0:
                    continue
                if tag == "bias":
                    for jj in range(gn):
                        channel_op(kb, "add", acc, jj * mt * 16, m1 * 16, b32, (poff + gj + jj) * 16)
                elif tag == "cast":
                    _rows_op(kb, "conv", o16, acc, gn, mt, m1 * 16)
                elif tag == "bn":
                    for op, prm in (("mul", sc), ("add", sh)):
                        for jj in range(gn):
                            channel_op(kb, op, o16, jj * mt * 16, m1 * 16, prm, (poff + gj + jj) * 16)
                elif tag == "res":  # this channel group's residual rows GM -> UB, added to the output
                    rb = rbufs[(ne - 1) % slots]
                    valid = min(mt, hw - p0)
                    kb.data_move(rb, (slice(0, gn), slice(0, valid)), R,
                                 (b, slice(n1s + gj, n1s + gj + gn), slice(p0, p0 + valid)))
                    if m1 * 16 == mt:
                        kb.vec("add", VOp(o16), (VOp(o16), VOp(rb)), gn * mt * 16)
                    else:
                        for jj in range(gn):
                            kb.vec("add", VOp(o16, jj * mt * 16), (VOp(o16, jj * mt * 16), VOp(rb, jj * mt * 16)),
                                   m1 * 16 * 16)
                elif tag == "relu":
                    _rows_op(kb, "relu", o16, o16, gn, mt, m1 * 16)
                elif tag == "hswish":
                    _hardswish(kb, o16, hbufs[(ne - 1) % slots], gn, mt, m1 * 16)
            if pending is not None:
                flush(pending, n1s)
            kb.loop()
        return kb.finish(gm_inputs=("data", "weight", "bias", "scale", "shift", "res"))


__all__ = [
    "EVENT",
    "TRACES",
    "ConvLowering",
    "GemmLowering",
    "intrin_copy",
    "intrin_init",
    "intrin_mmad",
    "l0c_slots",
    "split_groups",
    "substitute",
    "trace",
]
