"""The long profile of the property tests: every operator in the catalogue on cpu, ascend-sim
and dsp-sim, on valid shapes and configs drawn by hypothesis (`tests/props/cases.py`), each run
with values checked against numpy. Writes what it found.

    python benchmarks/fuzz.py [--cases 1000] [--hours H] [--seed 0] [--ops a,b] [--targets t,u]
                              [--json out.json]

It goes round the (op, target) pairs, `--chunk` cases of each per round (a new seed each round),
until `--cases` cases have run or `--hours` have passed. A case that fails (an internal error, a
wrong value, a refusal no limit declares: `cases.problem`) stops its pair for that round, and
hypothesis shrinks it to a minimal case, printed with the command that reproduces it.

The table: per operator, cases run, how many were drawn at an odd size or at a boundary size
(1, or just around 8/16/32/64/128), and the verdicts: ok, refused (a drawn config that does not
fit, or a declared limit), wrong, internal. Exit 1 when anything failed.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from props.cases import TARGETS, Case, Verdict, case, problem, run_case  # noqa: E402


class Found(Exception):
    """A failing case (hypothesis shrinks what raises this)."""


def _pair(op: str, target: str, n: int, seed: int, log: list) -> tuple[Case, Verdict, str] | None:
    """Run up to `n` cases of (op, target); append (case, verdict) to `log`. The minimal failing
    case, its verdict and the problem, or None."""
    from hypothesis import HealthCheck, given, seed as hseed, settings

    last: list = []

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(case(op, target))
    def prop(c: Case) -> None:
        v = run_case(c, seed=seed)
        log.append((c, v))
        why = problem(c, v)
        if why is not None:
            last[:] = [c, v, why]
            raise Found(why)

    try:
        prop()
    except Found:
        return tuple(last)  # the last raise is the shrunk case's
    except Exception as e:  # hypothesis itself (e.g. no valid case could be drawn)
        print(f"  {op} on {target}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    from opcompiler.ops.index import OPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000, help="stop after this many cases (default 1000)")
    ap.add_argument("--hours", type=float, default=None, help="stop after this long (default: no limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=4, help="cases per (op, target) per round (default 4)")
    ap.add_argument("--ops", default=",".join(sorted(OPS)))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--json", default=None, help="write the table, the failures and every case here")
    a = ap.parse_args(argv)
    ops, targets = a.ops.split(","), a.targets.split(",")
    from tqdm import tqdm

    deadline = time.time() + a.hours * 3600 if a.hours else None
    log: list[tuple[Case, Verdict]] = []
    found: dict[tuple[str, str], tuple[Case, Verdict, str]] = {}
    t0 = time.time()
    bar = tqdm(total=a.cases, unit="case", desc="fuzz")
    rnd = 0
    while len(log) < a.cases and (deadline is None or time.time() < deadline):
        for op in ops:
            for target in targets:
                if len(log) >= a.cases or (deadline is not None and time.time() >= deadline):
                    break
                before = len(log)
                hit = _pair(op, target, a.chunk, a.seed * 100003 + rnd, log)
                bar.update(min(len(log), a.cases) - min(before, a.cases))
                if hit is not None and (op, target) not in found:
                    found[(op, target)] = hit
                    tqdm.write(f"FOUND {op} on {target}: {hit[2]}")
        rnd += 1
    bar.close()
    wall = time.time() - t0

    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for c, v in log:
        r = rows[c.op]
        r["cases"] += 1
        r[v.kind] += 1
        r["odd"] += c.odd()
        r["boundary"] += c.boundary()
        r["config"] += c.config is not None
        r[c.target] += 1
    cols = ("cases", "cpu", "ascend-sim", "dsp-sim", "odd", "boundary", "config", "ok", "refused", "wrong", "internal")
    print(f"\n{'op':<22}" + "".join(f"{k:>11}" for k in cols))
    total = collections.Counter()
    for op in sorted(rows):
        total.update(rows[op])
        print(f"{op:<22}" + "".join(f"{rows[op][k]:>11}" for k in cols))
    print(f"{'total':<22}" + "".join(f"{total[k]:>11}" for k in cols))
    bad = sum(1 for c, v in log if problem(c, v) is not None)
    print(f"\n{len(log)} cases in {wall / 60:.1f} min (seed {a.seed}); {total['wrong']} wrong, {total['internal']} "
          f"internal errors, {bad} failing cases in all (shrinking included); {len(found)} (op, target) pairs failed")
    for (op, target), (c, v, why) in sorted(found.items()):
        print(f"\n  minimal failing case, {op} on {target}:\n    {why.replace(chr(10), chr(10) + '    ')}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "seed": a.seed, "cases": len(log), "seconds": wall, "table": {k: dict(v) for k, v in rows.items()},
            "failures": [{"op": op, "target": t, "command": c.cli(), "verdict": v.kind, "problem": why}
                         for (op, t), (c, v, why) in sorted(found.items())],
            "log": [{"op": c.op, "target": c.target, "params": c.params, "dtype": c.dtype, "config": c.config,
                     "verdict": v.kind, "cycles": v.cycles} for c, v in log]}, indent=1, default=str))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
