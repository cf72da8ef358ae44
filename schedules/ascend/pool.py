"""pool2d (max / average) on the vector unit over NC1HWC0, tiled by output rows in UB.

    FOR plane (n, c1), output-row tile (split over `block_dim` cores):
      fill the padded input tile with the pad value (V, only when pad > 0)
      input rows GM -> UB interior (MTE2)
      FOR output row, window tap (ky, kx): out row (op)= input row ky, columns kx + stride*j
        one instruction covers 8 output pixels per repeat: block stride = stride pixels (V)
      average: divide by the per-pixel window count (padding excluded), loaded from GM (MTE2)
      UB -> GM (MTE3)

GM layouts (host-side preprocessing): x and y as NC1HWC0 (N*C1, H, W, 16); the average's
count table (Ho, Wo, 16) is derived from the shape on the host (like a weight).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import Buf, VOp
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import _pool_out
from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, core_values, from_5hd, machine, to_5hd

C0 = 16
ROW_TILES = (1, 2, 4, 8, 16, 32, 64)


def _geo(wl: Workload):
    ho, wo = _pool_out(wl)
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    wp = max(wl["w"] + 2 * p, (wo - 1) * s + k)
    return ho, wo, k, s, p, wp


def pixel_op(kb: KernelBuilder, op: str, dst: Buf, doff: int, src: Buf, soff: int, stride: int, npix: int) -> None:
    """dst[j] (op)= src[stride * j] for npix pixels of 16 channels: 8 pixels per repeat, blocks
    `stride` pixels apart (fp16: one 32 B block per pixel; fp32: two, done as two instructions
    that each take every other block). `op` is "copy" (dst = src) or a binary op."""
    bpp = C0 * dst.itemsize // 32  # blocks per pixel
    lanes_pb = 32 // dst.itemsize  # lanes per block
    full, tail = divmod(npix, 8)
    for half in range(bpp):
        for reps, pix0, mask in ((full, 0, 8 * lanes_pb), (1 if tail else 0, full * 8, tail * lanes_pb)):
            if reps == 0:
                continue
            d = VOp(dst, doff + pix0 * C0 + half * lanes_pb, bpp, 8 * bpp)
            sv = VOp(src, soff + pix0 * stride * C0 + half * lanes_pb, stride * bpp, 8 * stride * bpp)
            kb.vec_raw(op, d, (sv,) if op == "copy" else (d, sv), reps, mask)


@register_template
class AscendPool(AscendTemplate):
    """Max / average pooling with the window taps as strided vector instructions."""

    name = "ascend.pool2d"
    op_families = ("pool",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        ho = _pool_out(wl)[0]
        rows = tuple(v for v in ROW_TILES if v < ho) + (min(v for v in ROW_TILES if v >= ho) if ho <= 64 else 64,)
        return [Knob("oh_tile", tuple(dict.fromkeys(rows)), "output rows per UB tile"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        sp = self.space(wl, target)[0].values
        return [{"oh_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(sp)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        ho, wo, k, s, p, wp = _geo(wl)
        isz = np.dtype(wl.dtype).itemsize
        rt = cfg["oh_tile"]
        rin = (rt - 1) * s + k
        out = []
        for sl in range(2 if cfg["double_buffer"] else 1):
            out += [("UB", f"in_{sl}", rin * wp * C0 * isz), ("UB", f"out_{sl}", rt * wo * C0 * isz)]
            if wl["mode"] == "avg":
                out.append(("UB", f"cnt_{sl}", rt * wo * C0 * isz))
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Plan:
        m = machine(target)
        dt = wl.dtype
        n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
        ho, wo, k, s, p, wp = _geo(wl)
        c1 = ceil_div(c, C0)
        rt = cfg["oh_tile"]
        rin = (rt - 1) * s + k
        slots = 2 if cfg["double_buffer"] else 1
        avg = wl["mode"] == "avg"
        units = [(pl, r0, min(rt, ho - r0)) for pl in range(n * c1) for r0 in range(0, ho, rt)]
        active = min(cfg["block_dim"], len(units))
        fill = 0.0 if avg else float(np.finfo(dt).min)

        def program(core: int):
            kb = KernelBuilder(m, core, active)
            X = kb.gm("x", (n * c1, h, w, C0), dt)
            Y = kb.gm("y", (n * c1, ho, wo, C0), dt)
            CNT = kb.gm("count", (ho, wo, C0), dt) if avg else None
            bins = [kb.alloc("UB", f"in_{sl}", (rin, wp, C0), dt) for sl in range(slots)]
            bouts = [kb.alloc("UB", f"out_{sl}", (rt, wo, C0), dt) for sl in range(slots)]
            bcnt = [kb.alloc("UB", f"cnt_{sl}", (rt, wo, C0), dt) for sl in range(slots)] if avg else None
            lo, hi = split_even(len(units), active, core)
            for j, (pl, r0, rows) in enumerate(units[lo:hi]):
                bi, bo = bins[j % slots], bouts[j % slots]
                y0 = r0 * s - p  # input row held in tile row 0
                ya, yb = max(y0, 0), min(y0 + (rows - 1) * s + k, h)  # rows present in the image
                if p > 0:
                    kb.vec("dup", VOp(bi), (), rin * wp * C0, scalar=fill)
                kb.data_move(bi, (slice(ya - y0, yb - y0), slice(p, p + w)), X, (pl, slice(ya, yb)))
                for r in range(rows):
                    for ky in range(k):
                        for kx in range(k):
                            soff = ((r * s + ky) * wp + kx) * C0
                            op = "copy" if ky == kx == 0 else ("add" if avg else "max")
                            pixel_op(kb, op, bo, r * wo * C0, bi, soff, s, wo)
                if avg:
                    bc = bcnt[j % slots]
                    kb.data_move(bc, (slice(0, rows),), CNT, (slice(r0, r0 + rows),))
                    kb.vec("div", VOp(bo), (VOp(bo), VOp(bc)), rows * wo * C0)
                kb.data_move(Y, (pl, slice(r0, r0 + rows)), bo, (slice(0, rows),))
                kb.loop()
            return kb.finish(gm_inputs=("x", "count"))

        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            gm = {"x": to_5hd(inputs[0], layout, C0).reshape(n * c1, h, w, C0)}
            if avg:
                oy, ox = np.arange(ho) * s - p, np.arange(wo) * s - p
                cy = np.minimum(oy + k, h) - np.maximum(oy, 0)
                cx = np.minimum(ox + k, w) - np.maximum(ox, 0)
                gm["count"] = np.repeat((cy[:, None] * cx[None, :])[:, :, None], C0, axis=2).astype(dt)
            return gm

        def unpack(y: np.ndarray) -> np.ndarray:
            return from_5hd(y.reshape(n, c1, ho * wo, C0), c, ho, wo, layout)

        return Plan(active_cores=active, make_program=program, pack=pack, out_name="y",
                    out_shape=(n * c1, ho, wo, C0), out_dtype=dt, unpack=unpack, flops=get_op(wl.op).flops(wl),
                    unit="vector", info={"gm_layouts": {"x": "NC1HWC0 (N*C1, H, W, 16)", "y": "NC1HWC0"},
                                         "layout_change": "NCHW/NHWC <-> NC1HWC0 on the host",
                                         "channel_padding_waste": round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        ho, wo, k, s, p, wp = _geo(wl)
        isz = np.dtype(wl.dtype).itemsize
        c1 = ceil_div(wl["c"], C0)
        tiles = wl["n"] * c1 * ceil_div(ho, cfg["oh_tile"])
        rin = (cfg["oh_tile"] - 1) * s + k
        gm_read = tiles * rin * wl["w"] * C0 * isz
        gm_write = wl["n"] * c1 * ho * wo * C0 * isz
        cores = min(cfg["block_dim"], tiles)
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_read_bytes": gm_read, "gm_write_bytes": gm_write, "halo_ratio": rin / (cfg["oh_tile"] * s),
                "tiles": tiles, "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores),
                "occupancy_UB": occ, "vector_instr_per_row": k * k * (2 if isz == 4 else 1),
                "alignment_waste": 1 - wl["c"] / (c1 * C0)}
