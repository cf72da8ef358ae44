"""Arguments shared by commands that take one workload (op, target, shape, dtype, config), and the
checks of them that run before any command imports TVM (`check_args`, called by `main`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..ops import default_dtype as _default_dtype, workload
from ..records import jsonable
from ..target import Target, load_target
from ..workload import Workload

# The one default target of every command that takes --target (the product's main job is
# `opcompiler tune conv2d --target ascend-sim`); a note on stderr says when it was taken.
DEFAULT_TARGET = "ascend-sim"

CONFIG_HELP = ("default (the template's), best (the fastest verified record, yours or a shipped one; the template "
               "default when there is none), paper (the published schedule: dsp-sim's conv2d, matmul and "
               "element-wise templates), or a JSON object / .json file of knobs (default %(default)s)")


_PENDING: list[str] = []  # notes not printed yet (see `note`)
_REAL_STDERR: list[Any] = []  # the stderr `main` found, where pending notes go


def note(text: str) -> None:
    """One line on stderr saying what the command chose for the user (a default target, shape keys
    filled in). Under `main` it is held until the command writes anything, to stdout or stderr (a
    report, a progress bar, a warning), or ends well: a command that fails on bad input then
    prints only its one-line error."""
    _PENDING.append(f"opcompiler: note: {text}")
    if not _REAL_STDERR:  # not under main: at once
        flush_notes()


def flush_notes() -> None:
    stream = _REAL_STDERR[-1] if _REAL_STDERR else sys.stderr
    while _PENDING:
        print(_PENDING.pop(0), file=stream)


def drop_notes() -> None:
    _PENDING.clear()


class NotesFirst:
    """A stream that prints the pending notes before the first thing written to it."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        if text and _PENDING:
            flush_notes()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def add_target_arg(p: argparse.ArgumentParser, what: str = "target name, alias or .toml path") -> None:
    p.add_argument("--target", default=None,
                   help=f"{what} (default {DEFAULT_TARGET}, the simulated Ascend 910; a note on stderr says so)")
    p.set_defaults(default_target=DEFAULT_TARGET)


