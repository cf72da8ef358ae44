"""Element-wise and broadcast ops on the vector unit, tiled through UB with double buffering.

    FOR UB tile of this core's share:   GM -> UB (MTE2), vector ops in UB (V), UB -> GM (MTE3)

Every op is a chain of vector steps (relu, sigmoid, clip, add/mul with a same-shape operand,
bias/scale/bn with per-channel operands; ew_chain spells the chain out). Chains without
per-channel steps (relu, add, add_relu) stream the flat tensor in its own layout; chains with
them (bias_add, batch_norm, bn_relu, add_relu with a per-channel y) work on NC1HWC0, so one
256 B repeat covers 8 pixels x 16 channels and the channel parameters are read with block
stride 0 (fp16) or as two half-row instructions (fp32): fp32 moves twice the bytes and gets
half the lanes per repeat (seed 000 §6.3.2, Table 6). The NCHW <-> NC1HWC0 change is
host-side preprocessing (activations live in NC1HWC0 between Ascend kernels). concat copies
each input's contiguous channel block per image through UB (MTE2 -> UB -> MTE3, no vector work).

Flat chains (relu, add, add_relu without broadcast, ew_chain without per-channel steps) take the
TVM route: `elemwise_tir.flat_schedule` schedules the op's own TE compute (UB tiles, cache_read /
cache_write, stages computed at the tile loop, emit_insn pragmas, the knobs as split factor and
loop annotations) and the backend's `emit_insn` lowering turns the scheduled module into each
core's program. Per-channel chains take it too: `channel_tir.channel_schedule` schedules the
chain on the NC1HWC0 view (parameters resident in UB, a per-channel step lowered to block
stride 0 / half-row instructions). slice, pad and transpose take it too: `move_tir.move_schedule`
views the tensors as the runs the op moves and writes the op's block through a UB tile (MTE2 in,
MTE3 out, a vector dup for padding), lowered by the backend's `emit_move`; concat too
(`move_tir.concat_schedule`). `apply` returns the schedule as a `Scheduled` whose lowering
("vector" or "move") the backend's `lower.py` runs.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.steps import STEPS, chain_temp_bytes, chain_temps, chain_text
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, from_5hd, machine, per_channel, to_5hd

MOVE_TIR = ("slice", "pad", "transpose", "concat")  # the data-movement ops on the TVM route
UB_TILES = (1024, 2048, 4096, 8192, 16384, 32768)
C0 = 16


def _steps(wl: Workload) -> list[tuple[str, tuple[float, ...]]]:
    """The op as a chain of vector steps over x, as the catalogue declares it (`OpDef.chain`; the
    steps and the operands each reads: `opcompiler.ops.steps.STEPS`)."""
    steps = get_op(wl.op).steps(wl)
    if steps is None:
        raise OpcError(f"no ascend vector template for {wl.op}", arg="op", value=wl.op,
                       expected="an op with a chain in the catalogue (relu, bn_relu, ew_chain, ...), "
                                "concat, pad, slice or transpose")
    return steps


def _kind(wl: Workload) -> str:
    if wl.op in ("concat", "pad", "transpose", "slice"):
        return wl.op
    steps = _steps(wl)
    return "channel" if any("chan" in STEPS[n].operands for n, _ in steps) else "flat"


def _n_full(wl: Workload) -> int:
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else sum(STEPS[n].operands.count("full") for n, _ in _steps(wl))


def _n_chan(wl: Workload) -> int:
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else sum(STEPS[n].operands.count("chan") for n, _ in _steps(wl))


def _n_temps(wl: Workload) -> int:
    """Tiles a step holds beside x's (hardswish keeps x until its last multiply)."""
    return 0 if wl.op in ("concat", "pad", "transpose", "slice") else chain_temps(_steps(wl))


def _shape(wl: Workload) -> tuple[int, int, int, int]:
    return wl["n"], wl["c"], wl["h"], wl["w"]


