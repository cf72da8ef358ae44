"""The element-wise chain-step vocabulary: the one table every target's element-wise lowering reads.

An element-wise op is a chain of steps applied in order to its input `x` ("bn;relu",
"mul;clip:0:6", ...). Each step has a name, its numeric arguments (clip:LO:HI), the extra
operands it reads ("full": a tensor of x's shape, "chan": one value per channel), its FLOPs per
element, and one definition in two forms: the TE compute (written with `opcompiler.dsl`) and the
numpy reference. Who reads it:

* the catalogue (`catalogue/elementwise.py`): ew_chain's compute, reference, inputs and FLOPs, and
  every op that declares a `chain` (relu is "relu", bn_relu is "bn;relu", hardswish is "hardswish");
* ascend-sim (`schedules/ascend/elemwise.py`): flat vs per-channel chains, the
  host packing of operands, the NC1HWC0 compute of per-channel chains;
* dsp-sim (`schedules/dsp/chain.py`): the lanes' geometry (how many full / per-channel operands);
* cpu: nothing (its template schedules the op's own TE compute).

A new step is one `_step(...)` line here; an op made of steps is one `chain=` entry in the
catalogue (docs/adding_an_operator.md). This module imports neither TVM nor the catalogue: the
DSL module is handed to `te` by the caller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import OpcError

FULL, CHAN = "full", "chan"


@dataclass(frozen=True)
class ChainStep:
    name: str
    operands: tuple[str, ...]  # each extra operand: FULL (x's shape) or CHAN (one per channel)
    nargs: int  # numbers after the name in the chain text (clip:LO:HI has 2)
    args_help: str  # what those numbers are, for the error message
    flops: int  # per element
    # te(dsl, x, vals, args, shape, dtype): vals[i] is the i-th operand, already broadcast to x's
    # shape; a step reads vals in order (a lazy sequence may create each on first access)
    te: Callable[..., Any]
    # ref(x, vals, args, dtype): numpy, operands broadcast; the caller casts the result to dtype
    ref: Callable[..., np.ndarray]
    # tiles the step holds beside x's while it runs: 0 for a step computed in place; hardswish keeps
    # x until its last multiply (ascend-sim sizes its UB tiles with it)
    temps: int = 0
    # the step computes float16 inputs in float32 (its temporary tiles are float32): erf
    wide: bool = False


STEPS: dict[str, ChainStep] = {}


def _step(name: str, operands: tuple[str, ...], nargs: int, args_help: str, flops: int, te, ref,
          temps: int = 0, wide: bool = False) -> None:
    STEPS[name] = ChainStep(name, operands, nargs, args_help, flops, te, ref, temps, wide)


def _clip_te(d, x, args, shape, dt):
    return d.vmax(d.vmin(x, d.broadcast(args[1], shape, dt)), d.broadcast(args[0], shape, dt))


_step("relu", (), 0, "", 1, lambda d, x, v, a, s, dt: d.vrelu(x), lambda x, v, a, dt: np.maximum(x, 0))
_step("sigmoid", (), 0, "", 4, lambda d, x, v, a, s, dt: d.vrec(d.vadds(d.vexp(d.vmuls(x, -1.0)), 1.0)),
      lambda x, v, a, dt: np.asarray(1, dt) / (np.asarray(1, dt) + np.exp(-x)))
_step("clip", (), 2, "2 bounds (clip:LO:HI)", 2, lambda d, x, v, a, s, dt: _clip_te(d, x, a, s, dt),
      lambda x, v, a, dt: np.clip(x, *np.asarray(a, dt)))
_step("affine", (), 2, "2 numbers (affine:A:B = x*A+B)", 2, lambda d, x, v, a, s, dt: d.vadds(d.vmuls(x, a[0]), a[1]),
      lambda x, v, a, dt: x * np.asarray(a[0], dt) + np.asarray(a[1], dt))
# x ** P for x > 0, as exp(P * ln x): LRN's denominator
_step("pow", (), 1, "1 exponent (pow:P)", 3, lambda d, x, v, a, s, dt: d.vexp(d.vmuls(d.vlog(x), a[0])),
      lambda x, v, a, dt: np.exp(np.log(x.astype(np.float32)) * np.float32(a[0])))
_step("add", (FULL,), 0, "", 1, lambda d, x, v, a, s, dt: d.vadd(x, v[0]), lambda x, v, a, dt: x + v[0])
_step("mul", (FULL,), 0, "", 1, lambda d, x, v, a, s, dt: d.vmul(x, v[0]), lambda x, v, a, dt: x * v[0])
_step("bias", (CHAN,), 0, "", 1, lambda d, x, v, a, s, dt: d.vadd(x, v[0]), lambda x, v, a, dt: x + v[0])
_step("scale", (CHAN,), 0, "", 1, lambda d, x, v, a, s, dt: d.vmul(x, v[0]), lambda x, v, a, dt: x * v[0])
_step("bn", (CHAN, CHAN), 0, "", 2, lambda d, x, v, a, s, dt: d.vadd(d.vmul(x, v[0]), v[1]),
      lambda x, v, a, dt: x * v[0] + v[1])
# HardSwish x * relu6(x + 3) / 6 (MobileNetV3): x + 3, clipped to [0, 6], times 1/6, times x
_step("hardswish", (), 0, "", 5,
      lambda d, x, v, a, s, dt: d.vmul(x, d.vmuls(_clip_te(d, d.vadds(x, 3.0), (0.0, 6.0), s, dt), 1.0 / 6.0)),
      lambda x, v, a, dt: x * (np.clip(x + np.asarray(3, dt), np.asarray(0, dt), np.asarray(6, dt))
                               * np.asarray(1.0 / 6.0, dt)), temps=1)


# erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7) from the vector unit's own operations (no erf
# instruction on either machine): erf(|x|) = 1 - t*P(t)*exp(-x^2), t = 1/(1 + p|x|), P of degree 4;
# the sign of x as clip(x * 1e30, -1, 1) (below 1e-30, erf(x) ~ 1.13x is itself below any tolerance).
# float16 inputs are computed in float32 (cast in and out on the vector unit)
_AS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_AS_P = 0.3275911
TEMPS_ERF = 4


def _erf_te(d, x, shape, dt):
    if dt == "float16":  # 1 - t*P(t)*exp(-x^2) cancels near 0: float16's 2^-11 would be 3e-3 of erf
        return d.cast_to(_erf_te(d, d.cast_to(x, "float32"), shape, "float32"), "float16")
    a = d.vmax(x, d.vmuls(x, -1.0))  # |x|
    t = d.vrec(d.vadds(d.vmuls(a, _AS_P), 1.0))
    u = d.vadds(d.vmuls(t, _AS[4]), _AS[3])
    for c in (_AS[2], _AS[1], _AS[0]):
        u = d.vadds(d.vmul(u, t), c)
    q = d.vmul(d.vmul(u, t), d.vexp(d.vmuls(d.vmul(x, x), -1.0)))  # 1 - erf(|x|)
    sign = _clip_te(d, d.vmuls(x, 1e30), (-1.0, 1.0), shape, dt)
    return d.vmul(sign, d.vadds(d.vmuls(q, -1.0), 1.0))


def _erf_np(x: np.ndarray) -> np.ndarray:
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


_step("erf", (), 0, "", 20, lambda d, x, v, a, s, dt: _erf_te(d, x, s, dt),
      lambda x, v, a, dt: _erf_np(x), temps=TEMPS_ERF, wide=True)
# GELU, x * (1 + erf(x / sqrt 2)) / 2 (BERT's; ONNX Gelu's default, approximate="none")
_step("gelu", (), 0, "", 24,
      lambda d, x, v, a, s, dt: d.vmul(x, d.vmuls(d.vadds(_erf_te(d, d.vmuls(x, 0.7071067811865476), s, dt), 1.0), 0.5)),
      lambda x, v, a, dt: x.astype(np.float64) * (1 + _erf_np(x.astype(np.float64) * 0.7071067811865476)) / 2,
      temps=TEMPS_ERF + 1, wide=True)
# tanh(x) = 2 sigmoid(2x) - 1 (the sigmoid's own instructions: no tanh instruction either)
_step("tanh", (), 0, "", 7,
      lambda d, x, v, a, s, dt: d.vadds(d.vmuls(d.vrec(d.vadds(d.vexp(d.vmuls(x, -2.0)), 1.0)), 2.0), -1.0),
      lambda x, v, a, dt: np.tanh(x.astype(np.float64)))

# GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), is exactly x * sigmoid(2 z)
_step("gelu_tanh", (), 0, "", 10,
      lambda d, x, v, a, s, dt: d.vmul(x, d.vrec(d.vadds(d.vexp(d.vmuls(
          d.vadd(x, d.vmuls(d.vmul(d.vmul(x, x), x), 0.044715)), -1.5957691216057308)), 1.0))),
      lambda x, v, a, dt: 0.5 * x.astype(np.float64) * (1 + np.tanh(0.7978845608028654 * (
          x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3))), temps=2)
_step("sub", (FULL,), 0, "", 1, lambda d, x, v, a, s, dt: d.vsub(x, v[0]), lambda x, v, a, dt: x - v[0])
_step("rec", (), 0, "", 1, lambda d, x, v, a, s, dt: d.vrec(x), lambda x, v, a, dt: np.asarray(1, dt) / x)
# the natural log, the vector unit's own `ln` (x > 0; 0 gives -inf): LogSoftmax is softmax then ln
_step("ln", (), 0, "", 1, lambda d, x, v, a, s, dt: d.vlog(x),
      lambda x, v, a, dt: np.log(x.astype(np.float32)))

Chain = list[tuple[str, tuple[float, ...]]]


def parse_chain(text: str) -> Chain:
    """[(step, args)] of a chain text such as "bn;relu" or "mul;clip:0:6", checked against the
    vocabulary (names, number of arguments)."""
    steps = []
    for item in filter(None, str(text).split(";")):
        name, *args = item.split(":")
        if name not in STEPS:
            raise OpcError(f"unknown element-wise step {name!r}", arg="chain", value=text,
                           expected="steps among " + ", ".join(STEPS) + " separated by ';'")
        if len(args) != STEPS[name].nargs:
            raise OpcError(f"step {item!r} takes {STEPS[name].args_help or 'no arguments'}", arg="chain", value=text)
        steps.append((name, tuple(float(a) for a in args)))
    if not steps:
        raise OpcError("empty chain", arg="chain", value=text, expected="e.g. bn;relu or sigmoid")
    return steps


def chain_text(steps: Chain) -> str:
    """The text of a parsed chain (arguments as repr: it parses back to the same floats)."""
    return ";".join(":".join((nm, *map(repr, args))) for nm, args in steps)


def operand_kinds(steps: Chain) -> list[str]:
    """The chain's extra operands in input order (after x): FULL or CHAN each."""
    return [k for name, _ in steps for k in STEPS[name].operands]


