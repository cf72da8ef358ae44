"""`opcompiler tune`, `opcompiler best`, `opcompiler logs`."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from ..capabilities import capabilities
from ..errors import OpcError, OpcFailure
from ..ops import get_op, ordered_params, shape_text
from ..target import Target
from .common import add_workload_args, emit_json, fmt_si, note, preset_name, resolve, shape_label

DEFAULT_PRESET = {"conv": "resnet50.res2_3x3", "matmul": "seed.matmul_16x256x1024"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="autotune one operator's schedule knobs for a target, or every kernel of an "
                       "ONNX model (opcompiler tune MODEL.onnx --target T --trials N)")
    add_workload_args(p, config=False)
    p.add_argument("--trials", type=int, help="total measured configs for this workload, earlier records "
                   "included (default: 128 on simulators, 32 on cpu)")
    p.add_argument("--tuner", default="xgb", help="xgb (cost model) | random | grid (default %(default)s)")
    p.add_argument("--log", help="tuning log to append to (default: <OPC_LOG_DIR or "
                   "~/.local/share/opcompiler/tuning_logs>/<target>/<op>.jsonl)")
    p.add_argument("--workers", type=int, default=1, help="measurement processes (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="configs per search round (default %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate (default %(default)s)")
    p.add_argument("--early-stop", type=int, help="stop after N trials without improvement (0 = never; "
                   "default max(32, trials/2))")
    p.add_argument("--no-transfer", action="store_true", help="do not warm-start from other shapes' records")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rpc", help="HOST:PORT:KEY of an RPC tracker owning the device (cuda), or its simulator "
                   "servers (ascend-sim, dsp-sim: python -m opcompiler.rpc --key KEY)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("best", help="print the best verified tuning record of one workload")
    add_workload_args(p, config=False)
    p.add_argument("--log", help="tuning log to read (default: your records, then those shipped with opcompiler)")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("logs", help="summarize the stored tuning records")
    p.add_argument("--target", help="only records of this target (name or alias)")
    p.add_argument("--log", "--dir", dest="log", metavar="PATH", help="a log directory or .jsonl file to summarize "
                   "instead (default: your records; --dir is the older name of this option)")
    p.add_argument("--shipped", action="store_true", help="also list the records shipped with opcompiler "
                   "(read-only; `best` and --config best use them when they are faster)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_logs)


def _default_args(args: argparse.Namespace) -> None:
    """No shape given: the op's default preset (a ResNet-50 3x3 conv for convolutions), with a note."""
    if args.shape is None and args.preset is None:
        kind = get_op(args.op).preset_kind
        if kind in DEFAULT_PRESET:
            args.preset = DEFAULT_PRESET[kind]
            note(f"no --shape or --preset: preset {args.preset}" + (f" with --batch {args.batch}" if args.batch else "")
                 + f", {args.command}'s default for {args.op}")


def _default_dtype(op: str, target: Target) -> str | None:
    from ..ops import default_dtype
    return default_dtype(op, target)  # the family's preferred dtype (fp16 on the Ascend cube), else fp32


def cmd_tune(args: argparse.Namespace) -> int:
    from ..target import load_target
    from ..tune import tune
    if args.op.endswith(".onnx"):
        return cmd_tune_model(args)
    target = load_target(args.target)
    _default_args(args)
    if capabilities(target).needs_device:
        _require_cuda(args.rpc, args.target, target)
    elif args.rpc and not capabilities(target).simulator:
        raise OpcError("only measures on remote devices (cuda targets) or simulator servers", arg="--rpc",
                       value=args.rpc, expected="--target cuda, ascend-sim or dsp-sim")
    if args.workers is not None and args.workers < 0:
        raise OpcError("must be >= 0", arg="--workers", value=args.workers, expected="1 or 2 on this machine")
    wl, _ = resolve(args, _default_dtype(args.op, target))
    trials = args.trials if args.trials is not None else capabilities(target).default_trials
    res = tune(wl.op, target, shape=dict(wl.params), dtype=wl.dtype, trials=trials, tuner=args.tuner,
               log=args.log, workers=args.workers, batch_size=args.batch_size, timeout=args.timeout,
               early_stop=args.early_stop, transfer=not args.no_transfer, seed=args.seed, rpc=args.rpc or "",
               progress=not args.json)
    summary = summarize(res)
    if preset_name(args):
        summary["preset"] = preset_name(args)
    if args.json:
        emit_json(summary)
    else:
        print_summary(summary)
    if res.best_measured is None:
        raise OpcFailure(no_valid_message(res))
    if res.best is None:
        raise OpcFailure(f"no candidate passed verification against the reference (see {res.log})")
    return 0