@register_template
class AscendElemwise(AscendTemplate):
    """Vector-unit streaming kernel: UB tiles, ping-pong buffers, work split over cores."""

    name = "ascend.elemwise"
    op_families = ("elemwise",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _kind(wl)  # rejects ops without a vector template
        return [Knob("ub_tile", UB_TILES, "elements per UB tile (per operand)"),
                Knob("double_buffer", (1, 0), "ping-pong UB tiles so MTE2, V and MTE3 overlap"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the tiles are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        return [{"ub_tile": t, "double_buffer": 1, "block_dim": target.cores} for t in reversed(UB_TILES)]

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        slots = 2 if cfg["double_buffer"] else 1
        c1 = ceil_div(wl.p.get("c", 1), C0)
        out = [("UB", f"param{i}", c1 * C0 * isz) for i in range(_n_chan(wl))]
        for s in range(slots):
            out += [("UB", f"x{i}_{s}", cfg["ub_tile"] * isz) for i in range(1 + _n_full(wl))]
            if _n_temps(wl):
                out.append(("UB", f"temps_{s}", cfg["ub_tile"] * chain_temp_bytes(_steps(wl), wl.dtype)))
        return out

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        kind = _kind(wl)
        if kind in MOVE_TIR:
            return self._apply_move_tir(wl, target, cfg)
        if kind == "flat":
            return self._apply_flat_tir(wl, target, cfg)
        if kind == "channel":
            return self._apply_channel_tir(wl, target, cfg)
        raise OpcError(f"no ascend element-wise lowering for {wl.op}", arg="op", value=wl.op)

    def _apply_move_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Data movement through TVM: `move_tir.move_schedule` schedules the op's TE compute
        (views of the runs it moves, the op's block cache_written into a UB tile, tiles of
        ub_tile elements, dma_copy pragmas) for the backend's "move" lowering (`emit_move`:
        MTE2 / MTE3 boxes, a vector dup for padding). The inputs go to GM as the views of the
        runs the module moves."""
        from .move_tir import logical_out_shape, move_schedule

        out_shape = logical_out_shape(wl)
        return Scheduled(lowering="move", module=lambda: (move_schedule(wl, cfg), ()),
                         host=HostLayout(unpack=lambda y: y.reshape(out_shape), out_dtype=wl.dtype), flops=0,
                         info={"steps": wl.op, "layout_change": "none", "channel_padding_waste": 0.0})

    def _apply_flat_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Flat chains through TVM: `elemwise_tir.flat_schedule` schedules the op's TE compute
        (UB tiles, cache_read / cache_write, stages computed at the tile loop, emit_insn pragmas)
        for the backend's "vector" lowering (`emit_insn`). The tensors stream flat."""
        from .elemwise_tir import flat_schedule

        n, c, h, w = _shape(wl)
        out_shape = (n, c, h, w) if wl.layout == "NCHW" else (n, h, w, c)
        return Scheduled(lowering="vector", module=lambda: (flat_schedule(wl, cfg), ()),
                         host=HostLayout(unpack=lambda y: y.reshape(out_shape), out_dtype=wl.dtype),
                         flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "flat"}, "steps": ";".join(nm for nm, _ in _steps(wl)),
                               "layout_change": "none (streams the tensor in its own layout)",
                               "channel_padding_waste": 0.0})

    def _apply_channel_tir(self, wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
        """Per-channel chains through TVM: `channel_tir.channel_schedule` schedules the chain on
        the NC1HWC0 view (UB tiles of ub_tile / 16 pixels of one channel block, parameters
        resident in UB, emit_insn pragmas) for the backend's "vector" lowering (`emit_insn`;
        per-channel steps: block stride 0 for fp16, two half-row instructions for fp32)."""
        from .channel_tir import channel_schedule

        steps = _steps(wl)
        chain = chain_text(steps)
        n, c, h, w = _shape(wl)
        c1, hw = ceil_div(c, C0), h * w
        gm_shape = (n * c1, hw, C0)
        layout = wl.layout

        def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
            fulls, chans, rest = [], [], iter(inputs[1:])
            for name, _ in steps:  # operands come in step order
                for what in STEPS[name].operands:
                    (fulls if what == "full" else chans).append(next(rest))
            gm = {f"x{i}": to_5hd(a, layout, C0).reshape(gm_shape) for i, a in enumerate([inputs[0], *fulls])}
            for i, a in enumerate(chans):
                gm[f"p{i}"] = per_channel(a.reshape(-1), c1, C0)
            return gm

        return Scheduled(lowering="vector", module=lambda: (channel_schedule(wl, chain, cfg), ()),
                         host=HostLayout(pack=pack, unpack=lambda y: from_5hd(y.reshape(n, c1, hw, C0), c, h, w, layout),
                                         out_shape=gm_shape, out_dtype=wl.dtype),
                         flops=get_op(wl.op).flops(wl),
                         info={"gm_layouts": {"x": "NC1HWC0 (N*C1, H*W, 16)"}, "steps": ";".join(nm for nm, _ in steps),
                               "layout_change": "NCHW/NHWC <-> NC1HWC0 on the host",
                               "channel_padding_waste": round(1 - c / (c1 * C0), 4)})

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        isz = np.dtype(wl.dtype).itemsize
        kind = _kind(wl)
        if kind in ("transpose", "slice"):
            n, c, h, w = 1, 1, 1, int(np.prod([int(d) for d in str(wl["dims"]).split("x")]))
        else:
            n, c, h, w = _shape(wl)
        elems = {"flat": n * c * h * w, "channel": n * ceil_div(c, C0) * C0 * h * w}.get(
            kind, n * (c + wl.p.get("c1", 0)) * h * w)
        tiles = ceil_div(elems, cfg["ub_tile"])
        cores = min(cfg["block_dim"], tiles)
        gm = elems * isz * (_n_full(wl) + 2)
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_bytes": gm, "arith_intensity": get_op(wl.op).flops(wl) / gm, "tiles": tiles,
                "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ,
                "alignment_waste": 1 - n * c * h * w / elems if kind == "channel" else 0.0,
                "lanes": machine(target).lanes(isz)}
