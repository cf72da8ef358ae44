"""`opcompiler compare MODEL.onnx`, `opcompiler graph run|plan|models`: whole ONNX graphs."""
from __future__ import annotations

import argparse
import sys

from ..errors import OpcFailure
from .common import add_target_arg, emit_json


def _graph_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx", help="an ONNX model (opset 6 or later; < 9 is upgraded)")
    add_target_arg(p, "cpu, ascend-sim, dsp-sim or a .toml path")
    p.add_argument("--batch", type=int, help="size of the dynamic batch dimension (required when the model has one)")
    p.add_argument("--fallback", choices=("cpu",), help="run nodes the target cannot compile on the host "
                   "(onnxruntime / the cpu backend), reported separately")
    p.add_argument("--show-plan", action="store_true", help="print which ONNX nodes went into which kernel, and "
                   "why the cost-chosen plan fused each group or not; with `graph plan`, also each kernel's "
                   "workload, config (and where it comes from), FLOPs and compulsory bytes")
    p.add_argument("--config", choices=("best", "default"), default="best",
                   help="best verified tuning record per kernel (template default when none), or always default")
    p.add_argument("--fp32-nodes", metavar="auto|NODE,...", help="run these ONNX nodes (auto: every one whose "
                   "low-precision output overflows, until values fit again) in fp32 on the host")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compile an ONNX model fused, unfused and cost-chosen, run all three, compare")
    _graph_args(p)
    p.add_argument("--plot", metavar="FILE.png", help="write the per-layer breakdown of both plans")
    p.add_argument("--timing-only", action="store_true",
                   help="skip values and the onnxruntime check (timing mode: faster on the simulators)")
    p.set_defaults(func=cmd_compare)
    g = sub.add_parser("graph", help="whole ONNX graphs: plan, run, build the shipped models")
    gs = g.add_subparsers(dest="graph_command", metavar="SUBCOMMAND")
    gs.required = True
    r = gs.add_parser("run", help="compile and run one plan end to end, checked against onnxruntime")
    _graph_args(r)
    r.add_argument("--unfused", action="store_true", help="one kernel per primitive op (same as --plan unfused)")
    r.add_argument("--plan", choices=("cost", "fused", "unfused"), default="cost",
                   help="cost: fuse a group only where measured to pay (default); fused: every pattern; "
                   "unfused: nothing")
    r.set_defaults(func=cmd_run)
    pl = gs.add_parser("plan", help="print the fused, unfused and cost-chosen partitions (the last measures kernels)")
    _graph_args(pl)
    pl.set_defaults(func=cmd_plan)
    m = gs.add_parser("models", help="write the shipped ONNX models (built with onnx.helper) to a folder")
    m.add_argument("outdir", nargs="?", default="onnx_models")
    m.add_argument("--small", action="store_true", help="small models for tests and quick looks: fewer channels, "
                   "blocks and pixels (each file under 3 MB; resnet18 0.7 MB instead of 44.7 MB)")
    m.set_defaults(func=cmd_models)


def _load(args: argparse.Namespace):
    from ..graph import load
    g = load(args.model, batch=args.batch)
    return g


def cmd_plan(args: argparse.Namespace) -> int:
    from ..graph import format_plan, make_plan
    g = _load(args)
    plans = [make_plan(g, args.target, mode=m, fallback=args.fallback, config=args.config)
             for m in ("fused", "unfused", "cost")]
    if args.json:
        emit_json({p.kind: [{"kernel": k.name, "op": k.op, "params": dict(k.params), "nodes": list(k.nodes),
                             **({"why": k.why} if k.why else {}),
                             **(_kernel_facts(p, k, args.config) if args.show_plan else {})}
                            for k in p.groups] for p in plans})
    else:
        print("\n\n".join(format_plan(p) + (_kernel_table(p, args.config) if args.show_plan else "")
                          for p in plans))
    return 0


