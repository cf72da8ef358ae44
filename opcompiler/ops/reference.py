"""Numpy references. Cube-style ops accumulate fp16 in fp32 and int8 in int32, like the hardware."""
from __future__ import annotations

import numpy as np

ACC = {"float16": np.float32, "float32": np.float32, "int8": np.int32}


def matmul(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False) -> np.ndarray:
    acc = ACC[str(a.dtype)]
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    return a.astype(acc) @ b.astype(acc)


def conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int | tuple = 0, dilation: int = 1,
           groups: int = 1, layout: str = "NCHW") -> np.ndarray:
    """Accumulator-dtype result of a grouped, dilated, strided 2-D convolution."""
    acc = ACC[str(x.dtype)]
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
        w = w.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    x = x.astype(acc)
    w = w.astype(acc)
    pt, pl, pb, pr = (pad,) * 4 if isinstance(pad, int) else pad
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    ho = (h - dilation * (r - 1) - 1) // stride + 1
    wo = (wd - dilation * (s - 1) - 1) // stride + 1
    win = np.lib.stride_tricks.sliding_window_view(x, (dilation * (r - 1) + 1, dilation * (s - 1) + 1), axis=(2, 3))
    win = win[:, :, ::stride, ::stride, ::dilation, ::dilation][:, :, :ho, :wo]  # n c ho wo r s
    kg = k // groups
    out = np.empty((n, k, ho, wo), dtype=acc)
    for g in range(groups):
        xs = win[:, g * cg:(g + 1) * cg]
        ws = w[g * kg:(g + 1) * kg]
        out[:, g * kg:(g + 1) * kg] = np.einsum("ncyxrs,kcrs->nkyx", xs, ws, optimize=True)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def pool2d(x: np.ndarray, kernel: int, stride: int, pad: int, mode: str, layout: str = "NCHW") -> np.ndarray:
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    xf = x.astype(np.float32)
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(xf, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:], np.float32), ((pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    if mode == "max":
        out = win.max(axis=(-1, -2))
    else:
        cnt = np.lib.stride_tricks.sliding_window_view(ones, (kernel, kernel))[::stride, ::stride].sum(axis=(-1, -2))
        out = win.sum(axis=(-1, -2)) / cnt
    out = out.astype(x.dtype)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out