def chain_temps(steps: Chain) -> int:
    """Tiles the chain holds beside x's at once (the most any one step does)."""
    return max((STEPS[name].temps for name, _ in steps), default=0)


def chain_temp_bytes(steps: Chain, dtype: str) -> int:
    """Bytes per element of the tiles the chain holds beside x's at once (a `wide` step's are float32)."""
    isz = np.dtype(dtype).itemsize
    return max((STEPS[n].temps * (max(isz, 4) if STEPS[n].wide else isz) for n, _ in steps), default=0)


def chain_flops(steps: Chain) -> int:
    """FLOPs per element of the chain."""
    return sum(STEPS[name].flops for name, _ in steps)


def apply_te(dsl, steps: Chain, x, take: Callable[[str], Any], shape, dtype: str, eager: bool = True):
    """The chain as TE stages over x. `take(kind)` returns the next operand (kind FULL or CHAN),
    ready to use (broadcast to x's shape): all of a step's operands before the step (`eager`),
    or each when the step first reads it (the stages are then created in the step's own order)."""
    for name, args in steps:
        kinds = STEPS[name].operands
        vals = [take(k) for k in kinds] if eager else _Lazy(take, kinds)
        x = STEPS[name].te(dsl, x, vals, args, shape, dtype)
        for i in range(len(kinds)):  # every operand consumed, whatever the step read
            vals[i]
    return x


