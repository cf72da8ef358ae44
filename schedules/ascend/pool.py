"""pool2d (max / average) on the vector unit over NC1HWC0, tiled by output rows in UB.

The kernel is a TVM schedule (`pool_tir.pool_schedule`: pool2d's own compute on the NC1HWC0
view, the knobs as split factor and tile-loop annotations), returned as a `Scheduled` for the
backend's "vector" lowering (its `emit_insn`); what it issues:

    FOR plane (n, c1), output-row tile (split over `block_dim` cores):
      fill the padded input tile with the pad value (V, only when pad > 0)
      input rows GM -> UB interior (MTE2): the rows and columns the tile's windows read
      FOR output row, window tap (ky, kx): out row (op)= input row ky, columns kx + stride*j
        one instruction covers 8 output pixels per repeat: block stride = stride pixels (V)
      average: divide by the per-pixel window count (padding excluded), loaded from GM (MTE2)
      UB -> GM (MTE3)

GM layouts (host-side preprocessing): x and y as NC1HWC0 (N*C1, H, W, 16); the average's
count table (Ho, Wo, 16) is derived from the shape on the host (like a weight).

Global pooling (one window covering the whole unpadded input, of at least `ROW_TAPS` taps) is a
reduction, not a window: one instruction per tap per output row would cover a single output
pixel (16 of 128 lanes) for each of H*W taps. Such a workload is scheduled as the row reduction
it is (v2): the reduce template's TVM schedule of `reduce_mean` / `reduce_max` over the (N*C,
H*W) rows (x read ND, relaid on the host like every layout change here), lowered by
`emit_reduce` (per row a vcadd / vcmax fold, the mean's 1/(H*W) one vmuls); its knobs are the
reduce template's (`rows_tile`, `double_buffer`, `block_dim`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from opcompiler.ops import get_op
from opcompiler.ops.catalogue import pool_out_hw
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, from_5hd, machine, to_5hd

C0 = 16
ROW_TILES = (1, 2, 4, 8, 16, 32, 64)
ROW_TAPS = 64  # a global window of this many taps or more runs as a row reduction


def row_workload(wl: Workload) -> Workload | None:
    """The row reduction a global pool is ((N*C, H*W) rows, reduce_mean / reduce_max), or None."""
    if wl["pad"] or wl["kernel"] != wl["h"] or wl["kernel"] != wl["w"] or wl["h"] * wl["w"] < ROW_TAPS:
        return None
    from opcompiler.ops import workload
    return workload("reduce_mean" if wl["mode"] == "avg" else "reduce_max",
                    {"m": wl["n"] * wl["c"], "n": wl["h"] * wl["w"]}, dtype=wl.dtype)


def _rows():
    from .reduce import AscendReduce
    return AscendReduce()


def _geo(wl: Workload):
    ho, wo = pool_out_hw(wl)
    k, s, p = wl["kernel"], wl["stride"], wl["pad"]
    wp = max(wl["w"] + 2 * p, (wo - 1) * s + k)
    return ho, wo, k, s, p, wp


@register_template
class AscendPool(AscendTemplate):
    """Max / average pooling with the window taps as strided vector instructions."""

    name = "ascend.pool2d"
    op_families = ("pool",)
    version = 2  # v2: global windows of ROW_TAPS taps or more run as a row reduction

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        if (rw := row_workload(wl)) is not None:
            return _rows().space(rw, target)
        ho = pool_out_hw(wl)[0]
        rows = tuple(v for v in ROW_TILES if v < ho) + (min(v for v in ROW_TILES if v >= ho) if ho <= 64 else 64,)
        return [Knob("oh_tile", tuple(dict.fromkeys(rows)), "output rows per UB tile"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        if (rw := row_workload(wl)) is not None:
            return _rows().preferred(rw, target)
        sp = self.space(wl, target)[0].values
        return [{"oh_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(sp)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        """What the scheduled module holds in UB per slot: the tile's padded input rows and the
        columns its windows read, the output rows (and for avg the count rows)."""
        if (rw := row_workload(wl)) is not None:
            return _rows().buffers(rw, target, cfg)
        ho, wo, k, s, p, _ = _geo(wl)
        isz = np.dtype(wl.dtype).itemsize
        rt = min(cfg["oh_tile"], ho)
        rin = min((cfg["oh_tile"] - 1) * s + k, wl["h"] + 2 * p)
        wp = (wo - 1) * s + k
        out = []
        for sl in range(2 if cfg["double_buffer"] else 1):
            out += [("UB", f"in_{sl}", rin * wp * C0 * isz), ("UB", f"out_{sl}", rt * wo * C0 * isz)]
            if wl["mode"] == "avg":
                out.append(("UB", f"cnt_{sl}", rt * wo * C0 * isz))
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """pool2d through TVM: `pool_tir.pool_schedule` schedules the op's compute on the
        NC1HWC0 view, for the backend's "vector" lowering (`emit_insn`)."""
        from .pool_tir import count_table, pool_schedule

        if (rw := row_workload(wl)) is not None:  # a global window: the row reduction it is
            rs = _rows().apply(rw, target, cfg)
            n, c, layout = wl["n"], wl["c"], wl.layout

            def rows(inputs: list[np.ndarray]) -> list[np.ndarray]:
                x = inputs[0].transpose(0, 3, 1, 2) if layout == "NHWC" else inputs[0]
                return [np.ascontiguousarray(x.reshape(n * c, -1))]

            shape = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
            return replace(rs, host=replace(rs.host, pack=lambda inputs: rs.host.pack(rows(inputs)),
                                            unpack=lambda y: np.ascontiguousarray(y.reshape(shape))),
                           flops=get_op(wl.op).flops(wl),
                           info={**rs.info, "global_pool": f"a row reduction ({rw.op} over {n * c} rows of "
                                                            f"{wl['h'] * wl['w']})",
                                 "layout_change": "NCHW/NHWC -> (N*C, H*W) rows on the host"})
        n, c, h, w = wl["n"], wl["c"], wl["h"], wl["w"]
        ho, wo = pool_out_hw(wl)
        c1 = ceil_div(c, C0)
        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            gm = {"x": to_5hd(inputs[0], layout, C0).reshape(n * c1, h, w, C0)}
            if wl["mode"] == "avg":  # the average's divisor, an input of its module
                gm["count"] = count_table(wl)
            return gm

        def unpack(y: np.ndarray) -> np.ndarray:
            return from_5hd(y.reshape(n, c1, ho * wo, C0), c, ho, wo, layout)

        return Scheduled(lowering="vector", module=lambda: (pool_schedule(wl, cfg), ()),
                         host=HostLayout(pack=pack, unpack=unpack, out_dtype=wl.dtype), flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "NC1HWC0 (N*C1, H, W, 16)", "y": "NC1HWC0"},
                               "layout_change": "NCHW/NHWC <-> NC1HWC0 on the host",
                               "channel_padding_waste": round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        if (rw := row_workload(wl)) is not None:
            return _rows().features(rw, target, config)
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
