"""Pieces shared by the Ascend templates: dtype rules, host-side layouts, knob ranges, the
cube templates' check / buffers / apply (`CubeTemplate`), the cube's L0 chunk rule and the UB
epilogue's channel groups (TIR schedules place it with `tir_epilogue_at`), and the vector
templates' per-config tile-loop annotation (`on_cores`). The machine's figures and the ISA's
names come from the backend's `intrin`, the one backend module a schedule imports.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.steps import chain_temps
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template
from opcompiler.workload import Workload

POW2_TILES = (16, 32, 64, 128, 256, 512, 1024)
CUBE_DTYPES = {"float16": (16, "float32", 2), "int8": (32, "int32", 1)}  # K0 (C0), accumulator, element bytes


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def machine(target: Target) -> Any:
    """The target's published machine figures (capacities, alignment, cube fractals, lanes)."""
    return intrin.figures(target)


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


def l0_chunks(m: Any, dtype: str, mt1: int, kt1: int, nt1: int, slots: int) -> tuple[int, int] | None:
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

    def tile_features(self, wl: Workload, target: Target, cfg: Mapping, count: int, tile: str = "rows_tile"
                      ) -> dict[str, float]:
        """The tiling's features of a UB-tiled vector kernel: `count` items in tiles of cfg[tile]
        split over the cores, and how full UB is."""
        tiles = ceil_div(count, cfg[tile])
        cores = min(cfg["block_dim"], tiles)
        occ = sum(b for lvl, _, b in self.buffers(wl, target, cfg) if lvl == "UB") / machine(target).level("UB").capacity
        return {"tiles": tiles, "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores), "occupancy_UB": occ}


def tile_knobs(target: Target, tile: Knob, buffering: str = "ping-pong UB tiles",
               split: str = "AI cores the tiles are split over") -> list[Knob]:
    """A UB-tiled vector kernel's knobs: its tile, ping-pong buffering, the cores."""
    return [tile, Knob("double_buffer", (1, 0), buffering), Knob("block_dim", tuple(reversed(core_values(target))), split)]


def spread_first(tiles: Sequence[int], count: int, cores: int, min_tiles: int = 1) -> list[int]:
    """Tile sizes, fewest items per core first (every core busy), then those leaving each core at
    least `min_tiles` tiles (so one tile's work runs under the next one's loads), then the larger tile."""
    return sorted(tiles, key=lambda t: (ceil_div(ceil_div(count, t), cores) * t,
                                        ceil_div(ceil_div(count, t), cores) < min_tiles, -t))


def epilogue_group(m: Any, nt1: int, mt_rows: int, acc_isz: int, out_isz: int, slots: int,
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


def cube_chunks(wl: Workload, target: Target, cfg: Mapping) -> tuple[int, int] | None:
    """(k, n) elements of one L0 chunk of the config's (m, k, n) tile: the largest that fit L0A /
    L0B per ping-pong slot (`l0_chunks`), or None when not one K fractal of the m tile fits."""
    k0 = CUBE_DTYPES[wl.dtype][0]
    ch = l0_chunks(machine(target), wl.dtype, cfg["m_tile"] // 16, cfg["k_tile"] // k0, cfg["n_tile"] // 16,
                   2 if cfg["double_buffer"] else 1)
    return None if ch is None else (ch[0] * k0, ch[1] * 16)


def epilogue_channels(wl: Workload, target: Target, cfg: Mapping) -> int:
    """Output channels (columns) one epilogue pass of a cube template holds in UB."""
    m = machine(target)
    out_isz = 2 if wl.dtype == "float16" else 0  # int8: no cast buffer
    # an epilogue step that keeps x beside its own tile (hardswish) holds one more fp16 tile per slot
    out_isz += 2 * chain_temps(get_op(wl.op).epilogue_steps(wl)) if wl.dtype == "float16" else 0
    return 16 * epilogue_group(m, cfg["n_tile"] // 16, cfg["m_tile"], 4, out_isz, 2 if cfg["double_buffer"] else 1,
                               m.level("UB").capacity // 2)


class CubeTemplate(AscendTemplate):
    """What the cube templates (matmul, conv2d) share: `tir()` is the template's schedule module,
    with `unsupported(wl)` (why the schedule cannot take the workload), `tir_buffers(wl, target,
    cfg)` (what its lowering allocates: the capacity `check`) and `scheduled(wl, target, cfg)`
    (the `Scheduled` that `apply` returns)."""

    def tir(self) -> Any:
        raise NotImplementedError

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        why = self.tir().unsupported(wl)
        if why is not None:
            return why
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, cfg: Mapping) -> list[tuple[str, str, int]]:
        return self.tir().tir_buffers(wl, target, cfg)

    def apply(self, wl: Workload, target: Target, cfg: Mapping) -> Any:
        tir = self.tir()
        why = tir.unsupported(wl)
        if why is not None:
            raise OpcError(why, arg="op", value=wl.op)
        return tir.scheduled(wl, target, cfg)

    def occupancy(self, wl: Workload, target: Target, cfg: Mapping) -> dict[str, float]:
        """The cost-model features `occupancy_<level>`: the config's buffers over each level."""
        occ: dict[str, int] = {}
        for level, _, nbytes in self.buffers(wl, target, cfg):
            occ[level] = occ.get(level, 0) + nbytes
        m = machine(target)
        return {f"occupancy_{lv}": occ.get(lv, 0) / m.level(lv).capacity for lv in ("L1", "L0A", "L0B", "L0C", "UB")}


def on_cores(mod, block: str, cfg: Mapping):
    """One config's copy of a cached tiled module (the vector templates cache the tiling per
    workload and tile size): the outermost loop of `block` (the tile loop) annotated with the
    cores that share its iterations (`CORES`) and ping-pong buffering (`SLOTS`)."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    tiles = sch.get_loops(sch.get_sblock(block))[0]
    sch.annotate(tiles, intrin.CORES, int(cfg["block_dim"]))
    sch.annotate(tiles, intrin.SLOTS, int(bool(cfg["double_buffer"])))
    return sch.mod
