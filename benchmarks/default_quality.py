"""What a user gets before any tuning: derived defaults against the shipped bests, and whole models
compiled with an empty log directory (issue 23).

    python benchmarks/default_quality.py [--targets ascend-sim,dsp-sim] [--models resnet18,light_resnet50|all]
                                         [--size full|ci] [--no-models] [--topk 8] [--check] [--json out.json]

Part 1, per simulator: for every workload of the shipped records, the template default's cycles
(`opcompiler run ... --config default --timing-only`: the derived default, nothing measured), the
shipped best's cycles and their ratio, with the geometric mean and the worst. `--topk K` adds the
opt-in benchmark mode's column (the K best-predicted candidates timed, the fastest kept). The
derived defaults' models are trained on synthetic shapes only (benchmarks/train_default_model.py),
so every row here is held out.

Part 2, per model and simulator: `opcompiler compare MODEL --timing-only --json` in a subprocess with
`OPC_LOG_DIR` set to an empty directory (the shipped records only): kernels, fused / unfused /
cost-chosen cycles, fused / unfused speedup, and how many fused kernels are slower than the parts
they replace. Models: the test zoo's torchvision architectures (tests/zoo/export.py, full size by
default) and onnx's own light_* models (light_resnet50, light_inception_v1, ...). `--models all`
takes every zoo model and the nine light CNNs.

`--check` runs part 2 with values checked (no `--timing-only`: every kernel executes on the
simulator and each plan is compared with onnxruntime; dsp-sim takes minutes per model) and adds,
per model, whether each plan is correct, and the first kernel that failed: a kernel split or
run on the host after an internal error (its note), or the kernel furthest from its fp32
recomputation when the values drift (`drift.worst_kernel`). The onnx light models carry random
weights whose activations overflow float16 (light_squeezenet reaches 5e5), so the check runs with
`--fp32-nodes auto`: a kernel whose fp16 output overflows runs in fp32 on the host (the row says
how many), and every other kernel is checked on the simulator.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.prior import measure_top
from opcompiler.target import load_target
from opcompiler.tune.records import shipped_dir, verified_bests

ROOT = Path(__file__).resolve().parents[1]


def shipped_rows(target_name: str, topk: int) -> list[dict]:
    target = load_target(target_name)
    backend = get_backend(target)
    rows = []
    for key, best in verified_bests(shipped_dir() / target.name, target):
        wl = workload(key["op"], key["params"], dtype=key["dtype"])
        t0 = time.perf_counter()
        kernel = backend.build(wl, None)
        cyc = backend.measure(kernel).cycles
        row = {"target": target.name, "op": key["op"], "shape": _shape(key["params"]), "default": cyc,
               "best": int(best.cost), "ratio": cyc / best.cost, "default_config": dict(kernel.config),
               "seconds": time.perf_counter() - t0}
        if topk:
            got = measure_top(backend.template(wl), wl, target, topk, backend)
            row["topk"] = got[1] if got else None
            row["topk_ratio"] = got[1] / best.cost if got else None
        rows.append(row)
    return rows


def _shape(params: dict) -> str:
    keep = ("n", "c", "h", "w", "k", "r", "stride", "m")
    return ",".join(f"{k}={v}" for k, v in params.items() if k in keep)


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


LIGHT = ("light_bvlc_alexnet", "light_densenet121", "light_inception_v1", "light_inception_v2", "light_resnet50",
         "light_shufflenet", "light_squeezenet", "light_vgg19", "light_zfnet512")


def model_paths(names: list[str], size: str, out: Path) -> list[tuple[str, Path]]:
    import onnx

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    sys.path.insert(0, str(ROOT / "tests"))
    if names == ["all"]:
        from zoo.export import NAMES
        names = list(NAMES) + list(LIGHT)
    paths = []
    for n in names:
        if n.startswith("light_"):
            paths.append((n, light / f"{n}.onnx"))
        else:
            from zoo.export import export_model
            paths.append((n, Path(export_model(n, out, size, check=False)["path"])))
    return paths


def compare_json(path: Path, target: str, args: list[str], timeout: int) -> tuple[dict | None, str | None, float]:
    """`opcompiler compare PATH --target T --json ARGS` in a subprocess with an empty log directory:
    (its JSON, None, wall seconds), or (None, opcompiler's one-line error, wall seconds)."""
    with tempfile.TemporaryDirectory() as logs:
        env = {**os.environ, "OPC_LOG_DIR": logs}
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-m", "opcompiler", "compare", str(path), "--target", target,
                                "--json", *args], capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"over {timeout} s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("opcompiler")] or p.stderr.splitlines()[-1:]
        return None, (lines[-1] if lines else f"exit {p.returncode}")[:300], wall
    return json.loads(p.stdout), None, wall


def model_row(name: str, path: Path, target: str, timeout: int, check: bool = False) -> dict:
    d, err, wall = compare_json(path, target, ["--batch", "1"] + (["--fp32-nodes", "auto"] if check
                                                                  else ["--timing-only"]), timeout)
    if d is None:
        return {"model": name, "target": target, "error": err}
    tot = {k: d[k]["totals"]["cycles"] for k in ("fused", "unfused", "cost") if k in d}
    slower = slower_fused(d["fused"]["kernels"], d["unfused"]["kernels"])
    row = {"model": name, "target": target, "kernels": d["fused"]["totals"]["kernels"], **tot,
           "speedup": d["speedup"], "cost_vs_unfused": d.get("cost_plan", {}).get("speedup_vs_unfused"),
           "slower_fused": slower, "wall": wall}
    if check:
        row["correct"] = {k: d[k]["correct"] for k in ("fused", "unfused", "cost") if k in d}
        row["first_failure"] = first_failure(d)
        row["fp32_kernels"] = len(d["fused"].get("fp32_kernels") or [])
    return row


