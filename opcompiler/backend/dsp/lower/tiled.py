"""What the hand-tiled dsp lowerings (`gather`, `fm`) share: the facts read off a module whose
outermost loop is the tile loop with the nests under it, each core's share of the tiles, and the
op of one VPU pass (as `backend/ascend/lower/builder.py`'s `walk_tiled` serves ascend's gather
and fm)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opcompiler.sim.tir_expr import TIR

from .. import execute as ex, timing as tm
from ..intrin import OP
from ..machine import DspMachine
from ..program import Op, VKernel


def alloc_bufs(st, into: dict) -> None:
    """The buffers block realize `st` allocates, into `into` (name -> (scope, shape))."""
    for b in st.block.alloc_buffers:
        into[b.name] = (str(b.scope()), tuple(int(x) for x in b.shape))


def walk_tiled(func, on_tile: Callable[[Any], None] | None = None,
               on_nest: Callable[[str | None, Any, dict], None] | None = None) -> dict[str, Any]:
    """The module's facts past its parameters: the tile loop's extent (`tiles`: its outermost
    loop), the nests under it in order (`nests`: (`opc.dsp.op` or None, extent, the trip count of
    the loops inside)) and the on-chip buffers outside the nests (`bufs`: name -> (scope, shape)).
    `on_tile(loop)` checks the tile loop; `on_nest(op, body, found)` reads more off a nest's body."""
    found: dict[str, Any] = {"tiles": None, "nests": [], "bufs": {}}

    def inside(st) -> int:  # the trip count of the loops nested in st
        if isinstance(st, TIR.For):
            return int(st.extent) * inside(st.body)
        if isinstance(st, TIR.SBlockRealize):
            return inside(st.block.body)
        return inside(st.body) if hasattr(st, "body") and not isinstance(st, TIR.SeqStmt) else 1

    def visit(st, in_tile: bool) -> None:
        if isinstance(st, TIR.For):
            if not in_tile:
                if on_tile is not None:
                    on_tile(st)
                found["tiles"] = int(st.extent)
                return visit(st.body, True)
            op = st.annotations.get(OP)
            op = None if op is None else str(op)
            found["nests"].append((op, int(st.extent), inside(st.body)))
            if on_nest is not None:
                on_nest(op, st.body, found)
        elif isinstance(st, TIR.SBlockRealize):
            alloc_bufs(st, found["bufs"])
            visit(st.block.body, in_tile)
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                visit(x, in_tile)
        elif hasattr(st, "body"):
            visit(st.body, in_tile)

    visit(func.body, False)
    return found


def tile_share(c: int, tiles: int, cores: int) -> range:
    """The tiles core `c` takes: a contiguous share (none past the cores that take part)."""
    return range(c * tiles // cores, (c + 1) * tiles // cores) if c < cores else range(0)


def vpu_op(m: DspMachine, kern: VKernel, reads: tuple, writes: tuple, functional: bool, label: str) -> Op:
    """The op of one VPU pass: its cycles the timing model's (`timing.kernel_cost`); functionally
    it executes the instructions (`execute.execute_pass`)."""
    cost = tm.kernel_cost(m, kern)
    fn = (lambda mem, k=kern, L=m.lanes: ex.execute_pass(mem, k, L)) if functional else None
    return Op("vpu", "vpu", cycles=cost.cycles, reads=reads, writes=writes, cost=cost,
              nruns=len(kern.nests), fn=fn, label=label)


__all__ = ["alloc_bufs", "tile_share", "vpu_op", "walk_tiled"]
