"""Train the models behind the derived defaults (`opcompiler.prior`).

Maintainer command, like make_tuning_logs.py. Two steps:

    python benchmarks/train_default_model.py collect --target ascend-sim --family conv2d --workloads 80
    python benchmarks/train_default_model.py fit --target ascend-sim --family conv2d

`collect` draws synthetic workloads (never one of the shipped records' shapes, which
`benchmarks/default_quality.py` keeps as the held-out set), and for each one times up to
`--configs` random configs of the template's default candidate set in the simulator (timing
mode). Rows are appended to `benchmarks/default_model_data/<target>.<template>.jsonl`, so a second
run adds workloads. `fit` trains XGBoost on log2(cycles) over those rows and writes
`opcompiler/default_models/<family>.<template>.json`, printing the held-out check: for each
shipped workload, the predicted best's cycles against the best of the measured candidates.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler import prior
from opcompiler.tune.records import shipped_dir, verified_bests

DATA = Path(__file__).resolve().parent / "default_model_data"
OPS = {"conv2d": ("conv2d", "conv2d", "conv2d_bias_relu", "conv2d_bn_relu", "conv2d_bn"),
       "matmul": ("matmul", "matmul", "matmul_bias_relu", "matmul_bias")}


def shipped_shapes(target) -> set:
    return {json.dumps(key["params"], sort_keys=True) for key, _ in verified_bests(shipped_dir() / target.name, target)}


def draw(family: str, rng: random.Random) -> dict:
    if family == "conv2d":
        r = rng.choice((1, 1, 3, 3, 3, 5, 7))
        hw = rng.choice((7, 8, 10, 13, 14, 17, 19, 24, 28, 31, 35, 48, 56, 73, 112, 149, 224))
        return {"n": rng.choice((1, 1, 1, 2, 4, 8, 16, 32, 64, 96)), "c": rng.choice(
                    (3, 13, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 2048)),
                "h": hw, "w": rng.choice((hw, hw, hw + 3)), "k": rng.choice(
                    (1, 2, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1000, 1024, 2048)),
                "r": r, "s": r, "stride": rng.choice((1, 1, 2)), "pad": r // 2}
    return {"m": rng.choice((1, 2, 4, 8, 16, 24, 32, 64, 96, 128, 256, 384, 512, 1024, 2048, 4096)),
            "k": rng.choice((16, 27, 64, 100, 128, 256, 361, 500, 512, 768, 1024, 2048, 4096, 9216)),
            "n": rng.choice((1, 2, 10, 16, 64, 100, 128, 256, 500, 512, 1000, 1024, 2048, 4096))}


def collect(args) -> int:
    target = load_target(args.target)
    backend = get_backend(target)
    rng = random.Random(args.seed)
    held_out = shipped_shapes(target)
    tmpl = get_template(args.family, target.family)
    out = DATA / f"{target.family}.{tmpl.name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done, t0 = 0, time.time()
    while done < args.workloads:
        op = rng.choice(OPS[args.family])
        try:
            wl = workload(op, draw(args.family, rng), dtype="float16")
        except OpcError:
            continue
        flops = get_op(op).flops(wl)
        if json.dumps(dict(wl.params), sort_keys=True) in held_out or not args.min_flops <= flops <= args.max_flops:
            continue
        cands = [c for c in prior.candidates(tmpl, wl, target) if tmpl.check(wl, target, c) is None
                 and tmpl.features(wl, target, c).get("tiles", 0) * tmpl.features(wl, target, c).get("k_steps", 1)
                 <= args.max_steps]  # the simulator's time grows with the tile steps it emits
        if len(cands) < 2:
            continue
        rows = []
        for cfg in rng.sample(cands, min(args.configs, len(cands))):
            try:
                cyc = backend.measure(backend.build(wl, cfg)).cycles
            except OpcError:
                continue
            rows.append({"op": op, "params": dict(wl.params), "dtype": wl.dtype, "target": target.name,
                         "digest": target.digest, "template": tmpl.name, "version": tmpl.version,
                         "config": cfg, "cycles": int(cyc)})
        with open(out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        done += 1
        print(f"[{done}/{args.workloads}] {op} {dict(wl.params)}: {len(rows)} configs "
              f"({time.time() - t0:.0f} s)", flush=True)
    return 0


def fit(args) -> int:
    import numpy as np
    import xgboost as xgb

    target = load_target(args.target)
    tmpl = get_template(args.family, target.family)
    src = DATA / f"{target.family}.{tmpl.name}.jsonl"
    data = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    data = [d for d in data if d["template"] == tmpl.name and d["version"] == tmpl.version]
    feats, ys, groups = [], [], []
    for d in data:
        wl = workload(d["op"], d["params"], dtype=d["dtype"])
        feats.append(prior.feature_dict(tmpl, wl, target, d["config"]))
        ys.append(math.log2(d["cycles"]) - (math.log2(get_op(d["op"]).flops(wl)) if args.per_flop else 0.0))
        groups.append(json.dumps([d["op"], d["params"]], sort_keys=True))
    columns = sorted({k for f in feats for k in f})
    x = prior.rows(columns, feats)
    # max_depth 5: the lowest 5-fold leave-workload-out regret of depths 3-9 on the conv data (1.060x)
    params = {"objective": "reg:squarederror", "max_depth": 5, "eta": 0.08, "subsample": 0.9,
              "colsample_bytree": 0.9, "min_child_weight": 2, "nthread": 2, "seed": 0, "verbosity": 0}
    if args.cv:
        print(f"5-fold leave-workload-out regret (predicted best / best measured of each held-out workload): "
              f"{_cv(params, args.rounds, x, np.asarray(ys), np.asarray(groups))}")
    booster = xgb.train(params, xgb.DMatrix(x, label=np.asarray(ys), missing=np.nan), num_boost_round=args.rounds)
    model = {"format": prior.FORMAT, "target": target.name, "template": tmpl.name, "template_version": tmpl.version,
             "label": prior.LABEL_PER_FLOP if args.per_flop else prior.LABEL_CYCLES,
             "columns": columns, "trained_on": {"rows": len(data), "workloads": len(set(groups))},
             "model": booster.save_raw("json").decode()}
    path = prior.model_path(target, tmpl.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model))
    print(f"{path}: {len(data)} rows of {len(set(groups))} synthetic workloads, {len(columns)} features, "
          f"{path.stat().st_size // 1024} KiB")
    prior._load.cache_clear()
    prior._RANKED.clear()
    return 0


def _cv(params: dict, rounds: int, x, y, groups) -> str:
    import numpy as np
    import xgboost as xgb

    names = sorted(set(groups))
    random.Random(0).shuffle(names)
    regrets = []
    for i in range(5):
        held = np.isin(groups, names[i::5])
        b = xgb.train(params, xgb.DMatrix(x[~held], label=y[~held], missing=np.nan), num_boost_round=rounds)
        pred = b.inplace_predict(x[held], missing=np.nan)
        for g in names[i::5]:
            m = groups[held] == g
            regrets.append(2.0 ** (y[held][m][np.argmin(pred[m])] - y[held][m].min()))
    r = np.asarray(regrets)
    return f"geometric mean {math.exp(np.log(r).mean()):.3f}x, worst {r.max():.2f}x over {len(r)} workloads"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--target", default="ascend-sim")
    c.add_argument("--family", choices=sorted(OPS), default="conv2d")
    c.add_argument("--workloads", type=int, default=60)
    c.add_argument("--configs", type=int, default=40)
    c.add_argument("--max-flops", type=float, default=8e9)
    c.add_argument("--min-flops", type=float, default=0)
    c.add_argument("--max-steps", type=int, default=1 << 30, help="skip candidates of more tile x k steps")
    c.add_argument("--seed", type=int, default=0)
    f = sub.add_parser("fit")
    f.add_argument("--target", default="ascend-sim")
    f.add_argument("--family", choices=sorted(OPS), default="conv2d")
    f.add_argument("--rounds", type=int, default=300)
    f.add_argument("--cv", action="store_true", help="print the 5-fold leave-workload-out regret first")
    f.add_argument("--per-flop", action="store_true",
                   help="learn log2(cycles / FLOPs) instead of log2(cycles): time per unit of work, which carries "
                        "to shapes larger than the training set's (conv2d's shipped model)")
    args = ap.parse_args()
    return collect(args) if args.cmd == "collect" else fit(args)


if __name__ == "__main__":
    sys.exit(main())
