"""What the catalogue's families share: dtype sets, placeholders, the element-wise shape and its
checks, and the per-channel broadcast helpers (TE and numpy)."""
from __future__ import annotations

import numpy as np
from tvm import te

from ...errors import OpcError
from ...workload import Workload

FLOAT = ("float32", "float16")
CUBE = ("float32", "float16", "int8")


def acc_out(dtype: str) -> str:
    return {"float16": "float16", "float32": "float32", "int8": "int32"}[dtype]


def placeholders(specs) -> list:
    return [te.placeholder(s, d, name=n) for n, s, d in specs]


def chan_axis(wl: Workload) -> int:
    return 1 if wl.p.get("layout", "NCHW") == "NCHW" else 3


def bcast_c(v: np.ndarray, wl: Workload, ndim: int = 4) -> np.ndarray:
    shape = [1] * ndim
    shape[chan_axis(wl)] = -1
    return v.reshape(shape)


def reshape_c(t: te.Tensor, wl: Workload) -> te.Tensor:
    """A (C,) tensor viewed as (1, C, 1, 1) or (1, 1, 1, C) for broadcasting."""
    ax = chan_axis(wl)
    shape = [1, 1, 1, 1]
    shape[ax] = int(t.shape[0])
    return te.compute(shape, lambda *i: t[i[ax]], name=f"{t.op.name}_view", tag="elemwise|view")


EW_DEFAULTS = {"n": 1, "c": 64, "h": 56, "w": 56, "layout": "NCHW"}
EW_DTYPES = ("float32", "float16")


def ew_shape(wl: Workload) -> tuple[int, ...]:
    p = wl.p
    return (p["n"], p["c"], p["h"], p["w"]) if p["layout"] == "NCHW" else (p["n"], p["h"], p["w"], p["c"])


def validate_ew(wl: Workload) -> None:
    for key in ("n", "c", "h", "w"):
        if wl[key] < 1:
            raise OpcError("must be >= 1", arg=key, value=wl[key])
    if wl.layout not in ("NCHW", "NHWC"):
        raise OpcError("unsupported layout", arg="layout", value=wl.layout, expected="NCHW or NHWC")
    if wl.p.get("bcast", 0) not in (0, 1):
        raise OpcError("must be 0 (same shapes) or 1 (y is per-channel and broadcast)", arg="bcast",
                       value=wl.p.get("bcast"))

