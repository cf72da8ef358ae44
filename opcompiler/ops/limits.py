"""What a target family cannot run, declared once, beside the catalogue: the cases a backend
refuses although the catalogue accepts them (`opcompiler ops` lists them under each op, and the
property tests hold every refusal of a valid input against this table: a refusal it does not
declare is a hole, and a limit it declares but the target runs is stale).

Each limit names the ops it covers (exact names, or a prefix ending in `*`), the target family,
what it covers (a predicate on the shape params and the dtype), and why. Plain data: no TVM.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple


class Limit(NamedTuple):
    ops: tuple[str, ...]
    family: str
    applies: Callable[[Mapping[str, Any], str], bool]
    text: str  # what is not supported, for `opcompiler ops`
    why: str


def _nhwc(p: Mapping[str, Any], dt: str) -> bool:
    return p.get("layout", "NCHW") == "NHWC"


LIMITS: tuple[Limit, ...] = (
    Limit(("conv2d*", "matmul*", "batch_matmul", "attention", "lstm", "gru"), "ascend",
          lambda p, dt: dt == "float32", "float32",
          "the cube takes float16 or int8 operands; fp32 matrix work would fall to the vector unit"),
    Limit(("conv2d*",), "dsp", lambda p, dt: _nhwc(p, dt) and int(p.get("groups", 1)) > 1,
          "grouped or depthwise in NHWC", "the DSP's grouped convolution runs NCHW"),
    Limit(("conv2d_bias_add_relu", "conv2d_bias_add", "conv2d_bn_add_relu"), "dsp",
          lambda p, dt: int(p.get("groups", 1)) > 1, "groups > 1",
          "the grouped convolution has no residual epilogue"),
    Limit(("attention",), "dsp", lambda p, dt: dt != "float32", "float16",
          "the DSP's VPEs compute fp32 only: its products and the online softmax run in fp32"),
    Limit(("lstm", "gru"), "dsp", lambda p, dt: dt != "float32", "float16",
          "the DSP's VPEs compute fp32 only: the recurrent cell's products and gates run in fp32"),
    Limit(("gru",), "ascend", lambda p, dt: int(p.get("lbr", 1)) == 0, "lbr=0 (linear_before_reset=0)",
          "the ascend GRU applies the reset gate to h R_n^T after the product (torch's linear_before_reset=1); "
          "lbr=0 needs r before it: run it on cpu"),
    Limit(("fm_interaction",), "dsp", lambda p, dt: dt != "float32", "float16",
          "the DSP's VPEs compute fp32 only: the field sums and squares run in fp32"),
)


def _covers(pattern: str, op: str) -> bool:
    return op.startswith(pattern[:-1]) if pattern.endswith("*") else op == pattern


def limits_of(op: str, family: str | None = None) -> list[Limit]:
    """The limits that name `op` (on `family`, or on every family)."""
    return [lim for lim in LIMITS if any(_covers(x, op) for x in lim.ops) and family in (None, lim.family)]


def unsupported(op: str, family: str, params: Mapping[str, Any], dtype: str) -> Limit | None:
    """The declared limit that covers this case, or None: the target should run it."""
    return next((lim for lim in limits_of(op, family) if lim.applies(params, dtype)), None)


__all__ = ["Limit", "LIMITS", "limits_of", "unsupported"]
