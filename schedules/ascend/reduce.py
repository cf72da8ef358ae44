"""Row reductions (reduce_sum, reduce_max) and row softmax on the vector unit.

    FOR row tile (split over `block_dim` cores):   rows GM -> UB (MTE2, rows padded to 32 B)
      per row: vcadd / vcmax fold each 256 B repeat to one element, then fold the partials
               until one is left (fp16 sums and softmax work in fp32 after a vconv)
      softmax: max, x - max (vector_dup of the max), exp, sum, / sum, cast back
      results UB -> GM (MTE3)
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, Plan, ceil_div, split_even
from opcompiler.backend.ascend.isa import Buf, VOp
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, core_values, machine

ROW_TILES = (1, 2, 4, 8, 16, 32, 64)


def fold(kb: KernelBuilder, op: str, src: Buf, soff: int, count: int, scratch: Buf, dst: Buf, doff: int) -> None:
    """Reduce `count` elements at src[soff:] to dst[doff] with repeated vcadd / vcmax."""
    lanes = kb.m.lanes(max(src.itemsize, scratch.itemsize))
    cur, off = src, soff
    while count > lanes:
        kb.vec(op, VOp(scratch, 0), (VOp(cur, off),), count)
        cur, off, count = scratch, 0, ceil_div(count, lanes)
        if count > lanes:  # fold the partials into the upper half of the scratch
            kb.vec(op, VOp(scratch, scratch.shape[0] // 2), (VOp(scratch, 0),), count)
            cur, off, count = scratch, scratch.shape[0] // 2, ceil_div(count, lanes)
    kb.vec(op, VOp(dst, doff), (VOp(cur, off),), count)


class _RowTemplate(AscendTemplate):
    """Shared knobs and tiling of the (m, n) row kernels."""

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        rows = tuple(v for v in ROW_TILES if v <= max(wl["m"], 1)) or (1,)
        return [Knob("rows_tile", rows, "rows per UB tile"), Knob("double_buffer", (1, 0), "ping-pong UB tiles"),
                Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the rows are split over")]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        return [{"rows_tile": t, "double_buffer": 1, "block_dim": target.cores}
                for t in reversed(self.space(wl, target)[0].values)]

    def _row_stride(self, wl: Workload) -> int:
        return ceil_div(wl["n"], 16) * 16

    def _work32(self, wl: Workload) -> bool:
        return wl.dtype == "float16" and (wl.op != "reduce_max")

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        isz = np.dtype(wl.dtype).itemsize
        rs, rt = self._row_stride(wl), cfg["rows_tile"]
        out = [("UB", "scratch", 2 * (ceil_div(rs, 64) + 64) * 4), ("UB", "scalar", 64)]
        for s in range(2 if cfg["double_buffer"] else 1):
            out.append(("UB", f"x_{s}", rt * rs * isz))
            if self._work32(wl):
                out.append(("UB", f"x32_{s}", rt * rs * 4))
            ysz = rt * rs if wl.op == "softmax" else rt + 16
            out.append(("UB", f"y_{s}", ysz * 4))
            if self._work32(wl):
                out.append(("UB", f"yo_{s}", ysz * isz))
        return out

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        cfg = self.config(wl, target, config)
        tiles = ceil_div(wl["m"], cfg["rows_tile"])
        cores = min(cfg["block_dim"], tiles)
        isz = np.dtype(wl.dtype).itemsize
        occ = sum(b for _, _, b in self.buffers(wl, target, cfg)) / machine(target).level("UB").capacity
        return {"gm_read_bytes": wl["m"] * wl["n"] * isz, "tiles": tiles, "active_cores": cores,
                "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ,
                "alignment_waste": 1 - wl["n"] / self._row_stride(wl), "fold_stages": max(1, int(np.ceil(
                    np.log(max(wl["n"], 2)) / np.log(machine(target).lanes(4)))))}

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Plan:
        m = machine(target)
        dt, M, N = wl.dtype, wl["m"], wl["n"]
        rs, rt = self._row_stride(wl), cfg["rows_tile"]
        slots = 2 if cfg["double_buffer"] else 1
        work32 = self._work32(wl)
        softmax = wl.op == "softmax"
        units = [(r0, min(rt, M - r0)) for r0 in range(0, M, rt)]
        active = min(cfg["block_dim"], len(units))
        wdt = "float32" if work32 or dt == "float32" else dt

        def program(core: int):
            kb = KernelBuilder(m, core, active)
            X = kb.gm("x", (M, N), dt)
            Y = kb.gm("y", (M, N) if softmax else (M,), dt)
            scratch = kb.alloc("UB", "scratch", (2 * (ceil_div(rs, 64) + 64),), wdt)
            scal = kb.alloc("UB", "scalar", (16,), wdt)
            xs = [kb.alloc("UB", f"x_{s}", (rt, rs), dt) for s in range(slots)]
            x32 = [kb.alloc("UB", f"x32_{s}", (rt, rs), "float32") for s in range(slots)] if work32 else xs
            yshape = (rt, rs) if softmax else (rt + 16,)
            ys = [kb.alloc("UB", f"y_{s}", yshape, wdt) for s in range(slots)]
            yo = [kb.alloc("UB", f"yo_{s}", yshape, dt) for s in range(slots)] if wdt != dt else ys
            lo, hi = split_even(len(units), active, core)
            for j, (r0, rows) in enumerate(units[lo:hi]):
                x, xw, y = xs[j % slots], x32[j % slots], ys[j % slots]
                kb.data_move(x, (slice(0, rows), slice(0, N)), X, (slice(r0, r0 + rows),))
                if work32:
                    kb.vec("conv", VOp(xw), (VOp(x),), rows * rs)
                for r in range(rows):
                    o = r * rs
                    if wl.op == "reduce_sum":
                        fold(kb, "cadd", xw, o, N, scratch, y, r)
                    elif wl.op == "reduce_max":
                        fold(kb, "cmax", xw, o, N, scratch, y, r)
                    else:
                        fold(kb, "cmax", xw, o, N, scratch, scal, 0)
                        kb.vec("dups", VOp(y, o), (VOp(scal, 0),), N)
                        kb.vec("sub", VOp(y, o), (VOp(xw, o), VOp(y, o)), N)
                        kb.vec("exp", VOp(y, o), (VOp(y, o),), N)
                        fold(kb, "cadd", y, o, N, scratch, scal, 0)
                        kb.vec("dups", VOp(xw, o), (VOp(scal, 0),), N)
                        kb.vec("div", VOp(y, o), (VOp(y, o), VOp(xw, o)), N)
                    kb.loop()
                out = y
                if wdt != dt:  # results back to the input dtype
                    out = yo[j % slots]
                    kb.vec("conv", VOp(out), (VOp(y),), rows * rs if softmax else rows)
                src_idx = (slice(0, rows), slice(0, N)) if softmax else (slice(0, rows),)
                kb.data_move(Y, (slice(r0, r0 + rows),), out, src_idx)
                kb.loop()
            return kb.finish(gm_inputs=("x",))

        return Plan(active_cores=active, make_program=program, pack=lambda ins: {"x": np.ascontiguousarray(ins[0])},
                    out_name="y", out_shape=(M, N) if softmax else (M,), out_dtype=dt, unpack=lambda y: y,
                    flops=get_op(wl.op).flops(wl), unit="vector",
                    info={"gm_layouts": {"x": "ND (m, n)"}, "layout_change": "none"})


@register_template
class AscendReduce(_RowTemplate):
    """reduce_sum / reduce_max over the last axis with vcadd / vcmax folds."""

    name = "ascend.reduce"
    op_families = ("reduce",)
    version = 1


@register_template
class AscendSoftmax(_RowTemplate):
    """Row softmax in fp32 on the vector unit (max, exp, sum, divide)."""

    name = "ascend.softmax"
    op_families = ("softmax",)
    version = 1
