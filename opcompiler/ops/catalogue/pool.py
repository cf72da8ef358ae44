"""Pooling: pool2d (max / avg) and its output geometry."""
from __future__ import annotations

import numpy as np

from ... import dsl
from ...errors import OpcError
from ...workload import Workload
from .. import reference as ref
from ..registry import OpDef, register_op
from .common import EW_DTYPES, ew_shape, placeholders, validate_ew

POOL_DEFAULTS = {"n": 1, "c": 64, "h": 112, "w": 112, "kernel": 3, "stride": 2, "pad": 1, "mode": "max",
                 "layout": "NCHW"}


def pool_out_hw(wl: Workload) -> tuple[int, int]:
    p = wl.p
    return ((p["h"] + 2 * p["pad"] - p["kernel"]) // p["stride"] + 1,
            (p["w"] + 2 * p["pad"] - p["kernel"]) // p["stride"] + 1)


def _validate_pool(wl: Workload) -> None:
    validate_ew(wl)
    if wl["mode"] not in ("max", "avg"):
        raise OpcError("unsupported pool mode", arg="mode", value=wl["mode"], expected="max or avg")
    if wl["pad"] < 0:
        raise OpcError("padding must be >= 0", arg="pad", value=wl["pad"])
    if wl["pad"] * 2 >= wl["kernel"] + 1 and wl["pad"] > 0 and wl["pad"] >= wl["kernel"]:
        raise OpcError("padding must be smaller than the kernel", arg="pad", value=wl["pad"],
                       expected=f"< kernel={wl['kernel']}")
    if min(pool_out_hw(wl)) < 1:
        raise OpcError("window larger than the padded input", arg="kernel", value=wl["kernel"])


register_op(OpDef(
    name="pool2d", summary="max or average pooling (mode=max|avg)", family="pool", defaults=POOL_DEFAULTS,
    dtypes=EW_DTYPES,
    compute_fn=lambda wl: (lambda ins: (ins, dsl.pool2d(ins[0], wl["kernel"], wl["stride"], wl["pad"], wl["mode"],
                                                        wl.layout)))(
        placeholders([("x", ew_shape(wl), wl.dtype)])),
    reference_fn=lambda wl, ins: ref.pool2d(ins[0], wl["kernel"], wl["stride"], wl["pad"], wl["mode"], wl.layout),
    input_specs=lambda wl: [("x", ew_shape(wl), wl.dtype)],
    flops_fn=lambda wl: wl["n"] * wl["c"] * int(np.prod(pool_out_hw(wl))) * wl["kernel"] ** 2,
    validate_fn=_validate_pool,
))

