"""Search efficiency on the simulators: xgb vs random at 64, 128 and 256 trials, and the trials
each needs to get within 5 % of the best known config.

Every config a search proposes is measured once on the simulator (timing mode, worker
processes) and memoized, so the seeds of both tuners share measurements: a config gets exactly
the cycles the simulator gave it. The "best known" config is the exhaustive optimum when the
space has at most `--exhaustive` valid configs (every one is measured), otherwise the best
of everything measured, which includes a 768-trial xgb run and all seeds of both tuners
(the table says which). Transfer: xgb on one shape warm-started with 128 records of another
shape of the same op, vs cold.

    python benchmarks/tune_search.py [--seeds 5] [--workers 2] [--cache /tmp/opc_sweep.json] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.tune.cost_model import Sample
from opcompiler.tune.measure import BackendSpec, Measurer
from opcompiler.tune.records import config_id
from opcompiler.tune.search import make_strategy
from opcompiler.tune.space import Space

WORKLOADS = [  # (name, target, op, preset, dtype)
    ("R50 res2 3x3", "ascend-sim", "conv2d", "resnet50.res2_3x3", "float16"),
    ("R50 res3 3x3", "ascend-sim", "conv2d", "resnet50.res3_3x3", "float16"),
    ("R50 res4 3x3", "ascend-sim", "conv2d", "resnet50.res4_3x3", "float16"),
    ("R50 res2 1x1b", "ascend-sim", "conv2d", "resnet50.res2_1x1b", "float16"),
    ("seed matmul", "ascend-sim", "matmul", "seed.matmul_16x256x1024", "float16"),
    ("MiniGo conv3_res", "dsp-sim", "conv2d", "minigo.conv3_res", "float32"),
    ("MiniGo conv1_policy", "dsp-sim", "conv2d", "minigo.conv1_policy", "float32"),
]
BUDGETS = (64, 128, 256)
INVALID = 1e30
TRANSFER = [("R50 res3 3x3", "R50 res2 3x3"), ("R50 res4 3x3", "R50 res3 3x3"),
            ("MiniGo conv1_policy", "MiniGo conv3_res")]  # (tuned, records from)


class Lookup:
    """Simulator cycles per config, measured on first request and memoized (inf = rejected by the build)."""

    def __init__(self, spec: tuple, measurer: Measurer, cache: dict):
        name, tname, op, preset, dtype = spec
        self.target = load_target(tname)
        self.wl = workload(op, preset=preset, dtype=dtype)
        tmpl = get_template(get_op(op).family, self.target.family)
        self.key = f"{name}|{self.target.digest}|{tmpl.name}|{tmpl.version}"
        self.table: dict[str, float] = cache.setdefault(self.key, {})
        self.space = Space.of(self.wl, self.target, tmpl)
        self.m = measurer
        self.measured_here = 0

    def get(self, configs: list[dict]) -> list[float]:
        todo = [c for c in configs if config_id(c) not in self.table]
        for i in range(0, len(todo), 64):
            chunk = todo[i:i + 64]
            for c, r in zip(chunk, self.m.measure(self.wl, chunk)):
                self.table[config_id(c)] = r.cost if math.isfinite(r.cost) else INVALID  # json has no inf
            self.measured_here += len(chunk)
        return [v if v < INVALID else math.inf for v in (self.table[config_id(c)] for c in configs)]

    def sweep(self) -> None:
        valid = [c for c in self.space if self.space.why_invalid(c) is None]
        bar = tqdm(total=len(valid), desc="sweep", unit="cfg", leave=False)
        for i in range(0, len(valid), 256):
            self.get(valid[i:i + 256])
            bar.update(len(valid[i:i + 256]))
        bar.close()

    def n_valid(self) -> int:
        return sum(1 for c in self.space if self.space.why_invalid(c) is None)


def replay(name: str, spec: tuple, table: "Lookup", tuner: str, seed: int, trials: int,
           transfer: list[Sample] = (), batch: int = 8) -> list[float]:
    """Best-so-far cost after each trial of one search run (measured through `table`)."""
    _, tname, op, preset, dtype = spec
    target = load_target(tname)
    wl = workload(op, preset=preset, dtype=dtype)
    tmpl = get_template(get_op(op).family, target.family)
    space = Space.of(wl, target, tmpl)
    strat = make_strategy(tuner, space, seed, transfer=transfer)
    default = tmpl.config(wl, target, None)
    curve, best = [], math.inf
    first = True
    while len(curve) < trials:
        want = min(batch, trials - len(curve))
        cfgs = ([default] + strat.next_batch(want - 1)) if first else strat.next_batch(want)
        first = False
        if not cfgs:
            break
        costs = table.get(cfgs)
        strat.observe(list(zip(cfgs, costs)))
        for cost in costs:
            best = min(best, cost)
            curve.append(best)
    while len(curve) < trials:  # space exhausted: the best stays
        curve.append(best)
    return curve


def trials_to(curve: list[float], target_cost: float) -> int | None:
    for i, c in enumerate(curve):
        if c <= target_cost:
            return i + 1
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--exhaustive", type=int, default=2000, help="sweep spaces with at most this many valid configs")
    ap.add_argument("--long", type=int, default=768, help="trials of the long xgb run (best known, big spaces)")
    ap.add_argument("--cache", default="/tmp/opc_tune_measured.json", help="memoized measurements (reused)")
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cache_path = Path(args.cache)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    wls = [w for w in WORKLOADS if not args.only or w[0] in args.only.split(",")]
    horizon = max(BUDGETS)
    rows, transfer_rows, lookups = [], [], {}
    for spec in wls:
        name = spec[0]
        t0 = time.perf_counter()
        with Measurer(BackendSpec(target=load_target(spec[1])), workers=args.workers, timeout=120) as m:
            lk = lookups[name] = Lookup(spec, m, cache)
            n_valid = lk.n_valid()
            exhaustive = n_valid <= args.exhaustive
            if exhaustive:
                lk.sweep()
            else:
                replay(name, spec, lk, "xgb", 99, args.long)
            curves = {t: [replay(name, spec, lk, t, s, horizon) for s in range(args.seeds)] for t in ("xgb", "random")}
        cache_path.write_text(json.dumps(cache))
        opt = min(v for v in lk.table.values() if v < INVALID)
        row = {"workload": name, "target": spec[1], "valid_configs": n_valid, "best_known_cycles": opt,
               "best_known": "exhaustive" if exhaustive else f"best of {len(lk.table)} measured",
               "measure_s": time.perf_counter() - t0}
        for tuner, cs in curves.items():
            for b in BUDGETS:
                row[f"{tuner}@{b}"] = statistics.mean(c[b - 1] / opt for c in cs)
            hits = [trials_to(c, opt * 1.05) for c in cs]
            row[f"{tuner}_to5%"] = _median_trials(hits, horizon)
            row[f"{tuner}_to5%_runs"] = hits
        rows.append(row)
        print(_fmt_row(row), file=sys.stderr)
    for tuned, source in TRANSFER:
        if tuned not in lookups or source not in lookups:
            continue
        spec = next(w for w in wls if w[0] == tuned)
        src = next(w for w in wls if w[0] == source)
        lk = lookups[tuned]
        with Measurer(BackendSpec(target=lk.target), workers=args.workers, timeout=120) as m:
            lk.m = lookups[source].m = m
            samples = _transfer_samples(src, lookups[source], n=128)
            opt = min(v for v in lk.table.values() if v < INVALID)
            cold = [trials_to(replay(tuned, spec, lk, "xgb", s, horizon), opt * 1.05) for s in range(args.seeds)]
            warm = [trials_to(replay(tuned, spec, lk, "xgb", s, horizon, transfer=samples), opt * 1.05)
                    for s in range(args.seeds)]
        cache_path.write_text(json.dumps(cache))
        transfer_rows.append({"workload": tuned, "records_from": source, "cold_to5%": _median_trials(cold, horizon),
                              "warm_to5%": _median_trials(warm, horizon), "cold_runs": cold, "warm_runs": warm})
    if args.json:
        json.dump({"rows": rows, "transfer": transfer_rows, "seeds": args.seeds}, sys.stdout, indent=1)
        print()
        return 0
    print(f"mean best/best-known over {args.seeds} seeds at 64/128/256 trials; trials to within 5 % of the best "
          f"known = median over seeds (>256 = most seeds never got there)")
    print(f"{'workload':<20} {'valid':>6} {'best known':<22}" + " ".join(f"{t}@{b:<4}" for t in ("xgb", "rnd")
                                                                      for b in BUDGETS)
          + f" {'xgb→5%':>7} {'rnd→5%':>7} {'rnd/xgb':>7}")
    for r in rows:
        print(_fmt_row(r))
    if transfer_rows:
        print("\ntransfer (xgb, trials to within 5 %, median): cold vs warm-started with 128 records of another shape")
        for t in transfer_rows:
            print(f"  {t['workload']:<20} from {t['records_from']:<20} cold {_show(t['cold_to5%']):>6}  "
                  f"warm {_show(t['warm_to5%']):>6}   runs cold {t['cold_runs']} warm {t['warm_runs']}")
    return 0


def _fmt_row(r: dict) -> str:
    x, rn = r["xgb_to5%"], r["random_to5%"]
    ratio = f"{rn / x:.1f}x" if x and rn else (f">{max(BUDGETS) / x:.1f}x" if x else "-")
    return (f"{r['workload']:<20} {r['valid_configs']:>6} {r['best_known']:<22}"
            + " ".join(f"{r[f'{t}@{b}']:>8.3f}" for t in ("xgb", "random") for b in BUDGETS)
            + f" {_show(x):>7} {_show(rn):>7} {ratio:>7}")


def _transfer_samples(src: tuple, table: "Lookup", n: int) -> list[Sample]:
    """What a previous xgb run of `n` trials on the source shape would have left in the log."""
    _, tname, op, preset, dtype = src
    wl = workload(op, preset=preset, dtype=dtype)
    target = load_target(tname)
    space = Space.of(wl, target, get_template(get_op(op).family, target.family))
    strat = make_strategy("xgb", space, 123)
    while len(strat.samples) < n:
        cfgs = strat.next_batch(8)
        if not cfgs:
            break
        strat.observe(list(zip(cfgs, table.get(cfgs))))
    return list(strat.samples)


def _median_trials(hits: list[int | None], horizon: int) -> float | None:
    """Median with misses counted as beyond the horizon; None when most runs missed."""
    vals = sorted(h if h is not None else math.inf for h in hits)
    m = vals[len(vals) // 2]
    return None if math.isinf(m) else m


def _num(x: float | None) -> float:
    return x if x is not None else math.inf


def _show(x: float | None) -> str:
    return f">{max(BUDGETS)}" if x is None else f"{x:.0f}"


if __name__ == "__main__":
    sys.exit(main())
