"""dsp-sim timing-mode speed: wall time per tuning candidate (build + measure) for MiniGo
CONV3_RES at batch 768 (goal: 50 ms or less) and at batch 96 (issue 12's goal: a median of 10 ms
or less over random candidates), plus a few other layers.

    python benchmarks/sim_speed_dsp.py          # table
    python benchmarks/sim_speed_dsp.py --json   # rows as JSON

`rows()` is imported by benchmarks/sim_speed.py (shared with ascend-sim). Every conv candidate
takes the one route (TVM's scheduled TIR, lowered by the backend), the FC layer's `algo=fc`
and default `algo=gemm` too. Random candidates are cold: each config is scheduled through TVM
and lowered once; the "TVM alone" row is what the schedule primitives and lowering passes cost
a new config by themselves (the floor under the 10 ms goal on this route).
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time

from tqdm import tqdm

from opcompiler.backend import get_backend
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.template import get_template

GOAL_MS = 50.0
GOAL_B96_MS = 10.0  # issue 12: median per candidate on CONV3_RES at batch 96


def _time(be, wl, cfg) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    k = be.build(wl, cfg)
    t1 = time.perf_counter()
    r = be.measure(k)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, int(r.cycles)


def rows(n_random: int = 24, seed: int = 0) -> list[dict]:
    """One row per candidate kind: the paper's config, the template default, and random valid
    configs from the tuning space (cold: each new micro-kernel signature is scheduled once)."""
    target = load_target("dsp-sim")
    be = get_backend(target)
    out: list[dict] = []
    for op, preset, batch in (("conv2d", "minigo.conv3_res", 768), ("conv2d", "minigo.conv3_res", 96),
                              ("conv2d", "minigo.conv3_init", 768), ("matmul_bias_relu", "minigo.fc1", 768)):
        wl = workload(op, preset=preset, batch=batch)
        tmpl = get_template("conv2d" if op == "conv2d" else "matmul", "dsp")
        cands = [("paper", "paper"), ("default", None), ("w_path=ddr", {"w_path": "ddr"})]
        if op != "conv2d":  # the FC layer's TIR-lowered algorithm (the paper's), beside the default gemm
            cands.append(("algo=fc (TIR)", {**tmpl.paper(wl, target), "algo": "fc"}))
        goal = GOAL_B96_MS if (preset, batch) == ("minigo.conv3_res", 96) else GOAL_MS
        for name, cfg in cands:
            b, m, cyc = _time(be, wl, cfg)
            out.append({"workload": f"{preset} b{batch}", "candidate": name, "build_ms": round(b, 2),
                        "measure_ms": round(m, 2), "total_ms": round(b + m, 2), "sim_cycles": cyc,
                        "goal_ms": goal})
        if preset != "minigo.conv3_res":
            continue
        rng = random.Random(seed)
        times, done = [], 0
        bar = tqdm(total=n_random, desc="random candidates", leave=False, file=sys.stderr)
        while done < n_random:
            cfg = tmpl.random_config(wl, target, rng)
            if tmpl.check(wl, target, cfg) is not None:
                continue
            b, m, _ = _time(be, wl, cfg)
            times.append(b + m)
            done += 1
            bar.update()
        bar.close()
        out.append({"workload": f"{preset} b{batch}", "candidate": f"{n_random} random valid (median)",
                    "build_ms": None, "measure_ms": None, "total_ms": round(statistics.median(times), 2),
                    "max_ms": round(max(times), 2), "sim_cycles": None, "goal_ms": goal})
        if op == "conv2d":
            out.append(_tvm_floor(wl, target, tmpl, n_random, seed, goal, f"{preset} b{batch}"))
    return out


def _tvm_floor(wl, target, tmpl, n: int, seed: int, goal: float, name: str) -> dict:
    """What TVM alone costs a new config, the floor under a cold candidate on this route: the
    conv schedule (its primitives) and the lowering passes, medians over the same random
    configs with the schedule caches cleared."""
    import opcompiler.schedules.dsp.direct as ts
    from opcompiler.backend.dsp.lower.direct import lowered

    rng = random.Random(seed)
    sched, passes = [], []
    while len(sched) < n:
        cfg = tmpl.random_config(wl, target, rng)
        if tmpl.check(wl, target, cfg) is not None:
            continue
        ts._STAGED.clear()
        t0 = time.perf_counter()
        sch = ts.conv_schedule(wl, target, tmpl.config(wl, target, cfg))
        t1 = time.perf_counter()
        lowered(sch)
        sched.append((t1 - t0) * 1e3)
        passes.append((time.perf_counter() - t1) * 1e3)
    s, p = statistics.median(sched), statistics.median(passes)
    return {"workload": name, "candidate": "TVM alone: schedule + passes", "build_ms": round(s + p, 2),
            "measure_ms": None, "total_ms": round(s + p, 2), "sim_cycles": None, "goal_ms": goal,
            "note": f"schedule {s:.1f} + passes {p:.1f} ms (median)"}


def main() -> None:
    rs = rows()
    if "--json" in sys.argv:
        print(json.dumps(rs, indent=1))
        return
    print(f"{'workload':<26}{'candidate':<30}{'build ms':>10}{'measure ms':>12}{'total ms':>10}  vs goal")
    for r in rs:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = r["total_ms"] / r["goal_ms"]
        print(f"{r['workload']:<26}{r['candidate']:<30}{fmt(r['build_ms']):>10}{fmt(r['measure_ms']):>12}"
              f"{r['total_ms']:>10.1f}  {ratio:.2f}x" + (f" (max {r['max_ms']:.1f})" if "max_ms" in r else "")
              + (f" ({r['note']})" if "note" in r else ""))


if __name__ == "__main__":
    main()
