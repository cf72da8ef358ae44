"""Lower a scheduled fm_interaction (DeepFM's pairwise term) to the AI Core program.

The module comes from `schedules/ascend/fm.py`: the sample loop split into tiles (the tile loop
carries `opc.ascend.block_dim` and `opc.ascend.double_buffer`), under it the nests, in order:

    e -> e_local.UB               dma_copy        the tile's samples GM -> UB (MTE2, one DMA)
    [fm_in                        vector_auto     fp16 -> fp32 (vconv), the whole tile]
    fm_sum                        fm_field_sum    s = sum over the fields
    fm_sq                         vector_auto     e * e, the whole tile (in place)
    fm_sumsq                      fm_field_sum    q = sum over the fields of the squares
    fm_out                        vector_auto     s * s - q [, vconv to fp16]
    fm_out_local.UB -> fm_out     dma_copy        the tile's results UB -> GM (MTE3, one DMA)

Read from the module: e's and the output's shapes and dtypes (the function's parameters), the
tile loop (extent, cores, buffering), the samples per tile (the copy-out's loop extent) and the
nests' order. A field sum is f - 1 vector adds, each over the tile's samples at once: one repeat
per sample (its k values, at most 64 fp32 lanes; wider rows take one add per 64 lanes), the
source's repeat stride one sample's f x k values, the destination's one sample's k (a stride
beyond the instruction's 255 blocks falls back to one add per sample). Each field's k values
sit in UB padded to 32 B (`kpad`): the DMA in writes them as one burst per field row.
"""
from __future__ import annotations

from typing import Any, Mapping


from opcompiler.errors import OpcFailure

from .builder import KernelBuilder, ceil_div, group_sums, split_even, walk_tiled
from ..program import Program, VOp
from ..intrin import DMA_COPY, VECTOR_AUTO
from ..machine import Machine

FIELD_SUM = "fm_field_sum"  # the pragma of a field-sum nest


def _walk(mod) -> dict[str, Any]:
    found = walk_tiled(mod)
    if len(found["gm"]) != 2:
        raise OpcFailure(f"emit_fm: an fm module has e and out; not {len(found['gm'])} tensors")
    nests = [pr for pr, _ in found["nests"]]
    cast = found["gm"][0][2] != "float32"
    want = [DMA_COPY] + [VECTOR_AUTO] * cast + [FIELD_SUM, VECTOR_AUTO, FIELD_SUM, VECTOR_AUTO, DMA_COPY]
    if "tiles" not in found or nests != want:
        raise OpcFailure(f"emit_fm: expected a tile loop with nests {want}; found {nests}")
    found["rows_tile"] = found["nests"][-1][1]  # the copy out's samples
    return found


class FmKernel:
    """Each core's program of one scheduled fm_interaction (see the module docstring)."""

    def __init__(self, mod, kpad: int):
        w = _walk(mod)
        (self.ename, (self.b, self.f, self.k), self.dtype), (self.oname, _, _) = w["gm"]
        self.tiles, self.rt, self.slots = w["tiles"], w["rows_tile"], w["slots"]
        if ceil_div(self.b, self.rt) != self.tiles:
            raise OpcFailure(f"emit_fm: {self.tiles} tiles of {self.rt} samples do not cover {self.b}")
        self.kp = int(kpad)
        self.active_cores = max(1, min(w["cores"], self.tiles))

    def program(self, m: Machine, core: int) -> Program:
        kb = KernelBuilder(m, core, self.active_cores)
        f, k, kp, rt = self.f, self.k, self.kp, self.rt
        cast = self.dtype != "float32"
        E = kb.gm(self.ename, (self.b, f, k), self.dtype)
        Y = kb.gm(self.oname, (self.b, k), self.dtype)
        e16 = [kb.alloc("UB", f"e_{s}", (rt, f, kp), self.dtype) for s in range(self.slots)] if cast else []
        e32 = [kb.alloc("UB", f"e32_{s}", (rt, f, kp), "float32") for s in range(self.slots)]
        sm = [kb.alloc("UB", f"sum_{s}", (rt, kp), "float32") for s in range(self.slots)]
        sq = [kb.alloc("UB", f"sumsq_{s}", (rt, kp), "float32") for s in range(self.slots)]
        o16 = [kb.alloc("UB", f"out_{s}", (rt, kp), self.dtype) for s in range(self.slots)] if cast else sm
        t0, t1 = split_even(self.tiles, self.active_cores, core)
        for j, t in enumerate(range(t0, t1)):
            s = j % self.slots
            i0 = t * rt
            cnt = min(rt, self.b - i0)
            kb.loop()
            x = e16[s] if cast else e32[s]
            kb.data_move(x, (slice(0, cnt), slice(None), slice(0, k)), E, (slice(i0, i0 + cnt),))
            if cast:
                kb.vec("conv", VOp(e32[s]), (VOp(e16[s]),), cnt * f * kp)
            group_sums(kb, sm[s], e32[s], cnt, f, kp, kp)
            kb.vec("mul", VOp(e32[s]), (VOp(e32[s]), VOp(e32[s])), cnt * f * kp)
            group_sums(kb, sq[s], e32[s], cnt, f, kp, kp)
            kb.vec("mul", VOp(sm[s]), (VOp(sm[s]), VOp(sm[s])), cnt * kp)
            kb.vec("sub", VOp(sm[s]), (VOp(sm[s]), VOp(sq[s])), cnt * kp)
            if cast:
                kb.vec("conv", VOp(o16[s]), (VOp(sm[s]),), cnt * kp)
            kb.data_move(Y, (slice(i0, i0 + cnt),), o16[s], (slice(0, cnt), slice(0, k)))
        return kb.finish(gm_inputs=(self.ename,), lowering="emit_fm (field sums as strided vector adds)")


def lower(mod, params: Mapping[str, Any]) -> FmKernel:
    return FmKernel(mod, int(params["kpad"]))


__all__ = ["FIELD_SUM", "FmKernel", "lower"]