def add_workload_args(p: argparse.ArgumentParser, config: bool = True) -> None:
    p.add_argument("op", help="operator name (see `opcompiler ops`)")
    add_target_arg(p)
    p.add_argument("--shape", help="key=value list (n=1,c=64,...; keys not given come from the op's defaults, or "
                   "from --preset, and a note says which) or a preset name")
    p.add_argument("--preset", help="a named shape preset (e.g. resnet50.res2_3x3, minigo.conv3_res)")
    p.add_argument("--batch", type=int, help="override the batch dimension")
    p.add_argument("--dtype", help="float32, float16 or int8 (default: the target's preferred one the op has)")
    if config:
        p.add_argument("--config", default="default", help=CONFIG_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def check_args(args: argparse.Namespace) -> None:
    """The checks of names that need no TVM, before a command imports it (seconds): the target
    (the default one taken, with a note), the op name, --shape keys, --preset, --dtype, --batch
    and a --config that is neither a name nor JSON. Each bad value is a one-line OpcError, with
    a suggestion when a name is close to a real one."""
    from ..errors import OpcError
    op = getattr(args, "op", None)
    if op is not None and not op.endswith(".onnx"):
        from ..ops import check_args as check_op
        check_op(op, getattr(args, "shape", None), getattr(args, "preset", None), getattr(args, "dtype", None))
    batch = getattr(args, "batch", None)
    if batch is not None and batch < 1:
        raise OpcError("must be a positive integer", arg="--batch", value=batch)
    cfg = getattr(args, "config", None)
    if isinstance(cfg, str):
        _check_config(cfg)
    if getattr(args, "default_target", None) and getattr(args, "target", None) is None:
        args.target = args.default_target
        t = load_target(args.target)
        note(f"no --target given: using {args.target} ({t.name}); pass --target cpu, dsp-sim, ... for another")
    elif getattr(args, "target", None):
        load_target(args.target)


def _check_config(text: str) -> None:
    from pathlib import Path

    from ..config import NAMES
    from ..errors import OpcError
    from ..ops import did_you_mean
    expected = f"{', '.join(NAMES)}, a JSON object of knobs such as '{{\"m_tile\": 64}}' or a .json file"
    s = text.strip()
    if s in NAMES:
        return
    if s.endswith(".json"):
        if not Path(s).is_file():
            raise OpcError("no such file", arg="--config", value=text, expected=expected)
        return  # its content: parse_config
    if not s.startswith("{"):
        raise OpcError("neither a config name nor a JSON object" + did_you_mean(s, NAMES), arg="--config",
                       value=text, expected=expected)
    try:
        json.loads(s)
    except json.JSONDecodeError as e:
        raise OpcError(f"not valid JSON ({e.msg} at column {e.colno})", arg="--config", value=text,
                       expected=expected) from None


def shape_note(args: argparse.Namespace) -> None:
    """A note on stderr naming the shape keys the op's defaults (or a preset, named) filled in
    when --shape left some out, or the whole default shape when neither --shape nor --preset
    was given."""
    from ..ops import op_info, shape_sources
    shape, preset, batch = getattr(args, "shape", None), getattr(args, "preset", None), getattr(args, "batch", None)
    if isinstance(shape, str) and shape and "=" not in shape:  # --shape PRESET
        return
    src = shape_sources(args.op, shape, preset, batch)
    defaults = op_info(args.op).defaults
    if not shape and not preset:
        note(f"no --shape or --preset: {args.op}'s default shape "
             + ",".join(f"{k}={defaults[k]}" for k, v in src.items() if v == "default")
             + (" (--batch sets " + next(k for k, v in src.items() if v == "batch") + ")" if batch else ""))
        return
    if not shape:
        return  # a preset, whole (a matmul preset leaves the transpose flags at 0)
    from ..ops import PRESETS
    filled: dict[str, list[str]] = {}  # where from -> the k=v it filled in
    for k, v in src.items():
        if v == "default":
            filled.setdefault(f"{args.op}'s defaults", []).append(f"{k}={defaults[k]}")
        elif preset is not None and v == preset:
            filled.setdefault(f"preset {preset}", []).append(f"{k}={PRESETS[preset][k]}")
    if filled:
        note("--shape gave " + ",".join(k for k, v in src.items() if v == "shape") + "; filled in "
             + "; ".join(f"from {where}: " + ",".join(kv) for where, kv in filled.items()))


def resolve(args: argparse.Namespace, default_dtype: str | None = None) -> tuple[Workload, Target]:
    target = load_target(args.target)
    dtype = args.dtype or default_dtype or _default_dtype(args.op, target)
    wl = workload(args.op, args.shape, preset=args.preset, batch=args.batch, dtype=dtype)
    shape_note(args)  # once the shape is known to be valid
    return wl, target


def preset_name(args: argparse.Namespace) -> str | None:
    """The preset a command's shape came from (--preset, or --shape NAME), else None."""
    shape = getattr(args, "shape", None)
    if isinstance(shape, str) and shape and "=" not in shape:
        return shape
    return getattr(args, "preset", None)


def shape_label(op: str, params: Any, args: argparse.Namespace | None = None) -> str:
    """The shape as the CLI prints it: the op's key order, after the preset's name when one was used
    (and what --batch or --shape changed in it)."""
    from ..ops import shape_text
    preset = preset_name(args) if args is not None else None
    if preset and args is not None:
        changed = [f"--batch {args.batch}"] if getattr(args, "batch", None) else []
        if getattr(args, "shape", None) and "=" in args.shape:
            changed.append(f"--shape {args.shape}")
        if changed:
            preset = f"{preset} with {' '.join(changed)}"
    return shape_text(op, dict(params), preset)


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, default=jsonable, sort_keys=False)
    sys.stdout.write("\n")


def fmt_si(x: float, unit: str) -> str:
    for scale, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.2f} {unit}"
