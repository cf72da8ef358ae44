"""The dsp-sim lowering of fm_interaction (DeepFM's pairwise term): per tile of samples one DMA in,
one VPU pass, one DMA out.

The module is the op's TE compute scheduled by `schedules/dsp/fm.py`: the sample loop split into
tiles (the tile loop `opc.dsp.stage` / `opc.dsp.cores`: contiguous shares of the tiles per core),
under it, in order:

    e -> e_local.AM          opc.dsp.op = dma   the tile's samples (rows, f, k) DDR -> AM, one DMA
                                                (one contiguous run: AM holds e's own layout)
    per sample (opc.dsp.op = vec), per 32-lane vector of k:
      fm_sum    (1, L) REG   s = sum over the fields of e
      fm_sumsq  (1, L) REG   q = sum over the fields of e * e (fm_sq inlined)
      fm_out    -> AM        s * s - q
    fm_out_local.AM -> out   opc.dsp.op = dma   the tile's results (rows, k) AM -> DDR, one DMA

Read from the module: e's and the output's shapes (the function's parameters), the tile loop's
extent, the samples per tile (the copy nest's extent), the vector loop's extent and the register
tiles' width (the machine's lanes), the three blocks in order and the two AM tiles; each fact is
checked against the others. Per tile of `cnt` samples the VPU pass is two nests (the row's whole
vectors; its last, partial vector, its store predicated to the remaining lanes), each over
(samples[, vectors]) with the two field sums fused into one loop over the fields (a load feeds
both chains):

    vld   s <- e[i, 0, v]                      the first field
    vfnma q <- 0 - s * s                       q holds minus the sum of squares
    for r in 1..f-1:
        vld   x <- e[i, r, v]
        vadd  s <- s + x
        vfnma q <- q - x * x                   (the FMACs' multiply-subtract, one rounding)
    vfma  o <- s * s + q                       s^2 - sum e^2, one rounding
    vst   out[i, v] <- o                       (the partial vector's store predicated)

Per output vector: f loads, f - 1 adds, f + 1 FMAs, one store. With `dbuf` two e and out tiles
alternate and the next tile's DMA in is issued before this tile's VPU pass (`program.stage_order`).
The pass's cycles are the timing model's (`timing.kernel_cost`); functionally it executes the
instructions (`execute.execute_pass`), timed by the functional clock (`fclock`). A partial
vector's load reads up to 31 elements past a tile's last sample: the e tile carries one vector
of slack (never stored)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from ..intrin import CORES, DMA, SCOPE_AM, SCOPE_REG, STAGE, VEC
from ..machine import DspMachine
from ..program import VI, Allocator, Mem, Nest, Op, VKernel, contiguous, dma_op, stage_order
from .tiled import alloc_bufs, tile_share, vpu_op, walk_tiled

BLOCKS = ("fm_sum", "fm_sumsq", "fm_out")  # the VPU nest's blocks, in order (the catalogue's compute)


def _walk(func) -> dict[str, Any]:
    """The module's facts (`tiled.walk_tiled`'s, its tile loop checked) and its vec nest's: the
    loops below its sample loop, the blocks in it in order (its buffers join `bufs`)."""
    vec: dict[str, Any] = {"blocks": [], "vec_loops": []}

    def in_vec(st, depth: int, bufs: dict) -> None:  # the vec nest's body: its loops (outside the blocks), blocks
        if isinstance(st, TIR.For):
            if depth == 0:
                vec["vec_loops"].append(int(st.extent))
            in_vec(st.body, depth, bufs)
        elif isinstance(st, TIR.SBlockRealize):
            name = st.block.name_hint
            if name:
                vec["blocks"].append(name)
                return
            alloc_bufs(st, bufs)
            in_vec(st.block.body, depth, bufs)
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                in_vec(x, depth + 1, bufs)
        elif hasattr(st, "body"):
            in_vec(st.body, depth, bufs)

    def tile(st) -> None:
        if STAGE not in st.annotations or CORES not in st.annotations:
            raise OpcFailure("lower.fm: an fm module's outer loop is the tile loop (opc.dsp.stage, "
                             "opc.dsp.cores)")

    def nest(op: str | None, body, found: dict) -> None:
        if op == VEC:
            in_vec(body, 0, found["bufs"])

    return {**walk_tiled(func, tile, nest), **vec}


class FmLowerer:
    """Each core's ops of one scheduled fm_interaction (see the module docstring)."""

    def __init__(self, m: DspMachine, func, p: Mapping[str, Any], ddr_names: Mapping[str, str], functional: bool):
        if len(func.params) != 2:
            raise OpcFailure(f"lower.fm: an fm function has e and out; not {len(func.params)} parameters")
        (self.ename, eshape), (self.oname, oshape) = [
            (ddr_names.get(q.name, q.name), tuple(int(s) for s in q.shape)) for q in func.params]
        self.b, self.f, self.k = eshape
        if oshape != (self.b, self.k):
            raise OpcFailure(f"lower.fm: e {eshape} gives an output of {(self.b, self.k)}, not {oshape}")
        self.m, self.fn, self.dbuf = m, functional, bool(p["dbuf"])
        w = _walk(func)
        kinds = [k for k, _, _ in w["nests"]]
        if kinds != [DMA, VEC, DMA] or w["tiles"] is None:
            raise OpcFailure(f"lower.fm: an fm module has a tile loop over a {DMA!r} copy-in, a {VEC!r} nest and a "
                             f"{DMA!r} write-back; found nests {kinds}")
        rows = w["nests"][0][1]
        if any(e != rows for _, e, _ in w["nests"]) or w["tiles"] != -(-self.b // rows):
            raise OpcFailure(f"lower.fm: {w['tiles']} tiles of {[e for _, e, _ in w['nests']]} samples do not "
                             f"cover {self.b}")
        L = m.lanes
        nvec = 1
        for e in w["vec_loops"]:  # (a loop of one vector is gone from the lowered function)
            nvec *= e
        if w["blocks"] != list(BLOCKS) or nvec != -(-self.k // L):
            raise OpcFailure(f"lower.fm: the vec nest runs {BLOCKS} per vector of {L} lanes ({-(-self.k // L)} "
                             f"vectors of k={self.k}); found blocks {w['blocks']} under loops {w['vec_loops']}")
        regs = sorted(s for sc, s in w["bufs"].values() if sc == SCOPE_REG)
        am = sorted(s for sc, s in w["bufs"].values() if sc == SCOPE_AM)
        width = min(L, self.k)  # (TVM compacts the register tile of a lone vector to k lanes)
        if regs != [(1, width), (1, width)] or am != sorted([(rows, self.f, self.k), (rows, self.k)]):
            raise OpcFailure(f"lower.fm: the sums live in {L}-lane registers, the e and out tiles in AM; "
                             f"found {w['bufs']}")
        self.rows, self.tiles = rows, w["tiles"]
        self.cores = max(1, min(int(p["cores"]), self.tiles))

    def share(self, c: int) -> range:
        return tile_share(c, self.tiles, self.cores)

    def count(self, t: int) -> int:
        return min(self.rows, self.b - t * self.rows)

    def group_key(self, c: int) -> tuple:
        """Every core timed on its own (its key names it): equal cores timed as one group hold the
        shared DDR channel for all of them at once, where the cores' transfers really interleave
        (about 0.1 % more cycles at b=4096, and the functional clock's per-core replay would differ)."""
        return (c, *(self.count(t) for t in self.share(c)))

    def kernel(self, e: int, o: int, cnt: int) -> VKernel:
        """The VPU pass of one tile of `cnt` samples: e tile at AM `e`, out tile at AM `o` (see the
        module docstring)."""
        L, f, k = self.m.lanes, self.f, self.k
        full, tail = divmod(k, L)

        def nest(outer: tuple, col: int, lanes: int | None) -> Nest:
            vec = (L,) if len(outer) == 2 else ()  # the vector loop's step along k
            first = Mem("AM", e + col, (f * k,) + vec + (0,))
            nxt = Mem("AM", e + k + col, (f * k,) + vec + (k,))
            out = Mem("AM", o + col, (k,) + vec + (0,))
            return Nest(outer=outer, inner=(f - 1,),
                        pre=(VI("vld", "s", (first,)), VI("vfnma", "q", ("s", "s", 0.0))),
                        body=(VI("vld", "x", (nxt,)), VI("vadd", "s", ("s", "x")), VI("vfnma", "q", ("x", "x", "q"))),
                        post=(VI("vfma", "o", ("s", "s", "q")), VI("vst", out, ("o",), lanes=lanes)))
        nests = ([nest((cnt, full), 0, None)] if full else []) + ([nest((cnt,), full * L, tail)] if tail else [])
        return VKernel(tuple(nests), f"fm ({cnt} samples, {f} fields, k={k})")

    def _vpu(self, kern: VKernel, s: int, label: str) -> Op:
        return vpu_op(self.m, kern, (f"am:e_{s}",), (f"am:out_{s}",), self.fn, label)

    def core_ops(self, c: int) -> list[Op]:
        m, f, k = self.m, self.f, self.k
        am = Allocator("AM", m.cap("AM"), 128)
        slots = 2 if self.dbuf else 1
        slack = m.lanes if k % m.lanes else 0  # a partial vector's load past the tile's last row
        eb = [am.alloc(f"e_{s}", self.rows * f * k + slack) for s in range(slots)]
        ob = [am.alloc(f"out_{s}", self.rows * k) for s in range(slots)]
        stages: list[tuple[list, list, list]] = []
        for j, t in enumerate(self.share(c)):
            s = j % slots
            i0, cnt = t * self.rows, self.count(t)
            fetch = dma_op(m, contiguous(("DDR", self.ename), i0 * f * k, (cnt, f * k)),
                           contiguous(("AM",), eb[s], (cnt, f * k)), (), (f"am:e_{s}",), self.fn,
                           label=f"e {i0}..{i0 + cnt - 1}")
            vpu = self._vpu(self.kernel(eb[s], ob[s], cnt), s, f"fm {i0}..{i0 + cnt - 1}")
            out = dma_op(m, contiguous(("AM",), ob[s], (cnt, k)), contiguous(("DDR", self.oname), i0 * k, (cnt, k)),
                         (f"am:out_{s}",), (), self.fn, label="out")
            stages.append(([fetch], [vpu], [out]))
        # with two slots the next tile's fetch is issued before this tile's VPU pass (a flat list in
        # both modes: each core is timed on its own, nothing repeats)
        return stage_order(stages, self.dbuf, functional=True)


def make(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    """The `lower.LOWERINGS` entry: (lowerer, core ops, group key, replication, host prepares)."""
    low = FmLowerer(m, func, p, names, fn)
    return low, low.core_ops, low.group_key, [], []


__all__ = ["BLOCKS", "FmLowerer", "make"]
