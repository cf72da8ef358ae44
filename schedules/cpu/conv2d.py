"""CPU conv2d (and its fused epilogues): direct convolution with a register tile of
accumulators (`tile_reg` x `tile_vec`, the vector axis being W in NCHW and K in NHWC),
`tile_row` output rows per task, reduction loops outside the tile, parallel over the rest."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.cpu_intrin import vector_lanes
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from .common import block_names, create_schedule, divisors, inline_all_except, near, output_block


def _extents(wl: Workload) -> dict[str, int]:
    ho, wo = conv_out_hw(wl)
    return {"k": wl["k"], "y": ho, "x": wo}


@register_template
class CpuConv2d(Template):
    name = "cpu.conv2d.direct"
    op_families = ("conv2d",)
    target_family = "cpu"
    version = 1

    def _roles(self, wl: Workload) -> tuple[str, str]:
        # (vector axis, register axis): K on the vector lanes in both layouts (NCHW packs the
        # weights so K is contiguous), output pixels along W in registers.
        return ("k", "x")

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        ext = _extents(wl)
        kg = wl["k"] // wl["groups"]
        return [
            Knob("tile_vec", divisors(kg, 64), "output channels per accumulator (vectorized)"),
            Knob("tile_reg", divisors(ext["x"], 16), "output pixels along W per register tile (unrolled)"),
            Knob("tile_row", divisors(ext["y"], 4), "output rows per register tile"),
            Knob("reduce_order", ("crs", "rsc"), "order of the C, R, S reduction loops"),
            Knob("pad_inline", (0, 1), "1: padding checks inside the loop nest; 0: a padded copy first"),
        ]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        knobs = {k.name: k for k in self.space(wl, target)}
        lanes = vector_lanes("float32")
        vec = near(knobs["tile_vec"].values, 2 * lanes)
        reg = near(knobs["tile_reg"].values, max(1, 24 // max(1, -(-vec // lanes))))
        return {"tile_vec": vec, "tile_reg": reg, "tile_row": 1, "reduce_order": "rsc", "pad_inline": 0}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        lanes = vector_lanes("float32")
        regs = config["tile_reg"] * config["tile_row"] * -(-config["tile_vec"] // lanes)
        if regs > 64:
            return f"register tile needs {regs} vector registers (more than 64); shrink tile_reg/tile_row/tile_vec"
        return None

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]):
        sch = create_schedule(wl)
        conv = sch.get_sblock("conv2d")
        keep = {"conv2d"} | ({"pad"} if not config["pad_inline"] and "pad" in block_names(sch) else set())
        inline_all_except(sch, keep)
        if "pad" in keep:
            pad_loops = sch.get_loops(sch.get_sblock("pad"))
            sch.parallel(sch.fuse(*pad_loops[:2]))
            sch.vectorize(pad_loops[-1]) if False else None
        vt = config["tile_vec"]
        if wl.layout == "NCHW":  # pack OIHW weights to (K/vt, C, R, S, vt) so the vector loads are contiguous
            wpack = sch.cache_read(conv, 1, "global")
            sch.transform_layout(wpack, ("write", 0), lambda k, c, r, s: (k // vt, c, r, s, k % vt))
            wl_loops = sch.get_loops(wpack)
            sch.parallel(wl_loops[0])
        out = output_block(sch)
        if sch.get(out).name_hint == "conv2d":  # no epilogue: accumulate in a local tile, then write back
            sch.cache_write(conv, 0, "local")
            conv, out = sch.get_sblock("conv2d"), output_block(sch)
        else:
            sch.set_scope(conv, 0, "local")
        if wl.layout == "NCHW":  # accumulators K-innermost, so the vector lanes are contiguous registers
            sch.transform_layout(conv, ("write", 0), lambda n, k, y, x: (n, y, x, k))
        loops = sch.get_loops(conv)
        n, a1, a2, a3 = loops[:4]
        red = loops[4:]
        axes = {"k": a1, "y": a2, "x": a3} if wl.layout == "NCHW" else {"y": a1, "x": a2, "k": a3}
        names = ("c", "r", "s") if wl.layout == "NCHW" else ("r", "s", "c")
        rmap = dict(zip(names, red))
        ko, ki = sch.split(axes["k"], [None, vt])
        xo, xi = sch.split(axes["x"], [None, config["tile_reg"]])
        yo, yi = sch.split(axes["y"], [None, config["tile_row"]])
        order = [rmap[c] for c in config["reduce_order"]]
        sch.reorder(n, ko, yo, xo, *order, yi, xi, ki)
        sch.parallel(sch.fuse(n, ko, yo))
        sch.reverse_compute_at(out, xo)
        sch.vectorize(ki)  # before decompose_reduction: the update block must still own its init
        sch.unroll(xi)
        sch.unroll(yi)
        sch.decompose_reduction(conv, order[0])
        if vt > 1:  # with one lane the epilogue's innermost loop is a shared outer loop: nothing to vectorize
            sch.vectorize(sch.get_loops(out)[-1])
        return sch

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        ext = _extents(wl)
        vec, reg = self._roles(wl)
        lanes = vector_lanes("float32")
        return {
            "accumulators": config["tile_reg"] * config["tile_row"] * config["tile_vec"],
            "vector_fill": config["tile_vec"] / (lanes * -(-config["tile_vec"] // lanes)),
            "tasks": (wl["n"] * ext["y"] // config["tile_row"]) * (ext[reg] // config["tile_reg"]),
        }
