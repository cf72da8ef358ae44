"""`opcompiler build`: build one kernel without running it and write its code.

For cuda targets `--emit-source FILE.cu` writes the CUDA C source TVM generated (nvcc has
already compiled it during the build; `--cubin FILE` keeps the binary too). For the cpu target
it writes LLVM IR (`.ll`) or assembly (`.s`), chosen by the file's suffix.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..backend import FAMILIES, capabilities, get_backend
from ..config import parse_config
from ..errors import OpcError
from ..ops import get_op, ordered_params
from .common import add_workload_args, emit_json, fmt_si, resolve, shape_label

CPU_SUFFIXES = {".ll": "ll", ".s": "asm", ".asm": "asm"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build one kernel (no run) and write its source: CUDA .cu, or LLVM IR/asm on cpu")
    add_workload_args(p)
    p.add_argument("--emit-source", metavar="FILE", help="write the generated code here (.cu for cuda; .ll or .s for cpu)")
    p.add_argument("--cubin", metavar="FILE", help="cuda only: also write the nvcc-compiled cubin")
    p.set_defaults(func=cmd_build)


def _emit_cpu(kernel: Any, path: Path) -> str:
    fmt = CPU_SUFFIXES.get(path.suffix)
    if fmt is None:
        raise OpcError("unknown suffix for a cpu kernel", arg="--emit-source", value=str(path),
                       expected="a .ll (LLVM IR) or .s (assembly) file")
    return kernel.artifact.mod.inspect_source(fmt)


def _targets_with(capability: str) -> str:
    """`--target cpu or cuda`: the families whose backends declare `capability`."""
    return "--target " + " or ".join(f for f in FAMILIES if getattr(capabilities(f), capability))


def cmd_build(args: argparse.Namespace) -> int:
    wl, target = resolve(args)
    caps = capabilities(target)
    if args.cubin and not caps.binary_kinds:
        raise OpcError(f"only applies to targets that build a device binary, not {target.name}", arg="--cubin",
                       value=args.cubin, expected=_targets_with("binary_kinds"))
    if args.emit_source:
        out = Path(args.emit_source)
        if not caps.source_kinds:
            what = "a simulator" if caps.simulator else "a target without generated source"
            raise OpcError(f"{target.name} is {what}: it has no source to emit", arg="--emit-source",
                           value=args.emit_source, expected=_targets_with("source_kinds"))
        if out.suffix not in caps.source_kinds:
            raise OpcError(f"a {target.family} kernel's source is written as {' or '.join(caps.source_kinds)}",
                           arg="--emit-source", value=args.emit_source, expected=f"a {caps.source_kinds[0]} file")
        if not out.parent.exists():
            raise OpcError("directory does not exist", arg="--emit-source", value=args.emit_source)
    backend = get_backend(target)
    kernel = backend.build(wl, parse_config(args.config))
    rep: dict[str, Any] = {"op": wl.op, "target": target.name, "shape": ordered_params(wl.op, dict(wl.params)),
                           "dtype": wl.dtype,
                           "template": kernel.template, "config": kernel.config,
                           "flops": get_op(wl.op).flops(wl), **kernel.info}
    if caps.binary_kinds:  # CUDA C through nvcc; the CPU's LLVM IR or assembly below
        from ..backend.cuda import cuda_source, nvcc_compile
        source = cuda_source(kernel)
        if args.emit_source:
            Path(args.emit_source).write_text(source)
            rep["source"] = args.emit_source
        if args.cubin:
            nvcc_compile(source, kernel.info["arch"], out=Path(args.cubin))
            rep["cubin"] = args.cubin
    elif args.emit_source:
        Path(args.emit_source).write_text(_emit_cpu(kernel, Path(args.emit_source)))
        rep["source"] = args.emit_source
    if args.json:
        emit_json(rep)
        return 0
    print(f"{wl.op} for {target.name}  {wl.dtype}  {shape_label(wl.op, wl.params, args)}  "
          f"({fmt_si(rep['flops'], 'FLOP')})")
    print(f"  template {kernel.template}  config {kernel.config}")
    facts = [f"{k}={rep[k]}" for k in ("arch", "tensor_core", "threads_per_block", "shared_bytes_per_block",
                                          "registers_per_thread", "spill_bytes") if k in rep]
    if facts:
        print("  " + "  ".join(facts))
    for key in ("source", "cubin"):
        if key in rep:
            print(f"  wrote {rep[key]}")
    return 0