def cmd_tune_model(args: argparse.Namespace) -> int:
    """`opcompiler tune MODEL.onnx`: every distinct kernel, trials allocated by share of model time."""
    from ..graph import load
    from ..target import load_target
    from ..tune.model import tune_model
    target = load_target(args.target)
    if capabilities(target).needs_device:
        _require_cuda(args.rpc, args.target, target)
    if args.log:
        raise OpcError("a model's kernels each go to their own log", arg="--log", value=args.log,
                       expected="OPC_LOG_DIR=DIR to choose where the records go")
    graph = load(args.op, batch=args.batch)
    trials = args.trials if args.trials is not None else 16 * capabilities(target).default_trials // 8
    res = tune_model(graph, target, trials, workers=args.workers, batch_size=max(8, args.batch_size),
                     progress=not args.json, seed=args.seed, timeout=args.timeout, rpc=args.rpc or "")
    if args.json:
        emit_json(res.as_dict())
        return 0
    print(f"  {'kernel':<58} {'uses f/u':>8} {'trials':>6} {'before':>12} {'after':>12}")
    for t in sorted(res.tasks, key=lambda t: -t.before * sum(t.uses.values())):
        uses = f"{t.uses.get('fused', 0)}/{t.uses.get('unfused', 0)}"
        print(f"  {t.label[:58]:<58} {uses:>8} {t.trials:>6} {t.before * 1e6:>9.4g} us {t.now * 1e6:>9.4g} us")
    for s in res.skipped:
        print(f"  not tuned: {s}")
    print(f"{res.model} on {target.name}: {res.trials} trials ({res.new_trials} this run) over {len(res.tasks)} "
          f"kernels in {res.elapsed:.0f} s; records in {default_log_dir()}")
    for plan in ("unfused", "fused", "cost"):
        b, a = res.before[plan], res.after[plan]
        print(f"  estimated model time, {plan + ' plan':<13} {b * 1e3:.4g} ms -> {a * 1e3:.4g} ms"
              + (f" ({b / a:.2f}x)" if a else ""))
    print(f"  next: opcompiler compare {shlex.quote(args.op)} --target {target.name}"
          + (f" --batch {args.batch}" if args.batch else "") + " --config best")
    return 0


def default_log_dir() -> str:
    from ..settings import user_log_dir
    return str(user_log_dir()[0])


def _require_cuda(rpc: str | None, name: str, target: Target | None = None) -> None:
    """A GPU here that can run `target`'s code, or an RPC tracker that owns one; otherwise the cuda
    backend's one-line OpcError."""
    try:
        from ..backend.cuda import require_device_or_rpc
    except ModuleNotFoundError:
        raise OpcError("the cuda backend is not available in this build", arg="--target", value=name,
                       expected="ascend-sim, dsp-sim or cpu") from None
    require_device_or_rpc(rpc, target)


def no_valid_message(res: Any) -> str:
    why = "; ".join(f"{n}x {r}" for r, n in res.failures.items()) or "see the log"
    return (f"all {res.trials} candidates of {res.workload.op} on {res.target.name} failed ({why}); "
            f"nothing to keep — try another shape, dtype or target (records in {res.log})")


