"""The test-owned model zoo (tests/zoo) end to end on every target, with no fallback.

    python benchmarks/model_zoo.py [--size ci|full] [--models a,b] [--targets cpu,ascend-sim,dsp-sim]
                                   [--onnx-dir DIR] [--timeout S] [--json out.json]

Exports each zoo model (tests/zoo/export.py: torchvision architectures in torch.nn, opsets 11-17,
plus the opset-8 conversions), then runs `opcompiler compare MODEL.onnx --target T --json` in a
subprocess per (model, target) and prints one row each: kernels of the fused / unfused /
cost-chosen plans, their cycles (simulators) or seconds (cpu), their off-chip bytes, compile time
(the three plans' compile_seconds summed) and wall time of the command, whether every plan
matched onnxruntime, and whether the cost-chosen plan is at least as fast as unfused ("cost>=u").
A run that fails prints opcompiler's one-line error in its row instead.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from zoo.export import NAMES, export_model  # noqa: E402

TARGETS = ("cpu", "ascend-sim", "dsp-sim")
PLANS = ("fused", "unfused", "cost")


def _error_line(stderr: str, rc: int) -> str:
    """opcompiler's own one-line message (`opcompiler: error|failure|internal error: ...`), else
    the last non-empty stderr line (a crash)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    mine = [ln for ln in lines if ln.startswith("opcompiler:")]
    return (mine[-1] if mine else lines[-1] if lines else f"exit {rc}, no message")


def run_one(path: str, target: str, timeout: float, extra: tuple[str, ...] = ()) -> dict:
    """`opcompiler compare PATH --target T --json` in a subprocess; the row's data."""
    cmd = [sys.executable, "-m", "opcompiler", "compare", path, "--target", target, "--json", *extra]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "OPC_DEBUG": ""})
    except subprocess.TimeoutExpired:
        return {"ok": False, "rc": None, "error": f"timed out after {timeout:.0f} s", "wall": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    row: dict = {"rc": p.returncode, "wall": wall}
    try:
        d = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        d = None
    if d is not None:
        row["json"] = d
    if p.returncode != 0:
        row.update(ok=False, error=_error_line(p.stderr, p.returncode))
        return row
    if d is None:
        row.update(ok=False, error="exit 0 but no JSON on stdout")
        return row
    row["ok"] = True
    return row


def summarize(d: dict) -> dict:
    """Per plan: kernels, cycles, seconds, off-chip bytes, correct; compile seconds summed."""
    out: dict = {"plans": {}, "compile_s": 0.0, "host_nodes": 0}
    for plan in PLANS:
        r = d.get(plan)
        if r is None:
            continue
        t = r["totals"]
        out["plans"][plan] = {"kernels": t["kernels"], "cycles": t["cycles"], "seconds": t["seconds"],
                              "offchip_bytes": t["offchip_bytes"], "correct": r["correct"]}
        out["compile_s"] += r.get("compile_seconds") or 0.0
        out["host_nodes"] += t.get("host_nodes") or 0
    corr = [p["correct"] for p in out["plans"].values()]
    out["correct"] = all(c is True for c in corr) if corr else None
    cp = d.get("cost_plan")
    out["cost_vs_unfused"] = cp.get("speedup_vs_unfused") if cp else None
    return out


def _num(x, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "s":
        return f"{x * 1e3:.3g}ms" if x >= 1e-3 else f"{x * 1e6:.3g}us"
    for scale, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{p}"
    return f"{x:.0f}"


def format_row(model: str, target: str, r: dict) -> str:
    head = f"{model:<22} {target:<10}"
    if not r.get("ok"):
        err = r.get("error", "?")
        return f"{head} FAIL  {err}"
    s = r["summary"]
    pl = s["plans"]
    cyc = all(p["cycles"] is not None for p in pl.values())
    cost = lambda p: _num(p["cycles"], "") if cyc else _num(p["seconds"], "s")  # noqa: E731
    g = lambda k, f: "/".join(f(pl[p]) if p in pl else "-" for p in PLANS)  # noqa: E731
    ratio = s["cost_vs_unfused"]
    return (f"{head} {g('kernels', lambda p: str(p['kernels'])):<12} {g('cost', cost):<26} "
            f"{'cyc' if cyc else 's':<3} {g('offchip', lambda p: _num(p['offchip_bytes'], '')):<20} "
            f"{s['compile_s']:>7.1f} {r['wall']:>6.1f}  {'yes' if s['correct'] else 'NO':<7} "
            f"{'-' if ratio is None else ('yes' if ratio >= 1 - 1e-9 else 'NO')} "
            f"({'-' if ratio is None else f'{ratio:.2f}x'})")


HEADER = (f"{'model':<22} {'target':<10} {'kernels f/u/c':<12} {'cost fused/unfused/cost':<26} {'':<3} "
          f"{'off-chip B f/u/c':<20} {'compile':>7} {'wall':>6}  {'correct':<7} cost>=u")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("ci", "full"), default="ci")
    ap.add_argument("--models", help=f"comma-separated subset of: {','.join(NAMES)}")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--onnx-dir", help="where the exported models go (default: a temporary folder)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per (model, target) run")
    ap.add_argument("--json", metavar="FILE", help="also write every row (with the compare JSON) here")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else list(NAMES)
    bad = [n for n in names if n not in NAMES]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)} (have: {', '.join(NAMES)})")
    targets = args.targets.split(",")
    tmp = None
    if args.onnx_dir:
        out_dir = Path(args.onnx_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="model_zoo_")
        out_dir = Path(tmp.name)

    print(f"model zoo, size {args.size}: {len(names)} models x {len(targets)} targets, no fallback", flush=True)
    print(HEADER, flush=True)
    rows, failures, t_all = [], 0, time.perf_counter()
    for name in names:
        try:
            ex = export_model(name, out_dir, args.size)
        except Exception as e:  # an export or ort-vs-torch mismatch: one row per target
            msg = f"export failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            for t in targets:
                print(format_row(name, t, {"ok": False, "error": msg}), flush=True)
                rows.append({"model": name, "target": t, "ok": False, "error": msg})
                failures += 1
            continue
        for t in targets:
            r = run_one(ex["path"], t, args.timeout)
            if r.get("json") is not None:
                r["summary"] = summarize(r["json"])
            if r.get("ok") and not r["summary"]["correct"]:
                r["ok"] = False
            failures += not r.get("ok")
            print(format_row(name, t, r), flush=True)
            rows.append({"model": name, "target": t, "opset": ex["opset"], "input_shape": list(ex["input_shape"]),
                         **{k: v for k, v in r.items() if k != "json" or args.json}})
    print(f"{len(rows) - failures}/{len(rows)} runs correct with no fallback; "
          f"{time.perf_counter() - t_all:.0f} s in all", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "rows": rows}, indent=1, default=str))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
