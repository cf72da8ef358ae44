"""A TIK-style kernel builder: the lowerings allocate buffers and emit AI Core instructions.

Seed 000's Algorithm Y is written against TBE's TIK interface (`data_move`, `matmul`, ...); the
ascend lowerings (this package, `lower`, from a template's scheduled TIR) emit each
core's program the same way through `KernelBuilder`, and `lower.fit` dry-runs a config's buffers
through it. Allocation enforces each level's capacity and alignment (a `CapacityError` names
buffer, level, bytes); cube operands must be whole 16-aligned fractals; vector instructions are
split at 255 repeats.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....errors import OpcFailure
from ....sim.buffers import Arena
from ..machine import Machine
from ..program import (TRANS_BLOCKS, VEC_OPS, Barrier, Buf, ConvGeom, DataMove, IndirectMove, Instr, Load3D,
                       Mmad, Program, Scalar, SyncAll, Vec, VecTrans, VOp, region_bursts)


class KernelBuilder:
    """Emit one core's program. `core` / `active_cores` say which share of the work this is."""

    def __init__(self, machine: Machine, core: int = 0, active_cores: int = 1):
        self.m = machine
        self.core = core
        self.active_cores = active_cores
        self.instrs: list[Instr] = []
        self.bufs: list[Buf] = []
        self.gm_bufs: dict[str, Buf] = {}
        self.arenas = {lvl: Arena.of(lv) for lvl, lv in machine.levels.items()}
        self.info: dict[str, Any] = {}

    # -- memory -----------------------------------------------------------------------------

    def gm(self, name: str, shape: tuple[int, ...], dtype: str) -> Buf:
        """A tensor in global memory (HBM), laid out as the template's host-side packing says."""
        b = Buf(len(self.bufs), name, "GM", 0, tuple(int(s) for s in shape), dtype)
        self.bufs.append(b)
        self.gm_bufs[name] = b
        return b

    @property
    def top(self) -> dict[str, int]:
        """Bytes in use per on-chip level (the high-water mark: buffers are never freed)."""
        return {lvl: a.top for lvl, a in self.arenas.items()}

    def alloc(self, level: str, name: str, shape: tuple[int, ...], dtype: str) -> Buf:
        """Allocate in an on-chip level at its alignment; overflow raises CapacityError."""
        self.m.level(level)
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        off = self.arenas[level].alloc(name, nbytes, f"{name} is {shape} {dtype}")
        b = Buf(len(self.bufs), name, level, off, shape, dtype)
        self.bufs.append(b)
        return b

    # -- instructions -----------------------------------------------------------------------

    def _emit(self, ins: Instr, pipe: str, reads: tuple[Buf, ...], writes: tuple[Buf, ...]) -> Instr:
        ins.pipe, ins.reads, ins.writes = pipe, reads, writes
        self.instrs.append(ins)
        return ins

    def data_move(self, dst: Buf, dst_idx: tuple, src: Buf, src_idx: tuple, transform: str = "") -> None:
        """DMA / Load2D / L0C->UB, the pipe chosen by the target's data paths; `transform="nd2zz"`
        converts an ND region into zZ fractals (Load2D into L0A)."""
        path = self.m.path(src.level if src.level != "GM" else "GM", dst.level if dst.level != "GM" else "GM")
        elems, src_runs = region_bursts(src.shape, src_idx)
        delems, dst_runs = region_bursts(dst.shape, dst_idx)
        if elems != delems:
            raise OpcFailure(f"data_move {src.name} -> {dst.name}: {elems} elements into a {delems}-element region")
        if elems == 0:
            return
        nbytes = elems * src.itemsize
        if transform in ("nd2zz", "nd2fz"):
            want = "L0A" if transform == "nd2zz" else "L0B"
            if dst.level != want or len(dst.shape) != 4:
                raise OpcFailure(f"{transform} converts into {want} fractals, not {dst.level} {dst.shape}")
            src_runs = max(src_runs, elems // (dst.shape[3]))  # one 32 B row of K0 per fractal row
        elif transform == "nz2nd":
            if src.level != "L0C":
                raise OpcFailure(f"nz2nd reads L0C, not {src.level}")
            src_runs = max(src_runs, elems // 16)
        elif transform:
            raise OpcFailure(f"unknown data_move transform {transform!r}")
        ins = DataMove(dst=dst, dst_idx=dst_idx, src=src, src_idx=src_idx, path=(path.src, path.dst),
                       nbytes=nbytes, bursts=max(src_runs, dst_runs), transform=transform)
        self._emit(ins, path.pipe, (src,), (dst,))

    def indirect_move(self, dst: Buf, dst_idx: tuple, table: Buf, row_idx: tuple, index: Buf, pos: int) -> None:
        """An indirect DMA (`IndirectMove`): the box `row_idx` of `table` (a region of row 0,
        the row taken at execute time from `index[pos]`) into `dst[dst_idx]`; bytes, bursts and
        pipe as `data_move` of that box (a GM table: MTE2; a table resident in L1: MTE1's L1 -> UB
        path). It reads `index`: it waits for the move that filled it."""
        if table.level not in ("GM", "L1") or index.level == "GM" or row_idx[0] != slice(0, 1):
            raise OpcFailure(f"indirect_move reads rows of a GM or L1 table by an on-chip index, not "
                             f"{table.name} ({table.level}) {row_idx} by {index.name} ({index.level})")
        path = self.m.path(table.level, dst.level)
        elems, src_runs = region_bursts(table.shape, row_idx)
        delems, dst_runs = region_bursts(dst.shape, dst_idx)
        if elems != delems:
            raise OpcFailure(f"indirect_move {table.name} -> {dst.name}: {elems} elements into a "
                             f"{delems}-element region")
        ins = IndirectMove(dst=dst, dst_idx=dst_idx, src=table, src_idx=row_idx, path=(path.src, path.dst),
                           nbytes=elems * table.itemsize, bursts=max(src_runs, dst_runs), index=index, index_pos=pos)
        self._emit(ins, path.pipe, (table, index), (dst,))

    def load3d(self, dst: Buf, src: Buf, geom: ConvGeom, h0: int, c1_0: int, p0: int, mt: int, q0: int,
               kt1: int) -> None:
        """img2col from an L1 feature-map slice into L0A; checks at build time that the slice
        holds every input row the window needs."""
        if mt % 16 or mt // 16 > dst.shape[0] or kt1 > dst.shape[1]:
            raise OpcFailure(f"load3d of {mt} pixels x {kt1} K fractals does not fit {dst.name} {dst.shape}")
        g = geom
        last = min(p0 + mt, g.ho * g.wo) - 1
        if last >= p0:
            ry_all = [(q // g.s) % g.r for q in range(q0, q0 + kt1)]
            lo = (p0 // g.wo) * g.stride - g.pad_top + min(ry_all) * g.dilation
            hi = (last // g.wo) * g.stride - g.pad_top + max(ry_all) * g.dilation
            lo, hi = max(lo, 0), min(hi, g.h - 1)
            if lo < h0 or hi >= h0 + src.shape[1]:
                last_row = h0 + src.shape[1] - 1
                raise OpcFailure(f"load3d needs input rows {lo}..{hi} but {src.name} holds {h0}..{last_row}")
        path = self.m.path("L1", dst.level)
        ins = Load3D(dst=dst, src=src, geom=geom, h0=h0, c1_0=c1_0, p0=p0, mt=mt, q0=q0, kt1=kt1,
                     nbytes=mt * kt1 * dst.shape[3] * dst.itemsize)
        self._emit(ins, path.pipe, (src,), (dst,))

    def mmad(self, c: Buf, a: Buf, b: Buf, m1: int, k1: int, n1: int, c_n1_off: int = 0, init: bool = True) -> None:
        """Cube: C (+)= A x B on whole fractal tiles of L0A, L0B into L0C."""
        if (a.level, b.level, c.level) != ("L0A", "L0B", "L0C"):
            raise OpcFailure(f"mmad operands must be in L0A, L0B, L0C, got {a.level}, {b.level}, {c.level}")
        m0, k0, n0 = self.m.cube_shape(a.dtype)
        if a.shape[2:] != (m0, k0) or b.shape[2:] != (n0, k0) or c.shape[2] != n0:
            raise OpcFailure(f"mmad operands are not {m0}x{k0}x{n0} fractals: {a.shape}, {b.shape}, {c.shape}")
        if m1 > a.shape[0] or k1 > a.shape[1] or k1 > b.shape[0] or n1 > b.shape[1] \
                or c_n1_off + n1 > c.shape[0] or m1 * m0 > c.shape[1]:
            raise OpcFailure(f"mmad {m1}x{k1}x{n1} fractals overruns {a.name}{a.shape}, {b.name}{b.shape}, "
                             f"{c.name}{c.shape}")
        ins = Mmad(c=c, a=a, b=b, m1=m1, k1=k1, n1=n1, c_n1_off=c_n1_off, init=init,
                   acc_dtype=self.m.cube_acc[a.dtype])
        self._emit(ins, "M", (a, b) if init else (a, b, c), (c,))

    def vec(self, op: str, dst: VOp, srcs: tuple[VOp, ...], count: int, scalar: float = 0.0,
            contiguous: bool = True) -> None:
        """`count` elements of a vector op; contiguous operands (default strides) are split into
        instructions of at most 255 full repeats plus one masked tail repeat."""
        if op not in VEC_OPS:
            raise OpcFailure(f"unknown vector op {op!r}; known: {', '.join(VEC_OPS)}")
        width = max([dst.buf.itemsize] + [s.buf.itemsize for s in srcs])
        lanes = self.m.lanes(width)
        full, tail = divmod(count, lanes)
        done = 0
        while full > 0:
            rep = min(full, self.m.vec_max_repeat)
            self._vec(op, dst, srcs, rep, lanes, lanes, scalar, done, contiguous)
            done += rep * lanes
            full -= rep
        if tail:
            self._vec(op, dst, srcs, 1, tail, lanes, scalar, done, contiguous)

    def _vec(self, op, dst, srcs, rep, mask, lanes, scalar, done, contiguous) -> None:
        def shift(o: VOp, reduce_dst: bool = False) -> VOp:
            if not contiguous:
                return o
            if reduce_dst:
                return VOp(o.buf, o.offset + done // lanes, o.blk_stride, o.rep_stride)
            if op == "dups" and o is not dst:
                return o  # the scalar source stays put
            step = done if o.rep_stride else 0  # rep_stride 0: the same 256 B (e.g. a broadcast row)
            nblk = lanes * o.buf.itemsize // 32
            return VOp(o.buf, o.offset + step, o.blk_stride, o.rep_stride if o.rep_stride == 0 else nblk)

        d = shift(dst, op in ("cadd", "cmax"))
        ss = tuple(shift(s) for s in srcs)
        for o in (d, *ss):
            if o.buf.level != "UB":
                raise OpcFailure(f"vector operand {o.buf.name} is in {o.buf.level}; the vector unit works on UB")
        ins = Vec(op=op, dst=d, srcs=ss, repeat=rep, mask=mask, lanes=lanes, scalar=scalar)
        self._emit(ins, "V", tuple(s.buf for s in ss), (d.buf,))

    def vec_raw(self, op: str, dst: VOp, srcs: tuple[VOp, ...], repeat: int, mask: int | None = None,
                scalar: float = 0.0) -> None:
        """Vector instructions with explicit strides (e.g. block stride 0 to broadcast a block);
        more than 255 repeats continue in further instructions at the advanced addresses."""
        width = max([dst.buf.itemsize] + [s.buf.itemsize for s in srcs])
        lanes = self.m.lanes(width)

        def advance(o: VOp, reps: int) -> VOp:
            return VOp(o.buf, o.offset + reps * o.rep_stride * (32 // o.buf.itemsize), o.blk_stride, o.rep_stride)

        while repeat > 0:
            rep = min(repeat, self.m.vec_max_repeat)
            self._vec(op, dst, srcs, rep, mask or lanes, lanes, scalar, 0, False)
            repeat -= rep
            dst, srcs = advance(dst, rep), tuple(advance(s, rep) for s in srcs)

    def vec_items(self, op: str, dst: VOp, srcs: tuple[VOp, ...], items: int, item_elems: int,
                  strides: tuple[int, ...], scalar: float = 0.0) -> None:
        """`items` runs of `item_elems` contiguous elements (a whole number of 32 B blocks), the
        runs of operand k `strides[k]` elements apart (`strides[0]` is the destination's), e.g.
        pixels of 16 channels read with a window stride: each repeat takes one block of 8 runs
        (block stride = the run stride in blocks), and a run of b blocks takes b instructions,
        each on every b-th block; 8 runs per repeat, a masked repeat for the last items % 8."""
        ops = (dst, *srcs)
        width = max(o.buf.itemsize for o in ops)
        if any(o.buf.itemsize != width for o in ops):
            raise OpcFailure(f"vec_items {op}: operands of different widths")
        epb = 32 // width
        if item_elems % epb or any(s % epb for s in strides):
            raise OpcFailure(f"vec_items {op}: runs of {item_elems} elements {strides} apart are not whole blocks")
        full, tail = divmod(items, 8)
        for part in range(item_elems // epb):
            for reps, i0, mask in ((full, 0, 8 * epb), (1 if tail else 0, full * 8, tail * epb)):
                if reps == 0:
                    continue
                vo = [VOp(o.buf, o.offset + i0 * s + part * epb, s // epb, 8 * s // epb) for o, s in zip(ops, strides)]
                self.vec_raw(op, vo[0], tuple(vo[1:]), reps, mask, scalar=scalar)

    def vec_channel(self, op: str, dst: VOp, srcs: tuple[VOp, ...], rows: int, c0: int = 16,
                    scalar: float = 0.0) -> None:
        """A per-channel op over `rows` contiguous rows of `c0` channels: a source with block
        stride 0 is one row (the channel parameters) read again for every row. One 256 B repeat
        covers 8 rows; a row of b > 1 blocks (4-byte types) takes b instructions, each on every
        b-th block (fp32: two half-row instructions). Whole repeats: ceil(rows / 8) of them."""
        isz = dst.buf.itemsize
        epb = 32 // isz
        bpr = c0 // epb  # blocks per row
        if c0 % epb:
            raise OpcFailure(f"vec_channel {op}: rows of {c0} elements are not whole 32 B blocks")
        for part in range(bpr):
            o = part * epb

            def at(v: VOp, o: int = o) -> VOp:
                if v.blk_stride == 0:
                    return VOp(v.buf, v.offset + o, 0, 0)
                return VOp(v.buf, v.offset + o, bpr, 8 * bpr)

            self.vec_raw(op, at(dst), tuple(at(s) for s in srcs), ceil_div(rows, 8), scalar=scalar)

    def transpose(self, dst: Buf, dst_off: int, dst_row: int, src: Buf, src_off: int, src_row: int, rows: int,
                  cols: int, batch: tuple[int, int, int] = (1, 0, 0)) -> None:
        """A rows x cols matrix in UB (`src`: rows `src_row` elements apart, columns contiguous)
        transposed into cols x rows (`dst`: rows `dst_row` apart), `batch` = (count, source
        stride, destination stride) such matrices, by vnchwconv (`VecTrans`): blocks of 16 rows x
        one 32 B block of columns (16 fp16, 8 fp32), one repeat each, over the matrix padded to
        whole blocks (rows to 16, columns to 32 B): both buffers must hold the padding (its lanes
        move whatever UB holds there). The repeats run along the longest of the batch, row-band
        and column-block axes (at most 255 an instruction); one instruction per position of the
        other two. Every address is a whole 32 B block."""
        isz = src.itemsize
        if dst.itemsize != isz or isz not in (2, 4):
            raise OpcFailure(f"vnchwconv transposes 2- or 4-byte elements of one width, not {src.dtype} -> {dst.dtype}")
        if src.level != "UB" or dst.level != "UB":
            raise OpcFailure(f"vnchwconv works on UB, not {src.level} -> {dst.level}")
        epb = self.m.vec_block_bytes // isz
        per_row = TRANS_BLOCKS // epb  # destination blocks per transposed row (1 fp16, 2 fp32)
        nb, sb, db = batch
        nr, nc = ceil_div(rows, TRANS_BLOCKS), ceil_div(cols, epb)
        if any(v % epb for v in (dst_off, dst_row, src_off, src_row, sb, db)):
            raise OpcFailure(f"vnchwconv {src.name} -> {dst.name}: offsets and strides "
                             f"{src_off, src_row, dst_off, dst_row} are not whole 32 B blocks")
        s_top = src_off + (nb - 1) * sb + (nr * TRANS_BLOCKS - 1) * src_row + nc * epb
        d_top = dst_off + (nb - 1) * db + (nc * epb - 1) * dst_row + nr * TRANS_BLOCKS
        size = lambda b: int(np.prod(b.shape))  # noqa: E731
        if min(src_off, dst_off) < 0 or s_top > size(src) or d_top > size(dst):
            raise OpcFailure(f"vnchwconv of {rows} x {cols} (padded to {nr * 16} x {nc * epb}) overruns "
                             f"{src.name}{src.shape} or {dst.name}{dst.shape}")
        i = np.arange(TRANS_BLOCKS)
        s_rows = i * src_row  # block i of a repeat: source row i
        d_rows = (i // per_row) * dst_row + (i % per_row) * epb  # block i: its transposed row's part
        # (count, source step, destination step) in elements of the batch, row-band, column-block axes
        axes = [(nb, sb, db), (nr, TRANS_BLOCKS * src_row, TRANS_BLOCKS), (nc, epb, epb * dst_row)]
        k = max(range(3), key=lambda a: axes[a][0])
        others = [a for a in range(3) if a != k]
        n_rep, s_step, d_step = axes[k]
        for u in range(axes[others[0]][0]):
            for v in range(axes[others[1]][0]):
                so = src_off + u * axes[others[0]][1] + v * axes[others[1]][1]
                do = dst_off + u * axes[others[0]][2] + v * axes[others[1]][2]
                done = 0
                while done < n_rep:
                    rep = min(n_rep - done, self.m.vec_max_repeat)
                    a, b = so + done * s_step, do + done * d_step
                    ins = VecTrans(dst=dst, dst_addrs=tuple(int(x) for x in b + d_rows), src=src,
                                   src_addrs=tuple(int(x) for x in a + s_rows), repeat=rep, dst_rep=d_step // epb,
                                   src_rep=s_step // epb)
                    self._emit(ins, "V", (src,), (dst,))
                    done += rep

    def loop(self, iterations: int = 1) -> None:
        """Scalar cost of loop control for one iteration (counter, addresses, branch)."""
        ins = Scalar(n=self.m.loop_cycles * iterations)
        self._emit(ins, "S", (), ())

    def barrier(self) -> None:
        self._emit(Barrier(), "S", (), ())

    def sync_all(self) -> None:
        """A barrier across the active cores (Ascend C's SyncAll): this core's pipes drain, then
        it waits for the others."""
        self.barrier()
        self._emit(SyncAll(), "S", (), ())

    def finish(self, **info: Any) -> Program:
        self.info.update(info)
        return Program(machine=self.m, core=self.core, active_cores=self.active_cores, instrs=self.instrs,
                       bufs=self.bufs, gm=self.gm_bufs, high_water=self.top, info=self.info)


def split_even(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of share `index` when `total` items are split over `parts` (first shares larger)."""
    base, rem = divmod(total, parts)
    start = index * base + min(index, rem)
    return start, start + base + (1 if index < rem else 0)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


MAX_REP_STRIDE = 255  # blocks: the repeat stride field of a vector instruction


def group_sums(kb: KernelBuilder, dst: Buf, src: Buf, groups: int, per: int, width: int, pad: int) -> None:
    """dst[g, :width] = the in-order sum of src rows g*per .. g*per + per - 1 (rows `pad` elements
    apart): row 0 + row 1, then + row r. An add covers every group at once (one repeat per group,
    the source's repeat stride `per` rows) per chunk of the vector's lanes when `per` rows are within
    the instruction's repeat stride; else one add per group and row. One row per group is a copy.
    (A gather's bag sums, fm_interaction's field sums.)"""
    epb = 32 // src.itemsize
    lanes = kb.m.lanes(src.itemsize)
    if per == 1:
        kb.vec("copy", VOp(dst), (VOp(src),), groups * pad)
        return
    if per * pad // epb <= MAX_REP_STRIDE:
        for c in range(0, width, lanes):
            d = VOp(dst, c, 1, pad // epb)

            def row(r: int) -> VOp:
                return VOp(src, r * pad + c, 1, per * pad // epb)

            kb.vec_raw("add", d, (row(0), row(1)), groups, min(lanes, width - c))
            for r in range(2, per):
                kb.vec_raw("add", d, (d, row(r)), groups, min(lanes, width - c))
        return
    for q in range(groups):
        acc = VOp(dst, q * pad)
        kb.vec("add", acc, (VOp(src, q * per * pad), VOp(src, (q * per + 1) * pad)), width)
        for r in range(2, per):
            kb.vec("add", acc, (acc, VOp(src, (q * per + r) * pad)), width)

def walk_tiled(mod) -> dict[str, Any]:
    """The facts a hand-tiled vector kernel (gather, fm) is built from, read off its scheduled
    module: the GM tensors (name, shape, dtype: the function's parameters), the tile loop (the loop
    carrying `CORES`: its extent, cores and buffering) and, in program order, each nest carrying a
    `PRAGMA` with its loop's extent (`nests`: [(pragma, extent)])."""
    from tvm import tirx as T

    from ..intrin import CORES, PRAGMA, SLOTS

    f = mod["main"]
    found: dict[str, Any] = {"gm": [(b.name, tuple(int(s) for s in b.shape), str(b.dtype)) for b in f.params],
                             "nests": []}

    def visit(s):
        if isinstance(s, T.For):
            if CORES in s.annotations:
                found["tiles"] = int(s.extent)
                found["cores"] = int(s.annotations[CORES])
                found["slots"] = 2 if int(s.annotations.get(SLOTS, 0)) else 1
            pr = s.annotations.get(PRAGMA)
            if pr is not None:
                found["nests"].append((str(pr), int(s.extent)))
                return
            visit(s.body)
        elif isinstance(s, T.SeqStmt):
            for x in s.seq:
                visit(x)
        elif hasattr(s, "body"):
            visit(s.body)
        elif hasattr(s, "block"):
            visit(s.block)

    visit(f.body)
    return found


__all__ = ["KernelBuilder", "MAX_REP_STRIDE", "split_even", "ceil_div", "group_sums", "walk_tiled"]