def export_command(res: Any) -> str:
    """The command that exports the tuned kernel; its folder name is a Python identifier, so
    `import <folder>` works (README, Exporting kernels)."""
    from ..export import folder_name
    wl = res.workload
    return (f"opcompiler export {wl.op} --target {res.target.name} --shape "
            f"{shlex.quote(shape_text(wl.op, dict(wl.params)))} --dtype {wl.dtype} --config best --to torch "
            f"--out exported/{folder_name(f'{wl.op}_{res.target.name}')}")


def summarize(res: Any) -> dict[str, Any]:
    """The `--json` object (and the table's content)."""
    wl, t = res.workload, res.target
    flops = get_op(wl.op).flops(wl)
    best, default = res.best, res.default
    out: dict[str, Any] = {
        "op": wl.op, "target": t.name, "shape": ordered_params(wl.op, dict(wl.params)), "dtype": wl.dtype,
        "template": res.template,
        "tuner_stop": res.stop_reason, "trials": res.trials, "new_trials": res.new_trials, "invalid": res.invalid,
        "rejected_by_check": res.rejected, "log": str(res.log), "verified": best is not None,
        "best_config": dict(best.config) if best else None, "elapsed_s": round(res.elapsed, 2),
    }
    if best is None and res.best_measured is not None:
        out["best_unverified_config"] = dict(res.best_measured.config)
    unit = res.unit
    for name, rec in (("best", best), ("default", default)):
        if unit == "cycles":
            out[f"{name}_cycles"] = rec.cycles if rec is not None and rec.valid else None
        out[f"{name}_seconds"] = _seconds(rec, t)
    secs = out["best_seconds"]
    out["tflops"] = flops / secs / 1e12 if secs else None
    peak = t.peak_flops(wl.dtype)
    if best is not None and "percent_of_peak" in best.metrics:
        out["percent_of_peak"] = float(best.metrics["percent_of_peak"])
    else:
        out["percent_of_peak"] = 100.0 * flops / secs / peak if secs and peak else None
    out["bound"] = best.metrics.get("bound") if best is not None else None
    out["speedup_over_default"] = res.speedup
    out["export_command"] = export_command(res) if best is not None else None
    out.update(_shipped_beside(res))
    stats = getattr(res, "measure_stats", None) or {}
    out["candidates_per_second"] = round(stats["candidates_per_second"], 3) if stats.get("candidates") else None
    if "rpc_servers" in stats:  # simulator servers under a tracker's key
        out["rpc_measure"] = {"servers": stats["rpc_servers"], "resent": stats["rpc_resent"]}
    if "runner_restarts" in stats:  # a local GPU: build processes feeding one runner process
        out["gpu_measure"] = {k: stats[k] for k in ("builders", "runner_restarts") if k in stats}
    return out


def _shipped_beside(res: Any) -> dict[str, Any]:
    """The shipped record of the same key, if any, beside this tune's best, and which of the two
    `--config best` (and export, compare) will take: the faster, yours on a tie."""
    from ..records import find_best, shipped_dir

    path = shipped_dir() / res.target.name / f"{res.workload.op}.jsonl"
    found = find_best(res.workload, res.target, path) if path.is_file() else None
    if found is None:
        return {}
    rec = found.record
    mine = res.best.cost if res.best is not None else float("inf")
    return {"shipped_best_cycles": rec.cycles, "shipped_best_seconds": _seconds(rec, res.target),
            "shipped_log": str(path), "config_best_uses": "shipped" if rec.cost < mine else "yours"}


def _seconds(rec: Any, t: Target) -> float | None:
    if rec is None or not rec.valid:
        return None
    if rec.seconds:
        return rec.seconds
    return rec.cycles / (t.clock_ghz * 1e9) if rec.cycles is not None and t.clock_ghz else None


