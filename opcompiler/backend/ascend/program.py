"""The AI Core program: buffers, instructions and their semantics, and the program containers.

Each instruction knows its pipe, the buffers it reads and writes (the timing model, `timing`, orders pipes
by these, as set_flag/wait_flag would), its cost inputs (bytes, bursts, repeats, fractals)
and, in functional mode, how to execute itself on numpy views of the simulated memories.

Layouts on chip (fp16; int8 uses K0 = C0 = 32):
    L0A  (M1, K1, 16, K0)    zZ: row-major fractals, each 16 rows x K0
    L0B  (K1, N1, 16, K0)    FRACTAL_Z: each fractal stored as 16 columns x K0
    L0C  (N1, M, 16)         NZ: the (N1, M1, M0, N0) fractal layout, fp32 / int32
    L1 feature map (C1, rows, W, C0)   a slice of NC1HWC0 rows for Load3D

Each instruction's `cost_cycles` is the timing model's cost of it (`timing.cost` calls it; its
twin for what an execution did is `fclock`). `Program` is one core's instruction stream (what
`lower.builder.KernelBuilder` emits) and `Plan` what a lowering hands the backend: how to emit
each core's program and how the host packs the inputs and unpacks the output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Any, Callable

import numpy as np

from ...errors import OpcFailure
from ...sim.instr import Instruction
from ...sim.program import SimProgram
from .machine import Machine


@dataclass(frozen=True, eq=False)
class Buf:
    """A buffer in one memory level: GM tensors have level "GM" and offset 0."""

    id: int
    name: str
    level: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.itemsize


class Memory:
    """Simulated memories for one core: a byte arena per on-chip level, plus the shared GM tensors."""

    def __init__(self, capacities: dict[str, int], gm: dict[str, np.ndarray]):
        self.arenas = {lvl: np.zeros(cap, np.uint8) for lvl, cap in capacities.items()}
        self.gm = gm
        self._views: dict[int, np.ndarray] = {}
        # what the executing instruction touched, in order: (buffer, "r" | "w"); None: not recorded
        self.log: list[tuple[Buf, str]] | None = None

    def load(self, b: Buf) -> np.ndarray:
        """The buffer, read by the executing instruction."""
        if self.log is not None:
            self.log.append((b, "r"))
        return self.view(b)

    def store(self, b: Buf) -> np.ndarray:
        """The buffer, written by the executing instruction."""
        if self.log is not None:
            self.log.append((b, "w"))
        return self.view(b)

    def update(self, b: Buf) -> np.ndarray:
        """The buffer, read and written (an accumulation)."""
        if self.log is not None:
            self.log += [(b, "r"), (b, "w")]
        return self.view(b)

    def view(self, b: Buf) -> np.ndarray:
        v = self._views.get(b.id)
        if v is None:
            if b.level == "GM":
                v = self.gm[b.name]
                if tuple(v.shape) != b.shape or str(v.dtype) != b.dtype:
                    raise OpcFailure(f"GM tensor {b.name} is {v.shape} {v.dtype}, program expects {b.shape} {b.dtype}")
            else:
                v = self.arenas[b.level][b.offset:b.offset + b.nbytes].view(b.dtype).reshape(b.shape)
            self._views[b.id] = v
        return v


def region_bursts(shape: tuple[int, ...], idx: tuple) -> tuple[int, int]:
    """(elements, contiguous runs) of `array[idx]` for a C-contiguous array and basic slices."""
    sizes, full = [], []
    for d, n in enumerate(shape):
        s = idx[d] if d < len(idx) else slice(None)
        if isinstance(s, int):
            sizes.append(1)
            full.append(n == 1)
        else:
            a, b, st = s.indices(n)
            cnt = max(0, (b - a + (st - (1 if st > 0 else -1))) // st)
            sizes.append(cnt)
            full.append(cnt == n and st == 1)
    elems = int(np.prod(sizes)) if sizes else 1
    run = 1
    for d in range(len(shape) - 1, -1, -1):
        run *= sizes[d]
        if not full[d]:
            break
    return elems, max(1, elems // max(run, 1)) if elems else 0


@dataclass(eq=False)
class Instr(Instruction):
    """Base instruction (the simulator core's protocol): `pipe`, buffers read and written,
    `cost_cycles` on a machine (GM transfers at the contended rates `timing` passes), `cycles`
    (the last cost `timing` computed) and `execute` on simulated memories."""

    pipe: str = field(init=False, default="S")
    reads: tuple[Buf, ...] = field(init=False, default=())
    writes: tuple[Buf, ...] = field(init=False, default=())
    cycles: int = field(init=False, default=0)

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return 0

    def execute(self, mem: Memory) -> None:  # pragma: no cover - overridden
        pass


@dataclass(eq=False)
class DataMove(Instr):
    """Copy a region between levels (DMA on MTE2/MTE3, Load2D on MTE1, L0C -> UB on V).
    The destination region receives the source elements in C order (a reshape), or with
    `transform="nd2zz"` the ND -> zZ fractal conversion Load2D does on the way to L0A."""

    dst: Buf
    dst_idx: tuple
    src: Buf
    src_idx: tuple
    path: tuple[str, str]
    nbytes: int = 0
    bursts: int = 0
    # "nd2zz": an ND (rows, cols) region becomes zZ fractals (rows/16, cols/K0, 16, K0) for L0A;
    # "nd2fz": an ND (K, N) region becomes FRACTAL_Z (K/K0, N/16, 16, K0) for L0B;
    # "nz2nd": an L0C (N1, M, 16) region becomes row-major (M, N1*16)
    transform: str = ""

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        """Latency + bytes at the path's rate (GM transfers at most the contended GM rate) +
        a burst cost per extra contiguous run."""
        p = m.path(*self.path)
        bpc = p.bytes_per_cycle
        if self.path[0] == "GM":
            bpc = min(bpc, read_bpc)
        elif self.path[1] == "GM":
            bpc = min(bpc, write_bpc)
        return ceil(p.latency_cycles + self.nbytes / bpc + p.burst_cycles * max(self.bursts - 1, 0))

    def execute(self, mem: Memory) -> int:
        s = mem.load(self.src)[self.src_idx]
        d = mem.store(self.dst)
        tgt = d[self.dst_idx]
        if self.transform == "nd2zz":
            k0 = tgt.shape[-1]
            s = s.reshape(s.shape[0] // 16, 16, s.shape[1] // k0, k0).transpose(0, 2, 1, 3)
        elif self.transform == "nd2fz":
            k0 = tgt.shape[-1]
            s = s.reshape(s.shape[0] // k0, k0, s.shape[1] // 16, 16).transpose(0, 2, 3, 1)
        elif self.transform == "nz2nd":
            s = s.transpose(1, 0, 2).reshape(s.shape[1], s.shape[0] * s.shape[2])
        return self._put(d, tgt, s, "data_move", self.src_idx)

    def _put(self, d, tgt, s, kind: str, at) -> int:
        """Write the values `s` into `tgt`, this move's region of the destination `d` (as many
        elements, cast to its dtype); `kind` and `at` (the source region) name the move in the
        error. Returns the bytes moved."""
        if s.size != tgt.size:
            raise OpcFailure(f"{kind} {self.src.name}{at} -> {self.dst.name}{self.dst_idx}: "
                             f"{s.size} elements into {tgt.size}")
        d[self.dst_idx] = s.reshape(tgt.shape).astype(d.dtype, copy=False)
        return s.size * s.itemsize  # bytes moved


@dataclass(eq=False)
class IndirectMove(DataMove):
    """An indirect DMA (a gather's row fetch): a `DataMove` whose source rows are chosen at
    execute time by an index the kernel reads from simulated memory (`index[index_pos]`, the
    scalar unit's read of the index tile in UB). `src_idx` is the region of row 0 (a box of one
    row): the moved region is that box with its row replaced by the index. Same bytes, bursts and
    cost as the `DataMove` of that box (the sizes never depend on the value). An index outside
    [0, rows) is a one-line OpcFailure naming it and the table size: nothing is read."""

    index: Buf | None = None
    index_pos: int = 0

    def row(self, mem: Memory) -> int:
        """The table row this move reads: the index the scalar unit loads from UB."""
        return int(mem.load(self.index).reshape(-1)[self.index_pos])

    def execute(self, mem: Memory) -> int:
        table = mem.load(self.src)
        r = self.row(mem)
        rows = table.shape[0]
        if not 0 <= r < rows:
            raise OpcFailure(f"gather: index {r} is out of range for a table of {rows} rows (valid: 0..{rows - 1})")
        s = table[(slice(r, r + 1), *self.src_idx[1:])]
        d = mem.store(self.dst)
        return self._put(d, d[self.dst_idx], s, "indirect data_move", [r])


@dataclass(frozen=True)
class ConvGeom:
    """Convolution geometry Load3D needs (padding top/left; input H, W; output Ho, Wo)."""

    h: int
    w: int
    ho: int
    wo: int
    r: int
    s: int
    stride: int
    dilation: int
    pad_top: int
    pad_left: int


@dataclass(eq=False)
class Load3D(Instr):
    """img2col: expand the convolution window from an L1 feature-map slice into L0A fractals.

    Output pixels p0 .. p0+mt (pixels past Ho*Wo are zero rows), K fractals q0 .. q0+kt1 where
    fractal q = (c1, ry, rx) in FRACTAL_Z order; padding and out-of-image taps read zeros."""

    dst: Buf
    src: Buf
    geom: ConvGeom
    h0: int  # input row held in L1 row 0
    c1_0: int  # C1 index held in L1 channel-block 0
    p0: int
    mt: int
    q0: int
    kt1: int
    nbytes: int = 0

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        p = m.path("L1", self.dst.level)
        return ceil(p.latency_cycles + self.nbytes / p.bytes_per_cycle)

    def execute(self, mem: Memory) -> int:
        g = self.geom
        fm = mem.load(self.src)
        out = mem.store(self.dst)
        pix = self.p0 + np.arange(self.mt)
        oy, ox = pix // g.wo, pix % g.wo
        q = self.q0 + np.arange(self.kt1)
        c1 = q // (g.r * g.s) - self.c1_0
        ry, rx = (q // g.s) % g.r, q % g.s
        iy = oy[:, None] * g.stride - g.pad_top + ry[None, :] * g.dilation
        ix = ox[:, None] * g.stride - g.pad_left + rx[None, :] * g.dilation
        ok = (pix < g.ho * g.wo)[:, None] & (iy >= 0) & (iy < g.h) & (ix >= 0) & (ix < g.w)
        row = iy - self.h0
        if ok.any() and (row[ok].min() < 0 or row[ok].max() >= fm.shape[1] or c1.min() < 0 or c1.max() >= fm.shape[0]):
            raise OpcFailure(f"load3d reads outside {self.src.name}: rows {row[ok].min()}..{row[ok].max()} of "
                             f"{fm.shape[1]}, channel blocks {c1.min()}..{c1.max()} of {fm.shape[0]}")
        c1b = np.broadcast_to(c1[None, :], ok.shape)
        vals = fm[np.where(ok, c1b, 0), np.where(ok, row, 0), np.where(ok, ix, 0)]  # (mt, kt1, C0)
        vals[~ok] = 0
        k0 = fm.shape[3]
        out[:self.mt // 16, :self.kt1] = vals.reshape(self.mt // 16, 16, self.kt1, k0).transpose(0, 2, 1, 3)
        return vals.size * out.itemsize  # bytes written into L0


@dataclass(eq=False)
class Mmad(Instr):
    """C[n1 + nc, m] (+)= A[m1, k1] x B[k1, n1] on whole L0 tiles (one call per tile, not per fractal)."""

    c: Buf
    a: Buf
    b: Buf
    m1: int
    k1: int
    n1: int
    c_n1_off: int
    init: bool
    acc_dtype: str = "float32"

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return ceil(m.cube_startup + self.m1 * self.k1 * self.n1)

    def execute(self, mem: Memory) -> int:
        a = mem.load(self.a)[:self.m1, :self.k1]  # (m1, k1, 16, k0)
        b = mem.load(self.b)[:self.k1, :self.n1]  # (k1, n1, 16, k0)
        c = mem.store(self.c) if self.init else mem.update(self.c)
        k0 = a.shape[3]
        am = a.transpose(0, 2, 1, 3).reshape(self.m1 * 16, self.k1 * k0).astype(self.acc_dtype)
        bm = b.transpose(0, 3, 1, 2).reshape(self.k1 * k0, self.n1 * 16).astype(self.acc_dtype)
        prod = (am @ bm).reshape(self.m1 * 16, self.n1, 16).transpose(1, 0, 2)
        dst = c[self.c_n1_off:self.c_n1_off + self.n1, :self.m1 * 16]
        if self.init:
            dst[...] = prod
        else:
            dst += prod
        return (am.shape[0] // 16) * (bm.shape[0] // k0) * (bm.shape[1] // 16)  # fractal products


@dataclass(frozen=True)
class VOp:
    """A vector operand: buffer, element offset, block stride and repeat stride (in 32 B blocks)."""

    buf: Buf
    offset: int = 0
    blk_stride: int = 1
    rep_stride: int = 8


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
           "min": np.minimum}
_UNARY = {"relu": lambda x: np.maximum(x, 0).astype(x.dtype), "exp": np.exp, "abs": np.abs,
          "ln": np.log, "rec": lambda x: (1 / x).astype(x.dtype), "sqrt": np.sqrt, "copy": lambda x: x}
_SCALAR = {"muls": np.multiply, "adds": np.add, "maxs": np.maximum, "mins": np.minimum}
_REDUCE = {"cadd": np.sum, "cmax": np.max}
VEC_OPS = (*_BINARY, *_UNARY, *_SCALAR, *_REDUCE, "conv", "dup", "dups", "brcb")


@dataclass(eq=False)
class Vec(Instr):
    """One vector instruction: `repeat` repeats of `lanes` elements (256 B of the widest operand),
    the first `mask` lanes active, operands addressed by block and repeat strides.

    Ops: add sub mul div max min (binary), relu exp abs ln rec sqrt copy (unary), muls adds maxs mins
    (with `scalar`), conv (cast to dst dtype), dup (fill with `scalar`), dups (fill with the element
    at the source offset: a scalar register loaded from UB, then vector_dup), cadd cmax (reduce
    each repeat's active lanes to one element written at dst offset + repeat index), brcb (each
    repeat reads 8 consecutive source elements, the source advancing `rep_stride` blocks a repeat,
    and fills one 32 B destination block with each: a per-row value made into a block a row
    operand can read with block stride 0; Ascend C `Brcb`)."""

    op: str
    dst: VOp
    srcs: tuple[VOp, ...]
    repeat: int
    mask: int
    lanes: int
    scalar: float = 0.0

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return ceil(m.vec_startup + self.repeat * (m.vec_cycles_per_repeat + m.vec_slow_ops.get(self.op, 0)))

    def _idx(self, o: VOp, itemsize: int, lanes: int) -> np.ndarray:
        epb = 32 // itemsize
        e = np.arange(self.mask)
        per_lane = (e // epb) * o.blk_stride * epb + e % epb
        return o.offset + np.arange(self.repeat)[:, None] * (o.rep_stride * epb) + per_lane[None, :]

    def execute(self, mem: Memory) -> int:
        svs = [mem.load(s.buf).reshape(-1) for s in self.srcs]
        dv = mem.store(self.dst.buf).reshape(-1)
        xs = [] if self.op in ("dups", "brcb") else [sv[self._idx(s, sv.itemsize, self.lanes)] for s, sv in zip(self.srcs, svs)]
        op = self.op
        if op in _BINARY:
            r = _BINARY[op](xs[0], xs[1])
        elif op in _UNARY:
            r = _UNARY[op](xs[0])
        elif op in _SCALAR:
            r = _SCALAR[op](xs[0], xs[0].dtype.type(self.scalar))
        elif op == "conv":
            r = xs[0].astype(dv.dtype)
        elif op == "dup":
            r = np.full((self.repeat, self.mask), self.scalar, dv.dtype)
        elif op == "dups":
            r = np.full((self.repeat, self.mask), svs[0][self.srcs[0].offset], dv.dtype)
        elif op == "brcb":
            s = self.srcs[0]
            src = s.offset + np.arange(self.repeat)[:, None] * (s.rep_stride * (32 // svs[0].itemsize)) + np.arange(8)
            r = np.repeat(svs[0][src], 32 // dv.itemsize, axis=1)[:, :self.mask]
        elif op in _REDUCE:
            red = _REDUCE[op](xs[0].astype(np.float32), axis=1).astype(dv.dtype)
            dv[self.dst.offset + np.arange(self.repeat)] = red
            return xs[0].size
        else:  # pragma: no cover - the builder (`lower.builder`) rejects unknown ops
            raise OpcFailure(f"unknown vector op {op}")
        dv[self._idx(self.dst, dv.itemsize, self.lanes)] = r.astype(dv.dtype, copy=False)
        return r.size  # elements computed


TRANS_BLOCKS = 16  # vnchwconv: blocks of 32 B read (and written) per repeat


@dataclass(eq=False)
class VecTrans(Instr):
    """vnchwconv, the vector unit's transpose (TBE / TIK `vnchwconv`, Ascend C `TransDataTo5HD`):
    each repeat reads 16 blocks of 32 B of UB, the 16 rows of a 16 x E matrix (E = 32 B / element
    size: 16 fp16, 8 fp32), and writes its transpose in C order as 16 blocks of 32 B (fp16: 16
    rows of 16; fp32: 8 rows of 16, each row two blocks). The 16 source and 16 destination block
    addresses are element offsets into their buffers; each repeat advances them by `src_rep` /
    `dst_rep` blocks. A repeat moves 512 B through the vector datapath: it costs what two 256 B
    repeats of the datapath cost (16 blocks x block bytes / repeat bytes, from the figures)."""

    dst: Buf
    dst_addrs: tuple[int, ...]
    src: Buf
    src_addrs: tuple[int, ...]
    repeat: int
    dst_rep: int
    src_rep: int

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return ceil(m.vec_startup + self.repeat * m.vec_cycles_per_repeat * TRANS_BLOCKS * m.vec_block_bytes
                    / m.vec_repeat_bytes)

    def execute(self, mem: Memory) -> int:
        s = mem.load(self.src).reshape(-1)
        d = mem.store(self.dst).reshape(-1)
        epb = 32 // s.itemsize
        r = np.arange(self.repeat)[:, None, None]
        e = np.arange(epb)
        si = np.asarray(self.src_addrs)[None, :, None] + r * (self.src_rep * epb) + e
        di = np.asarray(self.dst_addrs)[None, :, None] + r * (self.dst_rep * epb) + e
        if si.min() < 0 or si.max() >= s.size or di.min() < 0 or di.max() >= d.size:
            raise OpcFailure(f"vnchwconv {self.src.name} -> {self.dst.name} addresses a block outside its buffer")
        blk = s[si]  # (repeat, 16, E): each repeat's 16 source rows
        d[di] = blk.transpose(0, 2, 1).reshape(self.repeat, TRANS_BLOCKS, epb)
        return blk.size  # elements moved


@dataclass(eq=False)
class Scalar(Instr):
    """Scalar-pipe work: loop control and address arithmetic (`n` cycles)."""

    n: int = 0
    what: str = "loop"

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return self.n


@dataclass(eq=False)
class Barrier(Instr):
    """pipe_barrier(PIPE_ALL): every pipe drains before anything after it starts."""


@dataclass(eq=False)
class SyncAll(Instr):
    """Ascend C's SyncAll: a barrier across the kernel's active cores. The builder emits it after
    a `Barrier` (the core's own pipes drain first, so its GM writes are out); the core then waits
    `core_sync_cycles` (its flag written to GM, the others' polled) on the scalar unit. Every
    core's GM writes before it are visible to every core after it: the functional run executes
    the cores in lockstep between these (`execute.run`). Timing replays core 0, which holds
    the largest share of the work, so the barrier waits on no slower core."""

    def cost_cycles(self, m, read_bpc: float = 0.0, write_bpc: float = 0.0) -> int:
        return m.core_sync_cycles


# -- the program containers ------------------------------------------------------------------

@dataclass(eq=False)
class Program(SimProgram):
    """One core's instruction stream plus what the backend needs to run and report it (the
    simulator core's program container: `listing()` prints it)."""

    machine: Machine
    core: int
    active_cores: int
    instrs: list[Instr]
    bufs: list[Buf]
    gm: dict[str, Buf]
    high_water: dict[str, int]
    info: dict[str, Any] = field(default_factory=dict)

    def streams(self) -> list[tuple[str, list]]:
        return [(f"core {self.core} of {self.active_cores}", self.instrs)]

    def declared_cycles(self, ins: Instr) -> int | None:
        """The machine's cost of `ins` on its pipe; None for a GM transfer (its rate is the
        contended GM bandwidth `timing` finds) and a barrier (it waits, costs nothing)."""
        if isinstance(ins, Barrier) or (isinstance(ins, DataMove) and "GM" in ins.path):
            return None
        return ins.cost_cycles(self.machine)


@dataclass(eq=False, kw_only=True)
class Plan:
    """What a template hands the backend: how to emit each core's program, how the host lays out
    inputs for GM and reads the output back (host-side preprocessing, reported), and the work."""

    active_cores: int
    make_program: Callable[[int], Program]  # core index -> that core's program
    pack: Callable[[list[np.ndarray]], dict[str, np.ndarray]]  # host: op inputs -> GM tensors
    out_name: str
    out_shape: tuple[int, ...]
    out_dtype: str
    unpack: Callable[[np.ndarray], np.ndarray]  # host: GM output -> the op's output layout
    flops: int
    unit: str  # "cube" or "vector": whose peak % of peak refers to
    info: dict[str, Any] = field(default_factory=dict)


__all__ = ["Buf", "Memory", "Instr", "DataMove", "IndirectMove", "Load3D", "Mmad", "Vec", "VecTrans", "VOp",
           "Scalar", "Barrier", "SyncAll", "ConvGeom", "VEC_OPS", "TRANS_BLOCKS", "region_bursts", "Program",
           "Plan"]