def apply_np(steps: Chain, x: np.ndarray, operands: Sequence[np.ndarray], dtype: str) -> np.ndarray:
    """The chain as numpy over x (operands broadcastable to x), each step's result cast to dtype."""
    rest = iter(operands)
    for name, args in steps:
        vals = [next(rest) for _ in STEPS[name].operands]
        x = STEPS[name].ref(x, vals, args, dtype).astype(dtype)
    return x


def lowerable(steps: Chain, table: Mapping[str, str], ordered: bool = False) -> tuple[str, ...] | None:
    """A fused op's epilogue (`OpDef.epilogue_steps`) in a template's own names: `table` maps each
    step the template can lower (with no arguments) to its name for it; None when some step is not
    in it, or, `ordered`, when the steps are not in the table's order, each at most once (a
    template whose epilogue is a fixed pipeline)."""
    if any(name not in table or args for name, args in steps):
        return None
    if ordered:
        pos = [list(table).index(name) for name, _ in steps]
        if pos != sorted(set(pos)):
            return None
    return tuple(table[name] for name, _ in steps)


class _Lazy:
    """A step's operands, each taken when the step first reads it."""

    def __init__(self, take: Callable[[str], Any], kinds: tuple[str, ...]):
        self._take, self._kinds, self._got = take, kinds, []

    def __getitem__(self, i: int):
        while len(self._got) <= i < len(self._kinds):
            self._got.append(self._take(self._kinds[len(self._got)]))
        return self._got[i]


__all__ = ["STEPS", "ChainStep", "FULL", "CHAN", "Chain", "parse_chain", "chain_text", "operand_kinds",
           "chain_temps", "chain_temp_bytes", "chain_flops", "apply_te", "apply_np", "lowerable"]
