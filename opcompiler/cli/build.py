"""`opcompiler build`: build one kernel without running it and write its code.

For cuda targets `--emit-source FILE.cu` writes the CUDA C source TVM generated (nvcc has
already compiled it during the build; `--cubin FILE` keeps the binary too). For the cpu target
it writes LLVM IR (`.ll`) or assembly (`.s`), chosen by the file's suffix.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..api import parse_config, resolve_config
from ..backend import get_backend
from ..errors import OpcError
from ..ops import get_op
from .common import add_workload_args, emit_json, fmt_si, resolve

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


def cmd_build(args: argparse.Namespace) -> int:
    wl, target = resolve(args)
    if args.cubin and target.family != "cuda":
        raise OpcError("only applies to cuda targets", arg="--cubin", value=args.cubin, expected="--target cuda")
    if args.emit_source:
        out = Path(args.emit_source)
        if target.family == "cuda" and out.suffix not in (".cu", ".cuh"):
            raise OpcError("a cuda kernel's source is CUDA C", arg="--emit-source", value=args.emit_source,
                           expected="a .cu file")
        if target.family in ("ascend", "dsp"):
            raise OpcError(f"{target.name} is a simulator: it has no source to emit", arg="--emit-source",
                           value=args.emit_source, expected="--target cuda or cpu")
        if not out.parent.exists():
            raise OpcError("directory does not exist", arg="--emit-source", value=args.emit_source)
    backend = get_backend(target)
    cfg = resolve_config(wl, target, parse_config(args.config))
    kernel = backend.build(wl, cfg)
    rep: dict[str, Any] = {"op": wl.op, "target": target.name, "shape": dict(wl.params), "dtype": wl.dtype,
                           "template": kernel.template, "config": kernel.config,
                           "flops": get_op(wl.op).flops(wl), **kernel.info}
    if target.family == "cuda":
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
    print(f"{wl.op} for {target.name}  {wl.dtype}  {wl.shape_str()}  ({fmt_si(rep['flops'], 'FLOP')})")
    print(f"  template {kernel.template}  config {kernel.config}")
    facts = [f"{k}={rep[k]}" for k in ("arch", "tensor_core", "threads_per_block", "shared_bytes_per_block",
                                          "registers_per_thread", "spill_bytes") if k in rep]
    if facts:
        print("  " + "  ".join(facts))
    for key in ("source", "cubin"):
        if key in rep:
            print(f"  wrote {rep[key]}")
    return 0
