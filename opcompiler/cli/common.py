"""Arguments shared by commands that take one workload (op, target, shape, dtype, config)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..ops import default_dtype as _default_dtype, workload
from ..target import Target, load_target
from ..workload import Workload


def add_workload_args(p: argparse.ArgumentParser, default_target: str = "cpu", config: bool = True) -> None:
    p.add_argument("op", help="operator name (see `opcompiler ops`)")
    p.add_argument("--target", default=default_target, help="target name, alias or .toml path (default %(default)s)")
    p.add_argument("--shape", help="key=value list (n=1,c=64,...) or a preset name")
    p.add_argument("--preset", help="a named shape preset (e.g. resnet50.res2_3x3, minigo.conv3_res)")
    p.add_argument("--batch", type=int, help="override the batch dimension")
    p.add_argument("--dtype", help="float32, float16 or int8 (default: the op's first supported dtype)")
    if config:
        p.add_argument("--config", default="default",
                       help="default, best (best verified record), or a JSON object / .json file of knobs")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def resolve(args: argparse.Namespace, default_dtype: str | None = None) -> tuple[Workload, Target]:
    target = load_target(args.target)
    dtype = args.dtype or default_dtype or _default_dtype(args.op, target)
    wl = workload(args.op, args.shape, preset=args.preset, batch=args.batch, dtype=dtype)
    return wl, target


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, default=_default, sort_keys=False)
    sys.stdout.write("\n")


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def fmt_si(x: float, unit: str) -> str:
    for scale, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.2f} {unit}"
