"""Element-wise and broadcast ops on the vector unit, tiled through UB with double buffering.

    FOR UB tile of this core's share:   GM -> UB (MTE2), vector ops in UB (V), UB -> GM (MTE3)

relu, add and add_relu (same shapes) stream the flat tensor in its own layout. Per-channel
ops (bias_add, batch_norm, bn_relu, add_relu with a per-channel y) work on NC1HWC0, so one
256 B repeat covers 8 pixels x 16 channels and the channel parameters are read with block
stride 0 (fp16) or as two half-row instructions (fp32): fp32 moves twice the bytes and gets
half the lanes per repeat (seed 000 §6.3.2, Table 6). The NCHW <-> NC1HWC0 change is
host-side preprocessing (activations live in NC1HWC0 between Ascend kernels).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import VOp
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template import Knob, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, channel_op, core_values, from_5hd, machine, per_channel, to_5hd

UB_TILES = (1024, 2048, 4096, 8192, 16384, 32768)
C0 = 16


def _kind(wl: Workload) -> str:
    if wl.op in ("relu", "add") or (wl.op == "add_relu" and not wl.p.get("bcast")):
        return "flat"
    if wl.op in ("bias_add", "batch_norm", "bn_relu", "add_relu"):
        return "channel"
    raise OpcError(f"no ascend vector template for {wl.op}", arg="op", value=wl.op,
                   expected="relu, add, add_relu, bias_add, batch_norm or bn_relu")


def _shape(wl: Workload) -> tuple[int, int, int, int]:
    return wl["n"], wl["c"], wl["h"], wl["w"]


@register_template
class AscendElemwise(AscendTemplate):
    """Vector-unit streaming kernel: UB tiles, ping-pong buffers, work split over cores."""

    name = "ascend.elemwise"
    op_families = ("elemwise",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _kind(wl)
        return [Knob("ub_tile", UB_TILES, "elements per UB tile (per operand)"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles so MTE2, V and MTE3 overlap"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        return [{"ub_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(UB_TILES)]

    def _n_in(self, wl: Workload) -> int:
        return 2 if wl.op in ("add", "add_relu") and _kind(wl) == "flat" else 1

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        slots = 2 if cfg["double_buffer"] else 1
        out = []
        if _kind(wl) == "channel":
            c1 = ceil_div(wl["c"], C0)
            out += [("UB", f"param{i}", c1 * C0 * isz) for i in range(2)]
        for s in range(slots):
            out += [("UB", f"x{i}_{s}", cfg["ub_tile"] * isz) for i in range(self._n_in(wl))]
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Plan:
        m = machine(target)
        kind = _kind(wl)
        dt = wl.dtype
        n, c, h, w = _shape(wl)
        slots = 2 if cfg["double_buffer"] else 1
        tile = cfg["ub_tile"]
        op = wl.op
        c1, hw = ceil_div(c, C0), h * w
        if kind == "flat":
            total = n * c * h * w
            blk = 32 // np.dtype(dt).itemsize  # core shares start on a 32 B block
            units = [(0, s, min(tile, total - s)) for s in range(0, total, tile)]
            gm_shape = (total,)
        else:
            rows_per_tile = max(1, tile // C0)
            units = [(p, r, min(rows_per_tile, hw - r)) for p in range(n * c1) for r in range(0, hw, rows_per_tile)]
            gm_shape = (n * c1, hw, C0)
            blk = 1
        active = min(cfg["block_dim"], len(units))

        def program(core: int):
            kb = KernelBuilder(m, core, active)
            n_in = self._n_in(wl)
            xs = [kb.gm(f"x{i}", gm_shape, dt) for i in range(n_in)]
            y = kb.gm("y", gm_shape, dt)
            params = []
            if kind == "channel":
                names = {"bias_add": ("p0",), "add_relu": ("p0",), "batch_norm": ("p0", "p1"), "bn_relu": ("p0", "p1")}
                for i, nm in enumerate(names[op]):
                    g = kb.gm(nm, (c1, C0), dt)
                    b = kb.alloc("UB", f"param{i}", (c1, C0), dt)
                    kb.data_move(b, (slice(None),), g, (slice(None),))
                    params.append(b)
            bufs = [[kb.alloc("UB", f"x{i}_{s}", (tile,), dt) for i in range(n_in)] for s in range(slots)]
            lo, hi = split_even(len(units), active, core)
            for j, (plane, start, cnt) in enumerate(units[lo:hi]):
                ub = bufs[j % slots]
                if kind == "flat":
                    for i in range(n_in):
                        kb.data_move(ub[i], (slice(0, cnt),), xs[i], (slice(start, start + cnt),))
                    if op == "relu":
                        kb.vec("relu", VOp(ub[0]), (VOp(ub[0]),), cnt)
                    else:
                        kb.vec("add", VOp(ub[0]), (VOp(ub[0]), VOp(ub[1])), cnt)
                        if op == "add_relu":
                            kb.vec("relu", VOp(ub[0]), (VOp(ub[0]),), cnt)
                    kb.data_move(y, (slice(start, start + cnt),), ub[0], (slice(0, cnt),))
                else:
                    x = ub[0]
                    kb.data_move(x, (slice(0, cnt * C0),), xs[0], (plane, slice(start, start + cnt)))
                    cb = (plane % c1) * C0
                    if op in ("bias_add", "add_relu"):
                        channel_op(kb, "add", x, 0, cnt, params[0], cb)
                    else:
                        channel_op(kb, "mul", x, 0, cnt, params[0], cb)
                        channel_op(kb, "add", x, 0, cnt, params[1], cb)
                    if op in ("bn_relu", "add_relu"):
                        kb.vec("relu", VOp(x), (VOp(x),), cnt * C0)
                    kb.data_move(y, (plane, slice(start, start + cnt)), x, (slice(0, cnt * C0),))
                kb.loop()
            return kb.finish(gm_inputs=("x0", "x1", "p0", "p1"))

        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            if kind == "flat":
                return {f"x{i}": np.ascontiguousarray(x).reshape(-1) for i, x in enumerate(inputs)}
            gm = {"x0": to_5hd(inputs[0], layout, C0).reshape(gm_shape)}
            if op == "add_relu":
                gm["p0"] = per_channel(inputs[1], c1, C0)
            else:
                for i, p in enumerate(inputs[1:]):
                    gm[f"p{i}"] = per_channel(p, c1, C0)
            return gm

        out_shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)

        def unpack(y: np.ndarray) -> np.ndarray:
            if kind == "flat":
                return y.reshape(out_shape)
            return from_5hd(y.reshape(n, c1, hw, C0), c, h, w, layout)

        flat_note = "none (streams the tensor in its own layout)"
        return Plan(active_cores=active, make_program=program, pack=pack, out_name="y", out_shape=gm_shape,
                    out_dtype=dt, unpack=unpack, flops=get_op(op).flops(wl), unit="vector",
                    info={"gm_layouts": {"x": "flat" if kind == "flat" else "NC1HWC0 (N*C1, H*W, 16)"},
                          "layout_change": flat_note if kind == "flat" else "NCHW/NHWC <-> NC1HWC0 on the host",
                          "channel_padding_waste": 0.0 if kind == "flat" else round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        n, c, h, w = _shape(wl)
        kind = _kind(wl)
        elems = n * c * h * w if kind == "flat" else n * ceil_div(c, C0) * C0 * h * w
        tiles = ceil_div(elems, cfg["ub_tile"])
        cores = min(cfg["block_dim"], tiles)
        gm = elems * isz * (self._n_in(wl) + 1)
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_bytes": gm, "arith_intensity": get_op(wl.op).flops(wl) / gm, "tiles": tiles,
                "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ,
                "alignment_waste": 1 - n * c * h * w / elems, "lanes": machine(target).lanes(isz)}
