"""Pieces shared by the Ascend templates: dtype rules, host-side layouts, knob ranges, the
cube's L0 chunk rule and the UB epilogue's channel groups (TIR schedules place it with
`tir_epilogue_at`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from opcompiler.backend.ascend.builder import KernelBuilder, ceil_div
from opcompiler.backend.ascend.machine import Machine
from opcompiler.backend.ascend.isa import Buf, VOp
from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.template_base import Template
from opcompiler.workload import Workload

POW2_TILES = (16, 32, 64, 128, 256, 512, 1024)


def machine(target: Target) -> Machine:
    return Machine.from_target(target)


def cube_dtype(wl: Workload, target: Target) -> tuple[int, int, int]:
    """The cube fractal for the workload's dtype; fp32 operands are a clear error (seed 000 §6.3.2)."""
    m = machine(target)
    if wl.dtype not in m.cube:
        raise OpcError(f"{wl.op} runs on the cube, which takes {' or '.join(m.cube)} operands on {target.name}; "
                       f"fp32 matrix work would fall to the vector unit at a fraction of the speed (seed 000 "
                       f"§6.3.2)", arg="--dtype", value=wl.dtype, expected="float16 (or int8)")
    return m.cube[wl.dtype]


def tile_values(extent: int, unit: int, cap: int = 1024) -> tuple[int, ...]:
    """Power-of-two multiples of `unit` up to the first that covers `extent` (at most `cap`)."""
    out = []
    v = unit
    while v <= cap:
        out.append(v)
        if v >= extent:
            break
        v *= 2
    return tuple(out)


def core_values(target: Target) -> tuple[int, ...]:
    out, v = [], 1
    while v < target.cores:
        out.append(v)
        v *= 2
    return tuple(out + [target.cores])


