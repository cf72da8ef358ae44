"""dsp-sim: the shipped records' best configs measured again, route by route.

Every template has one route now (no `lowering` knob): each shipped best of conv2d and matmul is
measured again and set against its stored cycles (the "direct" column is the stored figure,
measured when the record was made). The table shows both cycle counts, their ratio or why the
config is refused, and the wall time of build + measure.

Before the direct conv emitter was retired this script compared it with the TIR route on the
20 shipped conv2d bests: all within 1 % (worst +0.10 %), median 4.9 ms vs 32 ms per candidate.

    python benchmarks/tir_parity_dsp.py [--only conv2d|matmul] [--limit N] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.target import load_target
from opcompiler.tune.records import Record, shipped_dir
from opcompiler.workload import Workload


def best_records(op: str) -> list[Record]:
    path = shipped_dir() / "ft-m7032-dsp-sim" / f"{op}.jsonl"
    best: dict[str, Record] = {}
    for line in path.read_text().splitlines():
        r = Record.from_obj(json.loads(line))
        if not r.valid:
            continue
        k = json.dumps(r.key, sort_keys=True)
        if k not in best or r.cycles < best[k].cycles:
            best[k] = r
    return list(best.values())


def measure(be, wl, cfg) -> tuple[int | None, float, str]:
    t0 = time.perf_counter()
    try:
        cyc = int(be.measure(be.build(wl, cfg)).cycles)
        why = ""
    except OpcError as e:
        cyc, why = None, str(e).splitlines()[0]
    except Exception as e:  # a crash of one route is a finding, not the end of the table
        cyc, why = None, f"CRASH {type(e).__name__}: {e}".splitlines()[0]
    return cyc, (time.perf_counter() - t0) * 1e3, why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("conv2d", "matmul"))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    target = load_target("dsp-sim")
    be = get_backend(target)
    rows = []
    for op in ("conv2d", "matmul"):
        if a.only and op != a.only:
            continue
        recs = best_records(op)
        for r in recs[: a.limit or None]:
            key = r.key
            wl = Workload.make(key["op"], key["params"], key["dtype"])
            cfg = dict(r.config)
            d, dms, dwhy = r.cycles, 0.0, ""  # one route: the stored figure against a fresh measurement
            t, tms, twhy = measure(be, wl, cfg)
            rows.append({"op": key["op"], "params": key["params"], "shipped": r.cycles, "direct": d, "tir": t,
                         "ratio": round(t / d, 4) if t and d else None, "why": twhy or dwhy,
                         "direct_ms": round(dms, 1), "tir_ms": round(tms, 1)})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'workload':58s} {'shipped':>10s} {'direct':>10s} {'tir':>10s} {'tir/dir':>8s} {'dir ms':>7s} {'tir ms':>7s}")
    for x in rows:
        p = x["params"]
        name = x["op"] + " " + ",".join(f"{k}={v}" for k, v in p.items() if k in ("n", "c", "h", "w", "k", "r", "m"))
        print(f"{name[:58]:58s} {x['shipped']:>10d} {x['direct'] or '-':>10} {x['tir'] or '-':>10} "
              f"{x['ratio'] or '-':>8} {x['direct_ms']:>7} {x['tir_ms']:>7}" + (f"  {x['why']}" if x["why"] else ""))
    cov = [x for x in rows if x["ratio"]]
    print(f"\nTIR route covers {len(cov)}/{len(rows)} shipped bests; "
          + (f"tir/direct cycles: worst {max(x['ratio'] for x in cov):.4f}, best {min(x['ratio'] for x in cov):.4f}; "
             f"median ms per candidate direct {statistics.median(x['direct_ms'] for x in cov):.1f}, "
             f"tir {statistics.median(x['tir_ms'] for x in cov):.1f}" if cov else ""))


if __name__ == "__main__":
    main()
