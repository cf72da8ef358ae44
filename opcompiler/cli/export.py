"""`opcompiler export`: write a tuned kernel as a folder a framework user loads."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_workload_args, emit_json, resolve, shape_label


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a kernel as a folder: compiled library, manifest, "
                                      "torch / onnx / plain-Python bindings")
    add_workload_args(p)
    p.add_argument("--to", default="lib",
                   help="bindings: torch, onnx, lib, or a comma-separated list (lib is always written)")
    p.add_argument("--out", required=True, help="folder to write (new, empty, or an earlier export); name it as a "
                   "Python identifier (conv2d_ascend910_sim, not conv2d-ascend910-sim) to `import` it by name")
    p.add_argument("--name", help="op name in the bindings: torch.ops.opcompiler.<name> (default: the op)")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from ..api import parse_config
    from ..export import export, parse_bindings
    bindings = parse_bindings(args.to)  # bad --to fails before anything is built
    _check_folder_name(args.out)
    wl, target = resolve(args)
    m = export(wl, target, parse_config(args.config), to=bindings, out=args.out, name=args.name,
               progress=not args.json and sys.stderr.isatty())
    if args.json:
        emit_json({"out": str(args.out), **m})
        return 0
    v = m["verification"]
    print(f"exported {m['op']} ({m['dtype']}, {shape_label(m['op'], m['params'], args)}) for "
          f"{m['target']['name']} -> {args.out}")
    print(f"  template {m['template']} v{m['template_version']}  config {m['config']} ({m['config_source']})")
    print(f"  artifact {m['artifact']['kind']}; bindings {', '.join(m['bindings'])}")
    if "skipped" in v:
        print(f"  NOT verified: {v['skipped']}")
    else:
        print(f"  verified against the numpy reference: max abs error {v['max_abs_err']:.3g}"
              + (f", {v['simulated_cycles']} simulated cycles" if "simulated_cycles" in v else ""))
    if "torch" in m["bindings"]:
        print(f"  torch: opcompiler.export.import_folder({str(args.out)!r}) registers "
              f"torch.ops.opcompiler.{m['name']}")
    return 0


def _check_folder_name(out: str) -> None:
    """A folder whose name is not a Python identifier still exports and loads (`load`,
    `import_folder`), but `import <folder>` cannot name it: say so, in one line, with the name to use."""
    from ..export import folder_name
    name = Path(out).name
    if name and not name.isidentifier():
        fixed = str(Path(out).with_name(folder_name(name)))
        print(f"opcompiler: warning: --out folder name {name!r} is not a Python identifier, so "
              f"`import {name}` will fail (opcompiler.export.import_folder({out!r}) still loads it); "
              f"use --out {fixed} to import it by name", file=sys.stderr)