def print_summary(s: dict[str, Any]) -> None:
    shape = shape_text(s["op"], s["shape"], s.get("preset"))
    rows: list[tuple[str, str]] = [
        ("workload", f"{s['op']} {s['dtype']} {shape}"),
        ("target / template", f"{s['target']} / {s['template']}"),
        ("trials", f"{s['trials']} ({s['new_trials']} this run, {s['invalid']} invalid, "
                   f"{s['rejected_by_check']} rejected before measuring) — {s['tuner_stop']}"),
    ]
    if s["best_config"] is not None:
        rows.append(("best config (verified)", _cfg(s["best_config"])))
    elif s.get("best_unverified_config"):
        rows.append(("best config (NOT verified)", _cfg(s["best_unverified_config"])))
    if "best_cycles" in s:
        rows.append(("cycles", _pair(s.get("best_cycles"), s.get("default_cycles"), lambda v: f"{v:,}")))
    rows.append(("time", _pair(s["best_seconds"], s["default_seconds"], lambda v: f"{v * 1e3:.4g} ms")))
    if s["tflops"] is not None:
        rows.append(("throughput", fmt_si(s["tflops"] * 1e12, "FLOPS")))
    if s["percent_of_peak"] is not None:
        rows.append(("% of peak", f"{s['percent_of_peak']:.1f} %" + (f", bound by {s['bound']}" if s["bound"] else "")))
    if s["speedup_over_default"] is not None:
        rows.append(("speedup over default", f"{s['speedup_over_default']:.2f}x"))
    if s.get("candidates_per_second"):
        gm = s.get("gpu_measure")
        rows.append(("measured", f"{s['candidates_per_second']:.2f} candidates/s"
                     + (f" ({gm['builders']} build processes, 1 GPU runner, {gm['runner_restarts']} runner restarts)"
                        if gm else "")
                     + (f" on {s['rpc_measure']['servers']} RPC servers ({s['rpc_measure']['resent']} re-sent)"
                        if s.get("rpc_measure") else "")))
    if s.get("shipped_log"):
        shipped = (f"{s['shipped_best_cycles']:,} cycles" if s.get("shipped_best_cycles") is not None
                   else f"{(s['shipped_best_seconds'] or 0) * 1e3:.4g} ms")
        uses = ("--config best, export and compare use it: it is faster than this tune's best"
                if s["config_best_uses"] == "shipped" else "yours is at least as fast: --config best uses yours")
        rows.append(("shipped record", f"{shipped} ({uses})"))
    rows.append(("record", s["log"]))
    if s["export_command"]:
        rows.append(("export it", s["export_command"]))
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"  {a:<{width}}  {b}")


def _cfg(c: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in c.items())


def _pair(best: Any, default: Any, fmt: Any) -> str:
    b = fmt(best) if best is not None else "-"
    d = fmt(default) if default is not None else "-"
    return f"{b}  (template default {d})"


