"""Tuning throughput on the simulators: candidates measured per second (build + timing-mode
simulation, in worker processes) with 1 and 2 workers, and in-process for reference; then the
whole xgb loop (search + model + measurement + records) in trials per second.

The same random sample of check-valid configs is measured by every variant; worker start-up
is excluded (each pool is warmed on a few other configs first).

    python benchmarks/tune_throughput.py [--n 96] [--json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.tune import tune
from opcompiler.tune.measure import BackendSpec, Measurer
from opcompiler.tune.space import Space

WORKLOADS = [("ascend-sim", "conv2d", "resnet50.res2_3x3", "float16"),
             ("ascend-sim", "matmul", "seed.matmul_16x256x1024", "float16"),
             ("dsp-sim", "conv2d", "minigo.conv3_res", "float32")]


def sample(space: Space, n: int, seed: int) -> list[dict]:
    rng, out, seen = random.Random(seed), [], set()
    for _ in range(100 * n):
        c = space.random(rng)
        cid = space.id(c)
        if cid not in seen and space.why_invalid(c) is None:
            seen.add(cid)
            out.append(c)
            if len(out) == n:
                break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=96, help="candidates per variant")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for tname, op, preset, dtype in WORKLOADS:
        target = load_target(tname)
        wl = workload(op, preset=preset, dtype=dtype)
        space = Space.of(wl, target, get_template(get_op(op).family, target.family))
        cfgs, warm = sample(space, args.n, 0), sample(space, 4, 1)
        row = {"target": target.name, "workload": f"{op} {preset}", "n": len(cfgs)}
        for workers in (0, 1, 2):
            with Measurer(BackendSpec(target=target), workers=workers, timeout=300) as m:
                m.measure(wl, warm)
                t0 = time.perf_counter()
                res = m.measure(wl, cfgs)
                row[f"cand/s w{workers}"] = len(cfgs) / (time.perf_counter() - t0)
                row["ok"] = sum(r.status == "ok" for r in res)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            r = tune(op, target, preset=preset, dtype=dtype, trials=args.n, workers=2, log=f"{tmp}/l.jsonl",
                     early_stop=0, verify=False, progress=False)
            row["xgb loop trials/s (2 workers, incl. start-up)"] = r.new_trials / (time.perf_counter() - t0)
        rows.append(row)
        print(row, file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"\ncandidates per second, {args.n} random check-valid configs each, same configs for every column")
    print(f"{'target':<18}{'workload':<34}{'in-process':>11}{'1 worker':>10}{'2 workers':>10}{'2w/1w':>7}"
          f"{'xgb loop':>10}")
    for r in rows:
        print(f"{r['target']:<18}{r['workload']:<34}{r['cand/s w0']:>11.1f}{r['cand/s w1']:>10.1f}"
              f"{r['cand/s w2']:>10.1f}{r['cand/s w2'] / r['cand/s w1']:>6.2f}x"
              f"{r['xgb loop trials/s (2 workers, incl. start-up)']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
