"""dsp-sim template for slice (a contiguous range along one axis, step 1): data movement by DMA,
the same knobs as concat (`concat.py`). Each outer block's range is one contiguous run of the
input and lands contiguously in the output; runs are cut into transfers of at most `tile`
elements, DDR -> DDR descriptors or staged through AM, split over the cores.

`apply` is the TVM schedule of the op's compute (`move_tir.slice_schedule`), lowered by the
backend's data-movement lowering (`opcompiler.backend.dsp.tir_move`)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import Program
from opcompiler.errors import OpcError
from opcompiler.ops.catalogue import slice_geometry
from opcompiler.target import Target
from opcompiler.template_base import Knob
from opcompiler.workload import Workload

from . import move_tir
from .concat import TILES, DspConcat
from .common import require_fp32
from .stream import cores_knob, group_key, share


class DspSlice(DspConcat):
    """Slice by DMA (dispatched to by `dsp.elemwise`)."""

    name = "dsp.slice"

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        return [Knob("path", ("ddr", "am"), "DDR -> DDR descriptors, or staged through AM"),
                Knob("tile", TILES, "elements per transfer"),
                Knob("dbuf", (1, 0), "two AM buffers (path=am)"), cores_knob(machine(target))]

    def _total(self, wl: Workload) -> int:
        _, outer, _, run = slice_geometry(wl)
        return outer * run

    def _items(self, wl: Workload, tile: int) -> list[tuple[str, int, int, int]]:
        dims, outer, start, run = slice_geometry(wl)
        row = 1
        for d in dims:
            row *= d
        row //= outer  # input elements per outer block
        return [("x", b * row + start + s, b * run + s, min(tile, run - s))
                for b in range(outer) for s in range(0, run, tile)]

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        require_fp32(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        tile, staged = int(config["tile"]), config["path"] == "am"
        shares = share(self._items(wl, tile), int(config["cores"]), m.cores)
        return move_tir.build_program(wl, target, config, functional, (tile, staged), staged and bool(config["dbuf"]),
                                      sum(1 for s in shares if s), lambda c: group_key(shares[c], lambda it: it[3]),
                                      {"path": config["path"]})
