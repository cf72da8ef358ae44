"""Speed of the simulators themselves (not of the simulated kernels).

For the ResNet-50 3x3 conv presets at batch 1 and 32 on ascend-sim (fp16, template default):
  build_ms       template + program emission for core 0 (what every tuning candidate pays)
  timing_ms      backend.measure: the timing model's pipe replay (ascend timing.py), no arithmetic
  candidate_ms   build + timing: the cost of one tuning candidate (goal <= 50 ms at batch 1)
  functional_s   backend.run: every core's program executed on simulated memories
                 (goal <= 30 s at batch 1; batch 32 is run only with --functional-all)
Plus conv2d res2_3x3 b1 at fixed tiles, first build and cached, and the median over random
valid configs drawn as a tuner draws them (issue 12's goal: 10 ms a candidate). Every conv is
the TVM implicit-GEMM schedule, lowered and its instruction trace evaluated in vectorised form,
so the first build of a tile shape pays schedule + lowering + trace, later candidates of the same
tile shape hit the per-process trace cache. (The retired TIK-style emitter measured 2.0 ms per
candidate: benchmarks/tir_parity_output.txt.)
If benchmarks/sim_speed_dsp.py defines rows() -> list[dict], its rows are printed too.

    python benchmarks/sim_speed.py [--repeat 5] [--functional-all] [--json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

PRESETS = ("resnet50.res2_3x3", "resnet50.res3_3x3", "resnet50.res4_3x3", "resnet50.res5_3x3")
GOAL_CANDIDATE_MS = 50.0
GOAL_FUNCTIONAL_S = 30.0
GOAL_RANDOM_MS = 10.0  # issue 12: median per random candidate on res2_3x3 b1


def _time(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def ascend_rows(repeat: int, functional_all: bool) -> list[dict]:
    from opcompiler.backend import get_backend
    from opcompiler.ops import get_op, workload
    from opcompiler.target import load_target

    backend = get_backend(load_target("ascend-sim"))
    rows = []
    for preset in PRESETS:
        for batch in (1, 32):
            wl = workload("conv2d", preset=preset, batch=batch, dtype="float16")
            build_s, kern = _time(lambda: backend.build(wl), repeat)
            meas_s, res = _time(lambda: backend.measure(kern), repeat)
            row = {"sim": "ascend-sim", "kernel": f"conv2d {preset} b{batch}", "instructions": kern.info[
                "instructions_core0"], "build_ms": build_s * 1e3, "timing_ms": meas_s * 1e3,
                "candidate_ms": (build_s + meas_s) * 1e3, "sim_cycles": res.cycles,
                "percent_of_peak": res.metrics["percent_of_peak"], "functional_s": None}
            if batch == 1 or functional_all:
                inputs = get_op(wl.op).make_inputs(wl)
                fun_s, fres = _time(lambda: backend.run(kern, inputs), 1)
                row["functional_s"] = fun_s
                row["same_cycles"] = fres.cycles == res.cycles
            rows.append(row)
    rows += tir_rows(backend, repeat)
    return rows


TIR_TILES = {"m_tile": 128, "k_tile": 64, "n_tile": 64, "double_buffer": 1, "w_resident": 0}


def random_row(backend, n: int = 24, seed: int = 1) -> dict:
    """res2_3x3 b1 over `n` random valid configs as a tuner draws them (every knob random, a fresh
    trace cache): the median cost of one candidate, build + timing mode (issue 12's goal: 10 ms)."""
    import random

    import opcompiler.backend.ascend.lower.cube as tl
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    from opcompiler.template import get_template

    target = load_target("ascend-sim")
    tmpl = get_template("conv2d", "ascend")
    wl = workload("conv2d", preset="resnet50.res2_3x3", batch=1, dtype="float16")
    tl.TRACES.clear()
    rng, times = random.Random(seed), []
    while len(times) < n:
        cfg = tmpl.config(wl, target, tmpl.random_config(wl, target, rng))
        if tmpl.check(wl, target, cfg) is None:
            t0 = time.perf_counter()
            backend.measure(backend.build(wl, cfg))
            times.append(time.perf_counter() - t0)
    return {"sim": "ascend-sim", "kernel": f"conv2d resnet50.res2_3x3 b1, {n} random valid (median)",
            "candidate_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3}


def tir_rows(backend, repeat: int) -> list[dict]:
    """res2_3x3 b1 at fixed tiles: the first build of the tile shape and a cached one; then
    random candidates (`random_row`)."""
    import opcompiler.backend.ascend.lower.cube as tl
    from opcompiler.ops import get_op, workload

    wl = workload("conv2d", preset="resnet50.res2_3x3", batch=1, dtype="float16")
    rows = []
    for label, cold in (("first build", True), ("cached", False)):
        cfg = dict(TIR_TILES)
        if cold:
            tl.TRACES.clear()
        build_s, kern = _time(lambda cfg=cfg: backend.build(wl, cfg), 1 if cold else repeat)
        meas_s, res = _time(lambda kern=kern: backend.measure(kern), repeat)
        inputs = get_op(wl.op).make_inputs(wl)
        fun_s, fres = _time(lambda kern=kern, inputs=inputs: backend.run(kern, inputs), 1)
        rows.append({"sim": "ascend-sim", "kernel": f"conv2d resnet50.res2_3x3 b1 {label}",
                     "instructions": kern.info["instructions_core0"], "build_ms": build_s * 1e3,
                     "timing_ms": meas_s * 1e3, "candidate_ms": (build_s + meas_s) * 1e3, "sim_cycles": res.cycles,
                     "percent_of_peak": res.metrics["percent_of_peak"], "functional_s": fun_s,
                     "same_cycles": fres.cycles == res.cycles})
    rows.append(random_row(backend))
    return rows


def dsp_rows() -> list[dict]:
    path = Path(__file__).with_name("sim_speed_dsp.py")
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("sim_speed_dsp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return list(mod.rows()) if hasattr(mod, "rows") else []


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _table(rows: list[dict], cols: list[str]) -> None:
    table = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timing repeats (median)")
    ap.add_argument("--functional-all", action="store_true", help="also run functional mode at batch 32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = ascend_rows(args.repeat, args.functional_all)
    b1 = [r for r in rows if r["kernel"].endswith("b1")]  # template defaults (the TIR rows end otherwise)
    summary = {"ascend_candidate_ms_max_b1": max(r["candidate_ms"] for r in b1),
               "ascend_functional_s_max_b1": max(r["functional_s"] for r in b1),
               "goal_candidate_ms": GOAL_CANDIDATE_MS, "goal_functional_s": GOAL_FUNCTIONAL_S}
    summary["candidate_ratio_to_goal"] = summary["ascend_candidate_ms_max_b1"] / GOAL_CANDIDATE_MS
    summary["functional_ratio_to_goal"] = summary["ascend_functional_s_max_b1"] / GOAL_FUNCTIONAL_S
    tir = {r["kernel"].split(" b1 ")[1]: r for r in rows if " b1 " in r["kernel"]}
    summary["first_build_over_cached_candidate"] = tir["first build"]["candidate_ms"] / tir["cached"]["candidate_ms"]
    summary["random_candidate_ms_median_b1"] = next(r["candidate_ms"] for r in rows if "random" in r["kernel"])
    summary["goal_random_candidate_ms"] = GOAL_RANDOM_MS
    dsp = dsp_rows()
    if args.json:
        json.dump({"rows": rows, "dsp_rows": dsp, "summary": summary}, sys.stdout, indent=1)
        print()
        return 0
    cols = ["kernel", "instructions", "build_ms", "timing_ms", "candidate_ms", "functional_s", "sim_cycles",
            "percent_of_peak"]
    print("ascend-sim (median of --repeat runs; functional mode once)")
    _table(rows, cols)
    print()
    for k, v in summary.items():
        print(f"{k}: {_fmt(v)}")
    if dsp:
        print("\ndsp-sim (rows from benchmarks/sim_speed_dsp.py)")
        _table(dsp, list(dict.fromkeys(k for r in dsp for k in r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