def first_failure(d: dict) -> str | None:
    """The first kernel that failed in any plan: split or sent to the host after an internal
    error (its note), or, for wrong values, the kernel furthest from its fp32 recomputation."""
    for plan in ("fused", "unfused", "cost"):
        for k in (d.get(plan) or {}).get("kernels", []):
            note = k.get("note") or ""
            if "internal error" in note or "at run time" in note or "Error" in note:
                return f"{plan} {k['name']} ({k['op']}): {note[:160]}"
    for plan in ("fused", "unfused", "cost"):
        run = d.get(plan) or {}
        if run.get("correct") is False:
            drift = run.get("drift") or {}
            return f"{plan}: wrong values, worst kernel {drift.get('worst_kernel')} ({drift.get('worst_kernel_rel')})"
    return None


def slower_fused(fused: list[dict], unfused: list[dict]) -> int:
    """Fused kernels that take more cycles than the unfused kernels of the ONNX nodes they hold."""
    n = 0
    for k in fused:
        nodes = set(k.get("nodes") or ())
        parts = [u for u in unfused if u.get("nodes") and set(u["nodes"]) <= nodes]
        if len(parts) > 1 and k.get("cycles") and all(u.get("cycles") for u in parts):
            n += k["cycles"] > sum(u["cycles"] for u in parts)
    return n


def _verdict(r: dict) -> str:
    if "correct" not in r:
        return ""
    marks = "/".join({True: "yes", False: "NO", None: "-"}[r["correct"].get(k)] for k in ("fused", "unfused", "cost"))
    return f"  {marks}" + (f"  ({r['fp32_kernels']} fp16-overflowing kernels in fp32 on the host)"
                           if r.get("fp32_kernels") else "") + (f"  first failure: {r['first_failure']}" if r.get("first_failure") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--models", default="resnet18,resnet50,googlenet,light_resnet50,light_inception_v1")
    ap.add_argument("--size", default="full", choices=("full", "ci"))
    ap.add_argument("--no-models", action="store_true", help="part 1 only")
    ap.add_argument("--no-records", action="store_true", help="part 2 only")
    ap.add_argument("--topk", type=int, default=0, help="also time the K best-predicted candidates (opt-in mode)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--check", action="store_true",
                    help="part 2 with values checked against onnxruntime (every kernel executed; slow on dsp-sim)")
    ap.add_argument("--json")
    args = ap.parse_args()
    targets = args.targets.split(",")
    out: dict = {"records": [], "models": []}
    if not args.no_records:
        print("## derived default vs shipped best (timing mode, cycles)\n")
        hdr = f"{'target':<18} {'op':<8} {'shape':<42} {'default':>9} {'best':>9} {'ratio':>6}"
        print(hdr + (f" {'top-k':>9} {'ratio':>6}" if args.topk else ""))
        for t in targets:
            rows = shipped_rows(t, args.topk)
            out["records"] += rows
            for r in rows:
                line = f"{r['target']:<18} {r['op']:<8} {r['shape']:<42} {r['default']:>9,} {r['best']:>9,} {r['ratio']:>5.2f}x"
                if args.topk:
                    line += (f" {r['topk']:>9,} {r['topk_ratio']:>5.2f}x" if r["topk"] else
                             f" {'-':>9} {'-':>6}")  # no model: measured mode is the default
                print(line, flush=True)
            ratios = [r["ratio"] for r in rows]
            top = [r["topk_ratio"] for r in rows if r.get("topk_ratio")]
            print(f"{rows[0]['target'] if rows else t}: geometric mean {_geo(ratios):.3f}x, worst {max(ratios):.3f}x "
                  f"over {len(rows)} workloads" + (f"; top-{args.topk}: {_geo(top):.3f}x, worst {max(top):.3f}x"
                                                   if top else ""))
            print()
    if not args.no_models:
        print(f"## models at {args.size} size, batch 1, empty log directory (cycles, "
              f"{'values checked against onnxruntime' if args.check else 'timing mode'})\n")
        print(f"{'model':<20} {'target':<12} {'kernels':>7} {'fused':>12} {'unfused':>12} {'cost':>12} "
              f"{'fused/unf':>9} {'cost/unf':>8} {'slower':>6} {'wall':>6}" + ("  correct (f/u/c)" if args.check else ""))
        with tempfile.TemporaryDirectory() as tmp:
            for name, path in model_paths(args.models.split(","), args.size, Path(tmp)):
                for t in targets:
                    r = model_row(name, path, t, args.timeout, args.check)
                    out["models"].append(r)
                    if "error" in r:
                        print(f"{name:<20} {t:<12} error: {r['error']}", flush=True)
                        continue
                    print(f"{name:<20} {t:<12} {r['kernels']:>7} {r['fused']:>12,} {r['unfused']:>12,} "
                          f"{r.get('cost') or 0:>12,} {r['speedup']:>8.2f}x {r['cost_vs_unfused'] or 0:>7.2f}x "
                          f"{r['slower_fused']:>6} {r['wall']:>5.0f}s" + _verdict(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
