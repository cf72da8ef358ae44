"""dsp-sim template for concat (two NCHW tensors along channels): pure data movement by DMA.

The catalogue's concat takes (n, c, h, w) and (n, c1, h, w) whatever its `layout` parameter says
(cpu and ascend-sim run layout=NHWC on the same tensors), so both layouts are this one kernel.

In each image, input i is one contiguous block of c_i*h*w elements and lands as one contiguous
block of the output (at channel 0 or c). The blocks are cut into transfers of at most `tile`
elements, split over the cores. `path=ddr`: each transfer is one DDR -> DDR descriptor (the
DDR channel carries its bytes twice, read and write); `path=am`: staged DDR -> AM -> DDR
through AM buffers (double-buffered with `dbuf`), two descriptors per transfer. No VPU work.

`apply` is the TVM schedule of the op's compute written per input (`move.concat_schedule`:
a stage loop per input under the image loop, the stages shared over the cores in the order
above), lowered by the backend's data-movement lowering (`tir_move`).
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from . import move
from .common import refuse_invalid, require_fp32
from .stream import cores_knob, share

TILES = (4096, 16384, 65536, 131072, 262144)


def _items(wl: Workload, tile: int) -> list[tuple[str, int, int, int]]:
    n, hw = wl["n"], wl["h"] * wl["w"]
    cc = (wl["c"], wl["c1"])
    out = []
    for b in range(n):
        for i, nm in enumerate(("x", "x1")):
            blk = cc[i] * hw
            dst0 = b * (cc[0] + cc[1]) * hw + (0 if i == 0 else cc[0] * hw)
            for s in range(0, blk, tile):
                out.append((nm, b * blk + s, dst0 + s, min(tile, blk - s)))
    return out


class DspConcat(Template):
    """Channel concat by DMA (dispatched to by `dsp.elemwise`)."""

    name = "dsp.concat"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        # the catalogue's concat joins (n, c, h, w) and (n, c1, h, w) along axis 1 whatever `layout`
        # says (layout=NHWC names the same tensors, as on cpu and ascend): the blocks above are
        # those tensors' channel blocks. Should the catalogue give other shapes, refuse, not move
        # the wrong elements.
        want = {"x": (wl["n"], wl["c"], wl["h"], wl["w"]), "x1": (wl["n"], wl["c1"], wl["h"], wl["w"])}
        got = {nm: tuple(int(v) for v in shp) for nm, shp, _ in get_op(wl.op).inputs(wl)}
        if got != want:
            raise OpcError("dsp.concat moves (n, c, h, w) channel blocks", arg="layout", value=wl.layout,
                           expected=f"inputs {want}, not {got}")
        return [Knob("path", ("ddr", "am"), "DDR -> DDR descriptors, or staged through AM"),
                Knob("tile", TILES, "elements per transfer"),
                Knob("dbuf", (1, 0), "two AM buffers (path=am)"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        total = self._total(wl)
        tile = next((t for t in sorted(TILES, reverse=True) if total // t >= 2 * m.cores), TILES[0])
        return {"path": "ddr", "tile": tile, "dbuf": 1, "cores": m.cores}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        if config["path"] == "am":
            need = (1 + int(config["dbuf"])) * int(config["tile"]) * F32
            if need > m.cap("AM"):
                return f"AM needs {need} B > {m.cap('AM')} B"
        return None

    def _items(self, wl: Workload, tile: int) -> list[tuple[str, int, int, int]]:
        """(input name, source offset, output offset, elements) per transfer."""
        return _items(wl, tile)

    def _total(self, wl: Workload) -> int:
        return wl["n"] * (wl["c"] + wl["c1"]) * wl["h"] * wl["w"]

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        items = self._items(wl, int(config["tile"]))
        total = sum(it[3] for it in items)
        return {"ddr_bytes": float(2 * total * F32), "transfers": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items)))}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        tile, staged = int(config["tile"]), config["path"] == "am"
        shares = share(self._items(wl, tile), int(config["cores"]), m.cores)
        return move.scheduled(wl, target, config, (tile, staged), staged and bool(config["dbuf"]), shares,
                                  lambda it: it[3], {"path": config["path"]})
