"""The shipped ascend910-sim records on the one TVM route (issue 12).

Since ascend.matmul v2 / ascend.conv2d v2 there is no `lowering` knob: this script measures each
shipped best's config again and sets it against the stored cycles; `--timing` times a candidate
(new tiles, cached trace). Before the retirement (at 55048fa) it built every best twice,
`lowering="tik"` and `lowering="tir"`; that run's output is kept in
benchmarks/tir_parity_output.txt (TIR equal or better on 25 of 25, none slower on 250 random
configs). The columns below: the record's cycles, today's, and the ratio. Prints one row per workload (record cycles, direct, TIR or why the
TIR route refuses the config, TIR / direct), the coverage, the worst ratio, whether today's
best on the record's own config is within 1 % of the record, and the median TIR
build+measure time per candidate (every candidate here has its own tiles, so each is a cold
TVM schedule + compile + trace; the intrinsics are registered once per process).

    python benchmarks/tir_parity.py [--only conv2d|matmul|SUBSTRING] [--limit N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tuning_logs" / "ascend910-sim"


def best_records(families: list[str]) -> list[dict]:
    best: dict[str, dict] = {}
    for fam in families:
        for line in (LOGS / f"{fam}.jsonl").read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("status") != "ok":
                continue
            key = rec["key"]
            wk = json.dumps([key["op"], key["params"], key["dtype"]], sort_keys=True)
            rank = (not rec.get("verified"), rec["cycles"])
            if wk not in best or rank < (not best[wk].get("verified"), best[wk]["cycles"]):
                best[wk] = rec
    return list(best.values())


def label(rec: dict) -> str:
    p = rec["key"]["params"]
    drop = {"layout", "groups", "dilation", "trans_a", "trans_b"}
    return rec["key"]["op"] + " " + ",".join(f"{k}={v}" for k, v in sorted(p.items())
                                             if k not in drop or v not in (1, 0, "NCHW"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="conv2d, matmul, or a substring of the workload label")
    ap.add_argument("--limit", type=int, default=0, help="at most this many workloads")
    ap.add_argument("--timing", action="store_true", help="only time build+measure per candidate on "
                    "resnet50.res2_3x3 batch 1 fp16, both routes")
    args = ap.parse_args(argv)
    if args.timing:
        return timing()

    from opcompiler.backend import get_backend
    from opcompiler.errors import OpcError
    from opcompiler.target import load_target
    from opcompiler.workload import Workload

    target = load_target("ascend-sim")
    backend = get_backend(target)
    fams = [f for f in ("matmul", "conv2d") if args.only in ("", f)] or ["matmul", "conv2d"]
    recs = [r for r in best_records(fams) if args.only in ("", "matmul", "conv2d") or args.only in label(r)]
    if args.limit:
        recs = recs[:args.limit]

    rows, tir_times = [], []
    for rec in recs:
        key = rec["key"]
        wl = Workload.make(key["op"], key["params"], key["dtype"])
        cfg = dict(rec["config"])
        row = {"workload": label(rec), "record": rec["cycles"]}
        row["direct"] = rec["cycles"]  # the stored figure (the regenerated records were made on this route)
        t0 = time.perf_counter()
        try:
            row["tir"] = backend.measure(backend.build(wl, cfg)).cycles
            tir_times.append(time.perf_counter() - t0)
        except OpcError as e:
            row["tir"] = str(e).splitlines()[0]
        ok = isinstance(row["tir"], int)
        row["ratio"] = row["tir"] / row["direct"] if ok else None
        rows.append(row)
        t = row["tir"] if ok else "refused: " + str(row["tir"])[:90]
        r = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        print(f"{row['workload'][:70]:70s} record {row['record']:>6}  today {t}  ratio {r}", flush=True)

    covered = [r for r in rows if r["ratio"] is not None]
    print()
    print(f"workloads: {len(rows)}; built {len(covered)}; refused {len(rows) - len(covered)}")
    drift = [r for r in rows if r["ratio"] is None or abs(r["ratio"] - 1) > 0.01]
    print(f"record's config today within 1 % of the record: {len(rows) - len(drift)} of {len(rows)}"
          + "".join(f"\n  drift: {r['workload']}: record {r['record']} today {r['tir']}" for r in drift))
    if tir_times:
        print(f"build+measure per candidate (cold tiles): median {1e3 * statistics.median(tir_times):.1f} ms "
              f"over {len(tir_times)} (min {1e3 * min(tir_times):.1f}, max {1e3 * max(tir_times):.1f})")
    return 0


def timing() -> int:
    """build+measure (timing mode) per candidate on res2_3x3 b1 fp16: every TIR-valid tile
    config of the space with double_buffer=1, block_dim=32; TIR cold (its own tiles: schedule,
    compile, trace; intrinsics parsed once per process, the first candidate pays that) and TIR
    with the trace cached (same tiles, other knobs). The retired direct route took 2.0 ms."""
    from opcompiler.backend import get_backend
    from opcompiler.backend.ascend.lower import cube
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    from opcompiler.template import get_template

    target = load_target("ascend-sim")
    backend = get_backend(target)
    tmpl = get_template("conv2d", "ascend")
    wl = workload("conv2d", preset="resnet50.res2_3x3", batch=1, dtype="float16")
    sp = {k.name: k.values for k in tmpl.space(wl, target)}
    cfgs = []
    for mt in sp["m_tile"]:
        for kt in sp["k_tile"]:
            for nt in sp["n_tile"]:
                c = tmpl.config(wl, target, {"m_tile": mt, "k_tile": kt, "n_tile": nt, "double_buffer": 1,
                                             "block_dim": 32, "w_resident": 0})
                if tmpl.check(wl, target, c) is None:
                    cfgs.append(c)
    out: dict[str, list[float]] = {"tir cold": [], "tir cached trace": []}
    for c in cfgs:
        for label, cfg in (("tir cold", c), ("tir cached trace", {**c, "block_dim": 16})):
            if tmpl.check(wl, target, cfg) is not None:
                continue
            t0 = time.perf_counter()
            backend.measure(backend.build(wl, cfg))
            out[label].append(time.perf_counter() - t0)
    # candidates as a tuner draws them (every knob random), in a fresh trace cache
    import random

    cube.TRACES.clear()
    rng, drawn = random.Random(1), []
    while len(drawn) < 200:
        c = tmpl.config(wl, target, tmpl.random_config(wl, target, rng))
        if tmpl.check(wl, target, c) is None:
            t0 = time.perf_counter()
            backend.measure(backend.build(wl, c))
            drawn.append(time.perf_counter() - t0)
    out["tir, 200 random valid configs"] = drawn
    print(f"conv2d resnet50.res2_3x3 b1 fp16 on {target.name}: {len(cfgs)} TIR-valid tile configs")
    for label, ts in out.items():
        print(f"  {label:30s} median {1e3 * statistics.median(ts):7.1f} ms  min {1e3 * min(ts):7.1f}  "
              f"max {1e3 * max(ts):7.1f}  (n={len(ts)})")
    print(f"  traces cached in this process: {len(cube.TRACES)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
