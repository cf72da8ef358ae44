"""Derived sizes of one Ascend conv workload (fractals, output pixels, the input rows a pixel tile
needs): the img2col template's (`conv2d.py`: its knobs, capacity check and schedule)."""
from __future__ import annotations

import math

from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.workload import Workload

from .common import ceil_div, cube_dtype

_WALK = 4096  # tiles walked exactly by `max_rows`
_ROWS: dict[tuple, int] = {}  # (image geometry, tile) -> max_rows, for every template call of a workload


class ConvGeometry:
    """Derived sizes of one conv workload."""

    def __init__(self, wl: Workload, target: Target):
        p = wl.p
        m0, k0, n0 = cube_dtype(wl, target)
        self.m0, self.k0, self.n0 = m0, k0, n0
        self.c0 = k0
        self.groups = p["groups"]
        self.n, self.h, self.w = p["n"], p["h"], p["w"]
        self.c_all, self.k_all = p["c"], p["k"]
        self.c, self.k = p["c"] // self.groups, p["k"] // self.groups  # per group
        self.nb = self.n * self.groups  # (image, group) pairs: each an independent GEMM
        self.r, self.s, self.st, self.pad, self.dil = p["r"], p["s"], p["stride"], p["pad"], p["dilation"]
        self.ho, self.wo = conv_out_hw(wl)
        self.c1 = ceil_div(self.c, self.c0)
        self.q = self.c1 * self.r * self.s  # K fractals
        self.n1 = ceil_div(self.k, n0)
        self.hw = self.ho * self.wo
        self.mp1 = ceil_div(self.hw, m0)  # pixel fractals per image
        # the image geometry the conv lowering's Load3D reads (the backend's ConvGeom)
        self.geom = dict(h=self.h, w=self.w, ho=self.ho, wo=self.wo, r=self.r, s=self.s, stride=self.st,
                         dilation=self.dil, pad_top=self.pad, pad_left=self.pad)

    def rows(self, p0: int, npix: int) -> tuple[int, int]:
        """Input rows [lo, hi] the pixels p0 .. p0+npix need (clipped to the image)."""
        last = min(p0 + npix, self.hw) - 1
        lo = (p0 // self.wo) * self.st - self.pad
        hi = (last // self.wo) * self.st - self.pad + (self.r - 1) * self.dil
        return max(lo, 0), min(hi, self.h - 1)

    def max_rows(self, mt: int) -> int:
        """The most input rows one tile of `mt` pixels needs. Exact (every tile walked) up to
        `_WALK` tiles; past that, the bound over every residue a tile can start at in a row, which
        no tile exceeds, so a capacity check on it is safe and costs O(1) on any image."""
        key = (self.h, self.w, self.ho, self.wo, self.st, self.pad, self.r, self.dil, mt)
        hit = _ROWS.get(key)
        if hit is None:
            ntiles = -(-self.hw // mt)
            if ntiles <= _WALK:
                hit = max(hi - lo + 1 for lo, hi in (self.rows(p0, mt) for p0 in range(0, self.hw, mt)))
            else:
                g = math.gcd(mt, self.wo)
                spanned = (self.wo - g + mt - 1) // self.wo  # output rows crossed past the first
                hit = min(spanned * self.st + (self.r - 1) * self.dil + 1, self.h)
            if len(_ROWS) > 65536:
                _ROWS.clear()
            _ROWS[key] = hit
        return hit
