"""dsp-sim template for slice (a contiguous range along one axis, step 1): data movement by DMA,
the same knobs as concat (`concat.py`). Each outer block's range is one contiguous run of the
input and lands contiguously in the output; runs are cut into transfers of at most `tile`
elements, DDR -> DDR descriptors or staged through AM, split over the cores.

`apply` (concat's) builds the TVM schedule of the op's compute (`move.slice_schedule`), lowered by the
backend's data-movement lowering (`tir_move`)."""
from __future__ import annotations

from opcompiler.backend.dsp.intrin import machine
from opcompiler.ops.catalogue import slice_geometry
from opcompiler.target import Target
from opcompiler.template_base import Knob
from opcompiler.workload import Workload

from .concat import TILES, DspConcat
from .common import require_fp32
from .stream import cores_knob


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