def _kernel_facts(plan, g, config: str) -> dict:
    """What `graph plan --show-plan` adds for one kernel: its workload, the config it builds with
    and where that comes from (your record, a shipped one, an anchor's, the template default),
    its FLOPs and compulsory off-chip bytes (inputs read once, output written once)."""
    from ..config import choose, parse_config
    from ..ops import get_op, shape_text
    wl = plan.workload(g)
    if wl is None:
        return {}
    ch = choose(wl, plan.target, parse_config(config))
    op = get_op(wl.op)
    return {"workload": f"{wl.op} {wl.dtype} {shape_text(wl.op, dict(wl.params))}",
            "config": dict(ch.spec) if isinstance(ch.spec, dict) else (ch.spec or "default"),
            "config_source": ch.source, "flops": op.flops(wl), "bytes": op.bytes(wl)}


def _kernel_table(plan, config: str) -> str:
    from .common import fmt_si
    lines = [f"  kernels of the {plan.kind} plan (--config {config}):"]
    for g in plan.groups:
        f = _kernel_facts(plan, g, config)
        if f:
            lines.append(f"  {g.name:<4} {f['workload']}")
            cfg = (f"config: {f['config_source']}" if f["config"] == "default"
                   else f"config {f['config']} ({f['config_source']})")
            lines.append(f"       {fmt_si(f['flops'], 'FLOP')}, {fmt_si(f['bytes'], 'B')} compulsory; {cfg}")
    return "\n" + "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from ..graph import format_plan, make_plan, run_plan
    from ..graph.compare import format_run
    import time
    g = _load(args)
    t0 = time.perf_counter()
    p = make_plan(g, args.target, mode="unfused" if args.unfused else args.plan, fallback=args.fallback,
                  config=args.config)
    plan_s = time.perf_counter() - t0  # the cost-chosen plan builds and times kernels to decide
    if args.show_plan and not args.json:
        print(format_plan(p) + "\n")
    r = run_plan(p, config=args.config, progress=sys.stderr.isatty(), fp32_nodes=args.fp32_nodes)
    if args.json:
        emit_json(r.as_dict())
    else:
        print(format_run(r))
        t = r.totals()
        print(f"total: {t['seconds'] * 1e3:.4g} ms" + (f" ({t['cycles']:,} cycles)" if t["cycles"] is not None else "")
              + f", off-chip {t['offchip_bytes']:,} B; compile {r.compile_seconds + plan_s:.1f} s")
        print(f"vs onnxruntime: {'OK' if r.correct else 'MISMATCH'} (max abs err "
              + ", ".join(f"{k} {v:.3g}" for k, v in r.max_abs_err.items()) + ")")
        if r.correct and r.drift:
            print(f"  {p.dtype}: {r.diagnosis()}")
    if not r.correct:
        raise OpcFailure(r.diagnosis() or f"{g.name} on {p.target.name} ({p.kind}) does not match onnxruntime")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ..graph import compare, format_compare, format_plan, make_plan, plot_compare
    g = _load(args)
    if args.show_plan and not args.json:
        for mode in ("fused", "unfused", "cost"):
            print(format_plan(make_plan(g, args.target, mode=mode, fallback=args.fallback, config=args.config))
                  + "\n")
    c = compare(g, args.target, fallback=args.fallback, check=not args.timing_only, config=args.config,
                progress=sys.stderr.isatty(), fp32_nodes=args.fp32_nodes)
    out = c.as_dict()
    if args.plot:
        out["plot"] = str(plot_compare(c, args.plot))
    if args.json:
        emit_json(out)
    else:
        print(format_compare(c))
        if args.plot:
            print(f"plot: {out['plot']}")
    if False in [r.correct for r in c.runs.values()]:
        why = next((r.diagnosis() for r in c.runs.values() if r.diagnosis()), "")
        raise OpcFailure(why or f"{g.name} on {c.fused.plan.target.name} does not match onnxruntime")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..graph.models import MODELS, write
    small = {"resnet_block": {"c": 16, "hw": 14}, "resnet50_stage": {"hw": 14}, "minigo": {"res_blocks": 2},
             "resnet18": {"hw": 32, "classes": 10, "width": 8}, "op_zoo": {}}
    for name in MODELS:
        print(write(name, Path(args.outdir) / f"{name}.onnx", **(small[name] if args.small else {})))
    return 0
