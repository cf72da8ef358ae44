"""dsp-sim template for concat (two NCHW tensors along channels): pure data movement by DMA.

In each image, input i is one contiguous block of c_i*h*w elements and lands as one contiguous
block of the output (at channel 0 or c). The blocks are cut into transfers of at most `tile`
elements, split over the cores. `path=ddr`: each transfer is one DDR -> DDR descriptor (the
DDR channel carries its bytes twice, read and write); `path=am`: staged DDR -> AM -> DDR
through AM buffers (double-buffered with `dbuf`), two descriptors per transfer. No VPU work.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.machine import machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .common import require_fp32
from .stream import cores_knob, group_key, share, stream

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
        if wl.layout != "NCHW":
            raise OpcError("concat is NCHW", arg="layout", value=wl.layout, expected="NCHW")
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

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        require_fp32(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        shares = share(self._items(wl, int(config["tile"])), int(config["cores"]), m.cores)
        staged = config["path"] == "am"
        nbuf = 1 + int(config["dbuf"]) if staged else 1
        key = lambda it: it[3]  # noqa: E731
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            items = shares[core]
            if not items:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            bufs = [am.alloc(f"staging[{b}]", int(config["tile"])) for b in range(nbuf)] if staged else []

            def stage(it, slot, first):
                nm, s0, d0, cnt = it
                src = View(("DDR", nm), s0, (cnt,), (1,))
                dst = View(("DDR", "out"), d0, (cnt,), (1,))
                if not staged:
                    return [dma_op(m, src, dst, (), ("out",), functional, f"{nm} DDR->DDR")], [], []
                a = View(("AM",), bufs[slot], (cnt,), (1,))
                return ([dma_op(m, src, a, (), (f"in{slot}",), functional, f"{nm} DDR->AM")], [],
                        [dma_op(m, a, dst, (f"in{slot}",), ("out",), functional, "AM->DDR")])

            return stream(items, nbuf, functional, stage, key, cache)

        in_specs = op.inputs(wl)
        out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
        ddr = {nm: s for nm, s, _ in in_specs}
        ddr["out"] = out_shape
        hpre, hpost = host_ops(m, [(nm, nbytes(s)) for nm, s, _ in in_specs], [("out", nbytes(out_shape))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=[nm for nm, _, _ in in_specs], output="out",
                        out_shape=out_shape, flops=0, cores_used=sum(1 for s in shares if s),
                        info={"layout_change": "none", "path": config["path"]})
