"""Produce the shipped tuning records: every ResNet-50 and MiniGo preset (and the seed matmul)
tuned on ascend-sim (float16) and dsp-sim (float32), best config verified against the numpy
reference, written to the repository's `tuning_logs/<target>/<op>.jsonl` so `run --config best`,
`compare` and `export` get tuned kernels out of the box. This is the maintainers' command that
writes shipped records (users' `opcompiler tune` never does).

Re-running resumes (configs already in the logs are not measured again); raise --trials to
tune further. After a template version bump or a change to the target's figures (its digest),
`--carry-over` first re-measures each workload's best records of the older version with the
current template and target (knobs the template no longer has dropped) and starts the log from
them, so the regenerated best is never worse than what the new version makes of the old best; it
prints old best vs carried vs new best, and `--prune-stale` then drops the rows whose template
version or target digest no longer matches. Run from the repository root:

    python benchmarks/make_tuning_logs.py [--trials 64] [--workers 2] [--targets ascend-sim,dsp-sim]
    python benchmarks/make_tuning_logs.py --targets dsp-sim --ops conv2d --carry-over --prune-stale
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import json

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.ops import PRESETS, workload
from opcompiler.target import load_target
from opcompiler.tune import tune
from opcompiler.tune.records import Record, RecordLog, now, record_key

DTYPE = {"ascend": "float16", "dsp": "float32"}


def presets() -> list[tuple[str, str]]:
    """(op, preset) for every ResNet-50 and MiniGo preset plus the seed matmul."""
    out = []
    for name, p in PRESETS.items():
        if name.startswith(("resnet50.", "minigo.", "seed.")):
            out.append(("conv2d" if "r" in p else "matmul", name))
    return out


def carry_over(log: Path, target, op: str, preset: str, dtype: str) -> tuple[int | None, int | None]:
    """Re-measure the best records (top 5 distinct configs) of an older template version or target
    digest with the current template and target; append them under the current key. Returns (old best, best carried) cycles."""
    wl = workload(op, preset=preset, dtype=dtype)
    be = get_backend(target)
    tmpl = be.resolve(wl, None).template
    if not log.exists():
        return None, None
    old = []
    for line in log.read_text().splitlines():
        r = Record.from_obj(json.loads(line))
        k = r.key
        if (r.valid and k["op"] == wl.op and k["params"] == dict(wl.params) and k["dtype"] == wl.dtype
                and k["template"] == tmpl.name
                and (k["template_version"], k["target_digest"]) != (tmpl.version, target.digest)):
            old.append(r)
    if not old:
        return None, None
    best = min(old, key=lambda r: r.cost)
    knobs = {k.name for k in tmpl.space(wl, target)}
    carried, seen = None, set()
    for r in sorted(old, key=lambda r: r.cost):  # the old top 5 distinct configs, retired knobs dropped
        cfg = {k: v for k, v in r.config.items() if k in knobs}
        if json.dumps(cfg, sort_keys=True) in seen:
            continue
        seen.add(json.dumps(cfg, sort_keys=True))
        try:
            kernel = be.build(wl, cfg)
        except OpcError:
            continue
        res = be.measure(kernel)
        RecordLog(log).append(Record(key=record_key(wl, target, tmpl.name, tmpl.version),
                                     config=dict(kernel.config), status="ok", cycles=res.cycles,
                                     seconds=res.seconds, metrics=res.metrics, tuner="carry-over",
                                     timestamp=now()))
        carried = res.cycles if carried is None else min(carried, res.cycles)
        if len(seen) >= 5:
            break
    return best.cycles, carried


def prune_stale(log: Path, target) -> int:
    """Drop rows whose template version is not the current one of their template, or that were
    measured on an older version of the target's figures (none match a key)."""
    from opcompiler.template import templates
    version = {c.name: c.version for c in templates()}
    keep, dropped = [], 0
    for line in log.read_text().splitlines():
        k = json.loads(line)["key"]
        if (version.get(k["template"], k["template_version"]) == k["template_version"]
                and k["target_digest"] == target.digest):
            keep.append(line)
        else:
            dropped += 1
    log.write_text("".join(x + "\n" for x in keep))
    return dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--only", help="comma-separated presets")
    ap.add_argument("--ops", default="conv2d,matmul", help="comma-separated ops (conv2d, matmul)")
    ap.add_argument("--carry-over", action="store_true", help="start each log from the older version's best")
    ap.add_argument("--prune-stale", action="store_true", help="drop rows of older template versions at the end")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "tuning_logs"))
    args = ap.parse_args()
    rows = []
    for tname in args.targets.split(","):
        target = load_target(tname)
        for op, preset in presets():
            if args.only and preset not in args.only.split(","):
                continue
            if op not in args.ops.split(","):
                continue
            t0 = time.perf_counter()
            log = Path(args.root) / target.name / f"{op}.jsonl"
            carried = (None, None)
            if args.carry_over:
                try:
                    carried = carry_over(log, target, op, preset, DTYPE[target.family])
                except OpcError as e:
                    print(f"{target.name} {preset}: old best does not carry over: {e}", file=sys.stderr)
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
                if carried[0]:
                    status += f"; old best {carried[0]:,} (x{res.best.cost / carried[0]:.4f}), carried {carried[1]:,}"
            rows.append((target.name, preset, status, f"{res.trials} trials, {res.invalid} invalid, "
                                                      f"{time.perf_counter() - t0:.0f} s"))
    if args.prune_stale:
        for tname in args.targets.split(","):
            target = load_target(tname)
            for op in args.ops.split(","):
                log = Path(args.root) / target.name / f"{op}.jsonl"
                if log.exists():
                    print(f"{log}: {prune_stale(log, target)} stale rows dropped")
    width = max(len(r[1]) for r in rows) if rows else 10
    for t, p, s, extra in rows:
        print(f"{t:<18} {p:<{width}}  {s:<40} {extra}")
    return 0 if all(r[2] != "NO VERIFIED CONFIG" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
