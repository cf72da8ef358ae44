"""Valid cases for every operator in the catalogue, drawn with hypothesis, and one verdict per
case: the property tests (`tests/props/`) and the long campaign (`benchmarks/fuzz.py`) share them.

A case is (op, target, shape params, dtype, config). Shapes are drawn from sizes that stress the
templates: 1, odd sizes, and sizes just below, at and past a tile or fractal boundary (8, 16, 32:
the DSP's vector width and the cube's 16x16 fractal). Every layout and dtype the op takes is drawn;
the catalogue's own validation decides what is a valid shape (`assume`). The config is drawn from
the template's own space, every knob (or left to the template's default).

The verdict (`run_case`):
  "ok"        ran and matched the numpy reference at `opcompiler.verify.TOLERANCE`;
  "refused"   an OpcError: a one-line reason (what the CLI prints with exit 2), e.g. a config
              that does not fit the target's buffers;
  "wrong"     ran and did not match the reference;
  "internal"  any other exception: a bug of ours.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

# sizes that stress tiles: 1, odd, and around 8 / 16 / 32
SMALL = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17)
CHANNELS = (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33)
SPATIAL = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17)
ROWS = (1, 2, 3, 7, 16, 17, 31, 33)
COLS = (1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129)
BOUNDARY = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129}

TARGETS = ("cpu", "ascend-sim", "dsp-sim")
# the dtypes each target runs (the op's own list is intersected with these)
TARGET_DTYPES = {"cpu": ("float32",), "ascend-sim": ("float16", "float32", "int8"), "dsp-sim": ("float32",)}

ELEMWISE = ("add", "add_relu", "batch_norm", "bias_add", "bn_relu", "relu", "hardswish", "ew_chain")
CONV = ("conv2d", "conv2d_bias", "conv2d_bias_add", "conv2d_bias_add_relu", "conv2d_bias_relu", "conv2d_bn",
        "conv2d_bn_add_relu", "conv2d_bn_relu", "conv2d_bias_hardswish")
MATMUL = ("matmul", "matmul_bias", "matmul_bias_relu")
ROWWISE = ("reduce_max", "reduce_mean", "reduce_sum", "softmax")

# the ew_chain vocabulary with the arguments a step takes
# (pow is x ** P as exp(P * ln x), defined for x > 0: it is drawn after a step whose output is positive)
# (rec, 1/x, after a clip away from 0: its values stay in float16's range)
STEP_TEXTS = ("relu", "sigmoid", "clip:0:6", "clip:-1:1", "affine:2:1", "affine:0.5:-0.25", "affine:0:3",
              "sigmoid;pow:2", "clip:0.5:4;pow:3", "add", "sub", "mul", "bias", "scale", "bn", "hardswish", "erf",
              "gelu", "gelu_tanh", "tanh", "clip:0.5:4;rec")


def _ew(draw) -> dict[str, Any]:
    return {"n": draw(st.sampled_from((1, 2))), "c": draw(st.sampled_from(CHANNELS)),
            "h": draw(st.sampled_from(SPATIAL)), "w": draw(st.sampled_from(SPATIAL)),
            "layout": draw(st.sampled_from(("NCHW", "NHWC")))}


@st.composite
def shapes(draw, op: str) -> dict[str, Any]:
    """Shape params of `op` (validity is the catalogue's: see `case`)."""
    if op in ELEMWISE:
        p = _ew(draw)
        if op == "add_relu":
            p["bcast"] = draw(st.sampled_from((0, 1)))
        if op == "ew_chain":
            p["chain"] = ";".join(draw(st.lists(st.sampled_from(STEP_TEXTS), min_size=1, max_size=3)))
        return p
    if op == "concat":
        return {**_ew(draw), "c1": draw(st.sampled_from(CHANNELS))}
    if op in CONV:
        r = draw(st.sampled_from((1, 2, 3, 5)))
        s = draw(st.sampled_from((r, 1, 3)))
        groups = draw(st.sampled_from((1, 1, 2, 3, "dw")))
        c = draw(st.sampled_from((1, 2, 3, 4, 6, 8, 16, 17)))
        k = draw(st.sampled_from((1, 2, 3, 4, 6, 8, 16, 17)))
        if groups == "dw":
            groups, k = c, c
        return {"n": draw(st.sampled_from((1, 2))), "c": c, "h": draw(st.sampled_from((1, 2, 3, 5, 7, 8, 9, 12))),
                "w": draw(st.sampled_from((1, 2, 3, 5, 7, 8, 9, 12))), "k": k, "r": r, "s": s,
                "stride": draw(st.sampled_from((1, 2, 3))), "pad": draw(st.sampled_from((0, 1, 2))),
                "dilation": draw(st.sampled_from((1, 1, 2))), "groups": groups,
                "layout": draw(st.sampled_from(("NCHW", "NHWC")))}
    if op in MATMUL:
        return {"m": draw(st.sampled_from(ROWS)), "k": draw(st.sampled_from(COLS)),
                "n": draw(st.sampled_from(COLS)), "trans_a": draw(st.sampled_from((0, 1))),
                "trans_b": draw(st.sampled_from((0, 1)))}
    if op == "batch_matmul":
        return {"b": draw(st.sampled_from((1, 2, 3))), "m": draw(st.sampled_from(ROWS)),
                "k": draw(st.sampled_from(COLS)), "n": draw(st.sampled_from(COLS)),
                **{f: draw(st.sampled_from((0, 1))) for f in ("trans_a", "trans_b", "bcast_b")}}
    if op == "pad":
        return {**_ew(draw), **{k: draw(st.sampled_from((0, 0, 1, 2))) for k in ("pt", "pl", "pb", "pr")},
                "fill": draw(st.sampled_from(("zero", "lowest")))}
    if op == "pool2d":
        kernel = draw(st.sampled_from((1, 2, 3)))
        return {**_ew(draw), "kernel": kernel, "stride": draw(st.sampled_from((1, 2))),
                "pad": draw(st.sampled_from(tuple(range(kernel // 2 + 1)))),
                "mode": draw(st.sampled_from(("max", "avg")))}
    if op in ROWWISE:
        return {"m": draw(st.sampled_from(ROWS)), "n": draw(st.sampled_from(COLS))}
    if op == "attention":
        return {"b": draw(st.sampled_from((1, 2))), "h": draw(st.sampled_from((1, 2, 3))),
                "sq": draw(st.sampled_from((1, 2, 7, 16, 17, 33))), "skv": draw(st.sampled_from((1, 3, 16, 17, 31, 33))),
                "d": draw(st.sampled_from((1, 3, 8, 16, 17))), "causal": draw(st.sampled_from((0, 1))),
                "mask": draw(st.sampled_from((0, 1, 2))), "layout": draw(st.sampled_from(("bhsd", "sbhd")))}
    if op in ("lstm", "gru"):
        p = {"t": draw(st.sampled_from((1, 2, 3))), "b": draw(st.sampled_from((1, 3, 17))),
             "i": draw(st.sampled_from((1, 5, 16, 20))), "h": draw(st.sampled_from((1, 7, 16))),
             "reverse": draw(st.sampled_from((0, 1)))}
        return {**p, "lbr": draw(st.sampled_from((0, 1)))} if op == "gru" else p
    if op in ("layer_norm", "add_layer_norm"):
        return {"rows": draw(st.sampled_from(ROWS)), "cols": draw(st.sampled_from(COLS))}
    if op in ("slice", "transpose"):
        dims = draw(st.lists(st.sampled_from((1, 2, 3, 4, 5, 8, 16, 17)), min_size=1 if op == "slice" else 2,
                             max_size=5))
        p = {"dims": "x".join(map(str, dims))}
        if op == "slice":
            axis = draw(st.integers(0, len(dims) - 1))
            start = draw(st.integers(0, dims[axis] - 1))
            return {**p, "axis": axis, "start": start, "end": draw(st.integers(start + 1, dims[axis]))}
        return {**p, "perm": "".join(map(str, draw(st.permutations(range(len(dims))))))}
    if op == "gather":
        n = draw(st.sampled_from((1, 2, 3, 16, 17, 33, 128)))
        return {"rows": draw(st.sampled_from((1, 2, 7, 16, 17, 100))), "cols": draw(st.sampled_from(COLS)),
                "n": n, "idx": draw(st.sampled_from(("int32", "int64"))),
                "fields": draw(st.sampled_from(tuple(f for f in (0, 1, 3, 10) if f <= n))),
                "bag": draw(st.sampled_from(tuple(b for b in (1, 1, 2, 3, 16, 17) if n % b == 0)))}
    if op == "fm_interaction":
        return {"b": draw(st.sampled_from((1, 2, 3, 16, 17, 33))), "f": draw(st.sampled_from((1, 2, 3, 10, 26, 39))),
                "k": draw(st.sampled_from(COLS))}
    raise KeyError(f"no shape strategy for op {op!r}: add one to tests/props/cases.py")


@dataclass
class Case:
    op: str
    target: str
    params: dict[str, Any]
    dtype: str
    config: dict[str, Any] | None = None

    def cli(self) -> str:
        """The command that reproduces the case."""
        from opcompiler.ops import shape_text
        cfg = "" if self.config is None else " --config '" + ",".join(f"{k}={v}" for k, v in self.config.items()) + "'"
        return (f"opcompiler run {self.op} --target {self.target} --dtype {self.dtype} "
                f"--shape '{shape_text(self.op, self.params)}'{cfg}")

    def sizes(self) -> list[int]:
        """The tensor sizes drawn (not strides, pads or axes): the extents of a `dims` too."""
        out = [int(v) for k, v in self.params.items()
               if k in ("n", "c", "c1", "h", "w", "k", "m", "r", "s", "rows", "cols", "b", "f") and isinstance(v, int)]
        if "dims" in self.params:
            out += [int(d) for d in str(self.params["dims"]).split("x")]
        return out

    def boundary(self) -> bool:
        """Drawn at a size that is 1 or just around a tile / fractal boundary."""
        return any(v in BOUNDARY for v in self.sizes())

    def odd(self) -> bool:
        return any(v > 1 and v % 2 for v in self.sizes())


@st.composite
def case(draw, op: str, target: str, with_config: bool = True) -> Case:
    """A valid case of `op` on `target`: a shape the catalogue accepts, a dtype both take, and
    (half the time when `with_config`) a config drawn knob by knob from the template's space."""
    from opcompiler.errors import OpcError
    from opcompiler.ops import get_op, workload
    from opcompiler.target import load_target
    from opcompiler.template import get_template

    d = get_op(op)
    dtypes = [t for t in d.dtypes if t in TARGET_DTYPES[target]]
    assume(dtypes)
    dtype = draw(st.sampled_from(dtypes))
    params = draw(shapes(op))
    try:
        wl = workload(op, params, dtype=dtype)
    except OpcError:
        assume(False)
    cfg = None
    if with_config and draw(st.booleans()):
        tgt = load_target(target)
        try:
            tmpl = get_template(d.family, tgt.family)
            knobs = tmpl.space(wl, tgt)
        except OpcError:  # no template for this op on this target: the run says so
            knobs = []
        if knobs:
            cfg = {k.name: draw(st.sampled_from(tuple(k.values))) for k in knobs}
    return Case(op, target, dict(wl.params), dtype, cfg)


@dataclass
class Verdict:
    kind: str  # ok | refused | wrong | internal
    detail: str = ""
    cycles: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_case(c: Case, seed: int = 0) -> Verdict:
    """Build and run `c` with values checked against numpy (see the module docstring)."""
    from opcompiler.api import run_op
    from opcompiler.errors import OpcError
    try:
        rep = run_op(c.op, c.target, shape=c.params, dtype=c.dtype, config=c.config, seed=seed)
    except OpcError as e:
        return Verdict("refused", str(e))
    except Exception as e:  # noqa: BLE001 - every other exception is a bug of ours
        return Verdict("internal", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}")
    if rep["correct"] is not True:
        return Verdict("wrong", f"max abs err {rep.get('max_abs_err')}", rep.get("cycles"))
    return Verdict("ok", "", rep.get("cycles"))


FAMILY = {"cpu": "cpu", "ascend-sim": "ascend", "dsp-sim": "dsp"}


def problem(c: Case, v: Verdict) -> str | None:
    """What is wrong with verdict `v` of case `c`, or None. A case must run correctly, or be
    refused in one line where refusing is right: the drawn config does not fit, or the target's
    limit is declared in `opcompiler/ops/limits.py` (a declared limit the target runs is stale)."""
    from opcompiler.ops.limits import unsupported
    declared = unsupported(c.op, FAMILY[c.target], c.params, c.dtype)
    if v.kind == "refused":
        if "\n" in v.detail.strip():
            return f"a refusal is one line: {c.cli()}\n{v.detail}"
        if declared is None and c.config is None:
            return f"a valid input refused, and no limit in opcompiler/ops/limits.py declares it:\n  {c.cli()}\n  {v.detail}"
        return None
    if v.kind != "ok":
        return f"{v.kind}: {c.cli()}\n{v.detail}"
    if declared is not None and c.config is None:
        return f"opcompiler/ops/limits.py says {c.target} cannot run this ({declared.text}), but it ran:\n  {c.cli()}"
    return None