def aligned(nbytes: int, align: int) -> int:
    return -(-nbytes // align) * align


def over_capacity(target: Target, buffers: Sequence[tuple[str, str, int]]) -> str | None:
    """Why the buffers (level, name, bytes) do not fit their levels at their alignment, or None."""
    m = machine(target)
    used: dict[str, int] = {}
    for level, name, nbytes in buffers:
        lv = m.level(level)
        used[level] = aligned(used.get(level, 0), lv.alignment) + nbytes
        if used[level] > lv.capacity:
            return (f"buffer {name!r} needs {used[level]} B in {level} but only {lv.capacity} B are available; "
                    f"choose smaller tiles")
    return None


def pad_to(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


def per_channel(x: np.ndarray, c1: int, c0: int) -> np.ndarray:
    """A (C,) vector padded and viewed as (C1, C0) for channel-block broadcasts in UB."""
    return pad_to(x.reshape(-1), 0, c1 * c0).reshape(c1, c0)


def to_5hd(x: np.ndarray, layout: str, c0: int) -> np.ndarray:
    """NCHW / NHWC -> (N, C1, H*W, C0), channels zero-padded to C1*C0."""
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    n, c, h, w = x.shape
    c1 = ceil_div(c, c0)
    x = pad_to(x, 1, c1 * c0).reshape(n, c1, c0, h * w)
    return np.ascontiguousarray(x.transpose(0, 1, 3, 2))


def from_5hd(y: np.ndarray, c: int, h: int, w: int, layout: str) -> np.ndarray:
    n, c1, hw, c0 = y.shape
    out = y[:, :, :h * w].transpose(0, 1, 3, 2).reshape(n, c1 * c0, h, w)[:, :c]
    return np.ascontiguousarray(out.transpose(0, 2, 3, 1) if layout == "NHWC" else out)


def channel_op(kb: KernelBuilder, op: str, buf: Buf, off: int, rows: int, param: Buf, poff: int) -> None:
    """dst[row, c0] = dst[row, c0] <op> param[c0] over `rows` rows of 16 channels in UB: one
    256 B repeat covers 8 rows (fp16: the 32 B parameter block read with block stride 0; 4-byte
    types: two instructions, each taking every other block)."""
    isz = buf.itemsize
    if isz == 2:
        kb.vec_raw(op, VOp(buf, off, 1, 8), (VOp(buf, off, 1, 8), VOp(param, poff, 0, 0)), ceil_div(rows, 8))
    else:
        for half in (0, 1):
            o = off + half * 8
            kb.vec_raw(op, VOp(buf, o, 2, 16), (VOp(buf, o, 2, 16), VOp(param, poff + half * 8, 0, 0)),
                       ceil_div(rows, 8))


def l0_chunks(m: Machine, dtype: str, mt1: int, kt1: int, nt1: int, slots: int) -> tuple[int, int] | None:
    """The largest (k, n) fractal chunks of an L1 tile that fit L0A and L0B, or None."""
    m0, k0, n0 = m.cube[dtype]
    frac = m0 * k0 * np.dtype(dtype).itemsize
    a_cap, b_cap = m.level("L0A").capacity // slots, m.level("L0B").capacity // slots
    k0c = min(kt1, a_cap // (mt1 * frac)) if mt1 * frac <= a_cap else 0
    if k0c <= 0:
        return None
    n0c = min(nt1, b_cap // (k0c * frac)) if k0c * frac <= b_cap else 0
    while n0c <= 0 and k0c > 1:
        k0c //= 2
        n0c = min(nt1, b_cap // (k0c * frac))
    if n0c <= 0:
        return None
    return k0c, n0c


class AscendTemplate(Template):
    """Common knob validation for the ascend templates (a check failure is an invalid candidate)."""

    target_family = "ascend"

    def buffers(self, wl: Workload, target: Target, config: Mapping) -> list[tuple[str, str, int]]:
        raise NotImplementedError

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        return over_capacity(target, self.buffers(wl, target, config))

    def default(self, wl: Workload, target: Target) -> dict:
        """The derived default (`opcompiler.prior`: the shipped model's fastest-predicted candidate
        that fits) where the template has a model, else the first config of `preferred()` order
        that fits."""
        from opcompiler.prior import derived_default

        cfg = derived_default(self, wl, target)
        return cfg if cfg is not None else self.preferred_default(wl, target)

    def complete(self, wl: Workload, target: Target, given: Mapping) -> dict:
        """A partial config is filled in from the best-ranked candidate that fits together with it
        (`--config '{"m_tile": 512}'` keeps the rest of the tiling consistent), else the default."""
        from opcompiler.prior import ranked

        for _, cand in ranked(self, wl, target) or ():
            if self.check(wl, target, {**cand, **given}) is None:
                return cand
        return self.default(wl, target)

    def preferred_default(self, wl: Workload, target: Target) -> dict:
        """The first config of `preferred()` order that fits (the default before derived defaults,
        and still the default of templates without a shipped model); a workload no tiling fits is
        refused in one line."""
        prefs = self.preferred(wl, target)
        # then the same configs single-buffered: less overlap, but half the buffer space
        prefs += [{**c, "double_buffer": 0} for c in prefs if c.get("double_buffer") == 1]
        for cfg in prefs:
            if self.check(wl, target, cfg) is None:
                return cfg
        smallest = {k.name: min(k.values) if k.name.endswith("_tile") else k.values[0] for k in self.space(wl, target)}
        why = self.check(wl, target, smallest)
        if why is None:
            return smallest
        raise OpcError(f"{wl.op} does not fit {target.name} with any tiling of {self.name}: even the smallest tiles "
                       f"fail ({why})", arg="--shape", expected="a smaller shape (fewer channels, a narrower image)")

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        raise NotImplementedError


def epilogue_group(m: Machine, nt1: int, mt_rows: int, acc_isz: int, out_isz: int, slots: int,
                   ub_budget: int) -> int:
    """How many n1 blocks one epilogue pass moves through UB (as many as half of UB allows)."""
    per = slots * mt_rows * 16 * (acc_isz + out_isz)
    return max(1, min(nt1, ub_budget // max(per, 1)))


def tir_epilogue_at(sch, l0c, epi: Sequence, tile, nt: int, g16: int) -> None:
    """TIR schedules: the L0C -> UB copy `l0c` and the epilogue blocks `epi` (producers first)
    at the output tile's loop `tile`. When the epilogue passes through UB in groups of `g16` <
    `nt` output channels (what `epilogue_group` lets fit), the copy's channel loop is split and
    put outermost, and the epilogue blocks follow each group."""
    sch.reverse_compute_at(l0c, tile)
    at = tile
    if g16 < nt:
        loops = sch.get_loops(l0c)
        ng, _ = sch.split(loops[-1], [None, g16])
        sch.reorder(ng, loops[-2])
        at = ng
    for blk in epi:
        sch.reverse_compute_at(blk, at)