def cmd_best(args: argparse.Namespace) -> int:
    from ..target import load_target
    from ..records import find_best, search_paths
    target = load_target(args.target)
    _default_args(args)
    wl, _ = resolve(args, _default_dtype(args.op, target))
    found = find_best(wl, target, args.log)
    where = [args.log] if args.log else [str(p) for p, _ in search_paths(target, wl.op)]
    if found is None:
        raise OpcError(f"no verified record for {wl.op} {wl.dtype} {shape_label(wl.op, wl.params, args)} on "
                       f"{target.name}",
                       arg="op", value=wl.op,
                       expected=f"a workload tuned with `opcompiler tune` (looked in {', '.join(where)})")
    rec = found.record
    out = {"op": wl.op, "target": target.name, "shape": ordered_params(wl.op, dict(wl.params)), "dtype": wl.dtype,
           "template": rec.key["template"], "config": dict(rec.config), "cycles": rec.cycles,
           "seconds": _seconds(rec, target), "metrics": dict(rec.metrics), "verified": True,
           "key": dict(rec.key), "source": found.source, "log": str(found.path)}
    if found.passed_over is not None:  # the other place's best, which this one beat
        po = found.passed_over
        out["passed_over"] = {"source": po.source, "log": str(po.path), "cycles": po.record.cycles,
                              "seconds": _seconds(po.record, target), "config": dict(po.record.config)}
    if args.json:
        emit_json(out)
        return 0
    print(f"{wl.op} {wl.dtype} {shape_label(wl.op, wl.params, args)} on {target.name}  ({rec.key['template']} "
          f"v{rec.key['template_version']}, verified)")
    print(f"  config  {_cfg(dict(rec.config))}")
    line = f"  time    {out['seconds'] * 1e3:.4g} ms" if out["seconds"] else "  time    -"
    if rec.cycles is not None:
        line += f" ({rec.cycles:,} cycles)"
    print(line)
    if "percent_of_peak" in rec.metrics:
        print(f"  {float(rec.metrics['percent_of_peak']):.1f} % of peak, bound by {rec.metrics.get('bound', '?')}")
    print(f"  from    {found.describe()}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Summarize records: `--log` when given, else the user's records (and the shipped ones with
    `--shipped`; otherwise one line says how many there are)."""
    from ..settings import user_log_dir
    from ..records import shipped_dir, summarize as summarize_logs
    tname = None
    if args.target:
        from ..target import load_target
        tname = load_target(args.target).name
    if args.log:
        root = Path(args.log)
        if not root.exists():
            raise OpcError("no tuning logs there", arg="--log", value=str(root),
                           expected="a directory or .jsonl file written by `opcompiler tune`")
        roots = [(root, "given")]
    else:
        user, why = user_log_dir()
        roots = [(user, "user")] + ([(shipped_dir(), "shipped")] if args.shipped else [])
    rows: list[dict[str, Any]] = []
    for root, source in roots:
        rows += summarize_logs(root, tname, source) if root.exists() else []
    hidden = 0
    if not args.log and not args.shipped:
        hidden = len(summarize_logs(shipped_dir(), tname, "shipped")) if shipped_dir().exists() else 0
    if args.json:
        emit_json(rows)
        return 0
    if not args.log:
        print(f"your records:    {user}" + (" (set by OPC_LOG_DIR)" if why == "OPC_LOG_DIR" else "")
              + ("" if user.exists() else " (nothing tuned yet)"))
        print(f"shipped records: {shipped_dir()} (read-only)"
              + (f": {hidden} workloads, not listed (--shipped lists them)" if hidden else ""))
    if not rows:
        print("no records" + (f" for target {tname}" if tname else "") + (" of yours" if hidden else ""))
        return 0
    print(f"{'from':<8} {'target':<16} {'op':<18} {'dtype':<8} {'trials':>6} {'inv':>4} {'ver':>4} {'best':>14}  shape")
    for r in rows:
        best = r["best_verified_cost"] if r["best_verified_cost"] is not None else r["best_cost"]
        bs = "-" if best is None else (f"{best:,.0f} cyc" if r["unit"] == "cycles" else f"{best * 1e3:.4g} ms")
        if r["best_verified_cost"] is None and best is not None:
            bs += "*"
        stale = "  (older opcompiler)" if r["stale"] else ""
        print(f"{r['source']:<8} {r['target']:<16} {r['op']:<18} {r['dtype']:<8} {r['trials']:>6} {r['invalid']:>4} "
              f"{r['verified']:>4} {bs:>14}  {_row_shape(r)}{stale}")
    if any(r["best_verified_cost"] is None and r["best_cost"] is not None for r in rows):
        print("(* = best not verified yet)")
    return 0


def _row_shape(r: dict[str, Any]) -> str:
    """A summary row's shape (`k=v,...`, sorted by records.summarize) in the op's key order."""
    from ..ops.presets import parse_shape
    try:
        return shape_text(r["op"], parse_shape(r["shape"]))
    except OpcError:  # an op this build does not know (a record from another version): as stored
        return r["shape"]
