"""Produce the shipped tuning records: every ResNet-50 and MiniGo preset (and the seed matmul)
tuned on ascend-sim (float16) and dsp-sim (float32), best config verified against the numpy
reference, written to the repository's `tuning_logs/<target>/<op>.jsonl` so `run --config best`,
`compare` and `export` get tuned kernels out of the box. This is the maintainers' command that
writes shipped records (users' `opcompiler tune` never does).

Re-running resumes (configs already in the logs are not measured again); raise --trials to
tune further. Run from the repository root:

    python benchmarks/make_tuning_logs.py [--trials 64] [--workers 2] [--targets ascend-sim,dsp-sim]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from opcompiler.errors import OpcError
from opcompiler.ops import PRESETS
from opcompiler.target import load_target
from opcompiler.tune import tune

DTYPE = {"ascend": "float16", "dsp": "float32"}


def presets() -> list[tuple[str, str]]:
    """(op, preset) for every ResNet-50 and MiniGo preset plus the seed matmul."""
    out = []
    for name, p in PRESETS.items():
        if name.startswith(("resnet50.", "minigo.", "seed.")):
            out.append(("conv2d" if "r" in p else "matmul", name))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--only", help="comma-separated presets")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "tuning_logs"))
    args = ap.parse_args()
    rows = []
    for tname in args.targets.split(","):
        target = load_target(tname)
        for op, preset in presets():
            if args.only and preset not in args.only.split(","):
                continue
            t0 = time.perf_counter()
            log = Path(args.root) / target.name / f"{op}.jsonl"
            try:
                res = tune(op, target, preset=preset, dtype=DTYPE[target.family], trials=args.trials,
                           workers=args.workers, log=log, allow_shipped=True, progress=True)
            except OpcError as e:  # no template for this op/layout on this target: say so, go on
                rows.append((target.name, preset, "skipped", str(e)[:90]))
                print(f"{target.name} {preset}: skipped: {e}", file=sys.stderr)
                continue
            if res.best is None:
                status = "NO VERIFIED CONFIG"
            else:
                sp = f"{res.speedup:.2f}x over default" if res.speedup else "default config invalid"
                status = f"{res.best.cost:,.0f} cyc, {sp}"
            rows.append((target.name, preset, status, f"{res.trials} trials, {res.invalid} invalid, "
                                                      f"{time.perf_counter() - t0:.0f} s"))
    width = max(len(r[1]) for r in rows) if rows else 10
    for t, p, s, extra in rows:
        print(f"{t:<18} {p:<{width}}  {s:<40} {extra}")
    return 0 if all(r[2] != "NO VERIFIED CONFIG" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
