"""Replay every shipped record's best on the simulator it was measured on: same cycles, or it says which.

    python benchmarks/replay_records.py [--targets ascend-sim,dsp-sim] [--json out.json]

For each target, every workload of the shipped logs (`tuning_logs/<target>/`) whose best verified
record was measured on the target's current description (by digest) is built with that record's
config and timed (`Backend.measure`, timing mode). The table lists the record's cycles, the replay's
and whether they are equal. A refactor that changes no kernel leaves every row equal; the script
exits 1 when any row differs, so it is the check for "every shipped record's best is identical
before and after" (issue 24).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.records import shipped_dir, verified_bests
from opcompiler.target import load_target


def replay(target_name: str) -> list[dict]:
    target = load_target(target_name)
    backend = get_backend(target)
    rows = []
    for key, best in verified_bests(shipped_dir() / target.name, target):
        wl = workload(key["op"], key["params"], dtype=key["dtype"])
        t0 = time.perf_counter()
        try:
            cyc = backend.measure(backend.build(wl, dict(best.config))).cycles
            err = ""
        except Exception as e:  # a record that no longer builds is a difference too
            cyc, err = None, f"{type(e).__name__}: {e}"
        shape = ",".join(f"{k}={v}" for k, v in sorted(key["params"].items()) if k not in ("layout",))
        rows.append({"target": target.name, "op": key["op"], "shape": shape, "config": dict(best.config),
                     "record": int(best.cost), "replay": cyc, "equal": cyc == int(best.cost), "error": err,
                     "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for name in args.targets.split(","):
        got = replay(name.strip())
        rows += got
        print(f"\n{got[0]['target'] if got else name}: {len(got)} shipped bests")
        print(f"{'op':<22} {'shape':<60} {'record':>10} {'replay':>10}  same")
        for r in got:
            print(f"{r['op']:<22} {r['shape'][:60]:<60} {r['record']:>10} {str(r['replay']):>10}  "
                  f"{'yes' if r['equal'] else 'NO ' + r['error'][:60]}")
    diff = [r for r in rows if not r["equal"]]
    print(f"\n{len(rows) - len(diff)} of {len(rows)} shipped bests replay to the recorded cycles"
          + (f"; {len(diff)} differ" if diff else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
