"""Direct convolution on CUDA cores (fp32), the alternative to the implicit GEMM.

No GEMM normalization: the conv block's own loops are tiled. Output pixels (batch x rows x
columns, fused) are spread over `threads_y` threads x `micro_y` pixels each, output channels
over `threads_x` x `micro_x`; each thread keeps its `micro_y x micro_x` outputs in registers
while the window (ry, rx) and `micro_k`-channel slices of the reduction run; the weight slice
of the block is staged in shared memory per channel slice, the input is read through the
cache (padding folded into the read). The epilogue is fused into the register -> global store.
"""
from __future__ import annotations

from typing import Any, Mapping

from tvm import s_tir

from .gemm import _inline_consumers, _inline_producers


def schedule_direct(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, cfg: Mapping[str, Any],
                    layout: str) -> None:
    """Tile the conv block `block` directly (see the module docstring)."""
    tx_n, ty_n, mx, my, mk = cfg["threads_x"], cfg["threads_y"], cfg["micro_x"], cfg["micro_y"], cfg["micro_k"]
    _inline_producers(sch, block)  # the padding becomes a guarded read
    if layout == "NCHW":
        b, k, y, x, rc, ry, rx = sch.get_loops(block)
        sch.reorder(b, y, x, k, rc, ry, rx)
    else:
        b, y, x, k, ry, rx, rc = sch.get_loops(block)
    pix = sch.fuse(b, y, x)
    by, ty, yi = sch.split(pix, [None, ty_n, my])
    bx, tx, xi = sch.split(k, [None, tx_n, mx])
    rco, rci = sch.split(rc, [None, mk])
    sch.reorder(by, bx, ty, tx, rco, ry, rx, rci, yi, xi)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if cfg["unroll"]:
        sch.annotate(tx, "pragma_auto_unroll_max_step", cfg["unroll"])
        sch.annotate(tx, "pragma_unroll_explicit", 1)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
    w_sh = sch.cache_read(block, 1, "shared")
    sch.compute_at(w_sh, rco, preserve_unit_loops=True)
    n = len(sch.get_loops(w_sh)) - 5  # its own loops, under by, bx, ty, tx, rco
    fty, ftx, _ = sch.split(sch.fuse(*sch.get_loops(w_sh)[-n:]), [ty_n, tx_n, None])
    sch.bind(fty, "threadIdx.y")
    sch.bind(ftx, "threadIdx.x")
    _inline_consumers(sch, acc)
    sch.decompose_reduction(block, rco)


def direct_shared_bytes(cfg: Mapping[str, Any], r: int, s: int, layout: str, k_total: int, c_total: int) -> int:
    """Shared bytes of the staged weight slice: the block's output channels x `micro_k` input
    channels x the window, fp32 (clipped to the layer's own channel counts)."""
    kb = min(cfg["threads_x"] * cfg["micro_x"], k_total)
    cb = min(cfg["micro_k"], c_total)
    return kb * cb * r * s * 4
