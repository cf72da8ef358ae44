"""Seed 000's single-operator study (its §4.4 and §5.3) on ascend-sim: FC, conv and RNN over a
parameter grid, forward pass, fp16, timing mode, each kernel with its template's derived default
config (no tuning). It reports

  * how many combinations fit the 910's 32 GB of HBM (Table 4's analogue): a point fits when its
    input, weight and output tensors plus any GM workspace fit the target file's off-chip
    capacity (the rule ascend-sim's `build` enforces; the fused templates use no GM workspace, the
    op-by-op RNN keeps its gate projection and the steps' h in GM);
  * peak FLOPS utilisation per operator (max and median over the grid; percent of the target's
    fp16 cube peak, 32 cores x 8192 FLOP/cycle at 1 GHz = 262 TFLOPS) beside the paper's
    (FC 82 %, conv 84.7 % on the real chip; `opcompiler/calibration/published.json`);
  * the linear-regression weights of TFLOPS on each standardised parameter (numpy least squares
    with an intercept), their signs beside Fig. 8's (FC: input, output, batch all positive; RNN:
    hidden and batch positive, seqlen negative; the text gives no signs for conv);
  * a roofline (Fig. 9's analogue, `roofline.png` in --out): FC, conv, the fused LSTM cell (the
    `lstm` op's one kernel) and the op-by-op RNN (the kernels `opcompiler.ops.opbyop.steps` lists:
    the input-projection GEMM once, then per step the h R^T matmul and the element-wise gate
    kernels, every intermediate through GM: seed 000 §5.3.3).

The grids (the paper lists only conv's, Table 2; all values multiples of 8 as the paper asks):

    conv  243 = batch {128, 256, 512} x input size {112, 224, 336} x in channels {32, 64, 128}
                x out channels {64, 128, 256} x filter {1, 3, 5}; stride 1, "same" padding, NCHW
    FC    192 = batch {16 .. 2048, x2: 8 values} x input {512, 1024, 2048, 4096}
                x output {256 .. 8192, x2: 6 values}              (op matmul: batch x input -> output)
    RNN   144 = hidden {128, 256, 512, 1024} x batch {16 .. 512, x2: 6 values}
                x seqlen {16 .. 512, x2: 6 values}                (op lstm: t=seqlen, b=batch, i=h=hidden)

Cost: timing mode builds the kernel's whole instruction stream, so a conv with the large tiles of
Table 2 and a derived config of small tiles costs minutes and gigabytes (batch 128, 224x224,
128 -> 256 channels, 3x3: 196 s, 12 GB). Such a point is measured at two small batches with the
full shape's config and extrapolated linearly in the tiles per core (each core's tiles are the
same work; `method` says which points were); the LSTM cell likewise in the step count past 64
steps (every step is the same work). `--validate N` measures N cheap points both ways. A conv
whose smallest reduced build still has more than `--max-units` tiles x k steps per core (150,000,
about 4 GB of simulator memory) is skipped and listed.

    python benchmarks/seed000_ops.py --quick              # a stratified subset (36 conv, 32 FC, 24 RNN)
    python benchmarks/seed000_ops.py --full --jobs 2      # all 579 points (long: see docs/fidelity.md)
    python benchmarks/seed000_ops.py --quick --json       # one JSON object (the summary and every point)
    options: --out DIR (results cache results.jsonl and roofline.png; default $TMPDIR/seed000_out),
             --ops fc,conv,rnn, --no-plot, --validate N, --max-units N
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

DTYPE = "float16"
TARGET = "ascend-sim"

# --- the grids ----------------------------------------------------------------------------------

GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
    "conv": {"batch": (128, 256, 512), "input": (112, 224, 336), "in_channels": (32, 64, 128),
             "out_channels": (64, 128, 256), "filter": (1, 3, 5)},
    "fc": {"batch": (16, 32, 64, 128, 256, 512, 1024, 2048), "input": (512, 1024, 2048, 4096),
           "output": (256, 512, 1024, 2048, 4096, 8192)},
    "rnn": {"hidden": (128, 256, 512, 1024), "batch": (16, 32, 64, 128, 256, 512),
            "seqlen": (16, 32, 64, 128, 256, 512)},
}
QUICK = {"conv": 36, "fc": 32, "rnn": 24}
OP_OF = {"conv": "conv2d", "fc": "matmul", "rnn": "lstm"}
# seed 000: Table 4 (combinations; NPU successes), §5.3.2 (best utilisation), Fig. 8 (signs)
PAPER_RUNS = {"fc": (192, 180), "conv": (243, 155), "rnn": (144, 122)}
PAPER_SIGNS = {"fc": {"batch": "+", "input": "+", "output": "+"},
               "rnn": {"hidden": "+", "batch": "+", "seqlen": "-"},
               "conv": {}}
DIRECT_UNITS = 20000  # conv: tiles x k steps per core measured directly up to this
# conv: the most tiles x k steps per core a reduced build may have (about 5 instructions and
# 25 KB of simulator memory each); a point past it is skipped (`--max-units` raises it)
MAX_UNITS = int(os.environ.get("SEED000_MAX_UNITS", "150000"))


class TooCostly(Exception):
    """A point whose smallest affordable build is still past MAX_UNITS."""
LSTM_DIRECT_T = 64  # lstm: steps measured directly up to this


def grid(kind: str) -> list[dict[str, int]]:
    g = GRIDS[kind]
    return [dict(zip(g, vals)) for vals in itertools.product(*g.values())]


def op_params(kind: str, p: Mapping[str, int]) -> dict[str, Any]:
    """The paper's parameters -> the catalogue op's shape."""
    if kind == "conv":
        f = p["filter"]
        return {"n": p["batch"], "c": p["in_channels"], "h": p["input"], "w": p["input"], "k": p["out_channels"],
                "r": f, "s": f, "stride": 1, "pad": f // 2, "layout": "NCHW"}
    if kind == "fc":
        return {"m": p["batch"], "k": p["input"], "n": p["output"], "trans_a": 0, "trans_b": 0}
    if kind == "rnn":
        return {"t": p["seqlen"], "b": p["batch"], "i": p["hidden"], "h": p["hidden"]}
    raise ValueError(kind)


def stratified(points: Sequence[Mapping[str, int]], k: int, seed: int = 0) -> list[dict[str, int]]:
    """k points whose every parameter's levels are as evenly used as possible (greedy over a
    seeded shuffle: each pick minimises the summed use count of its levels)."""
    if k >= len(points):
        return [dict(p) for p in points]
    pool = [dict(p) for p in points]
    random.Random(seed).shuffle(pool)
    used: dict[tuple[str, int], int] = {}
    out = []
    for _ in range(k):
        best = min(range(len(pool)), key=lambda j: sum(used.get(kv, 0) for kv in pool[j].items()))
        p = pool.pop(best)
        for kv in p.items():
            used[kv] = used.get(kv, 0) + 1
        out.append(p)
    return out


def key_of(kind: str, p: Mapping[str, Any]) -> str:
    return kind + "|" + ",".join(f"{k}={p[k]}" for k in sorted(p))


# --- off-chip capacity (Table 4's analogue) ------------------------------------------------------

def output_shape(op: str, p: Mapping[str, Any]) -> tuple[int, ...]:
    """The output's shape, computed here: the catalogue's `output_spec` builds the op's TE graph,
    which for an `lstm` unrolls every step (seconds per point)."""
    if op == "matmul":
        return (p["m"], p["n"])
    if op == "conv2d":
        ho = (p["h"] + 2 * p["pad"] - (p["r"] - 1) - 1) // p["stride"] + 1
        wo = (p["w"] + 2 * p["pad"] - (p["s"] - 1) - 1) // p["stride"] + 1
        return (p["n"], p["k"], ho, wo)
    if op == "lstm":
        return (p["t"], p["b"], p["h"])
    raise ValueError(op)


def tensor_bytes(op: str, params: Mapping[str, Any], dtype: str = DTYPE) -> int:
    """Inputs (data and weights) and output of one kernel, in bytes (fp16 output: these ops
    return their input dtype)."""
    from opcompiler.ops import get_op, workload

    wl = workload(op, dict(params), dtype=dtype)
    total = sum(int(np.prod(s)) * np.dtype(dt).itemsize for _, s, dt in get_op(op).inputs(wl))
    return total + int(np.prod(output_shape(op, wl.p))) * np.dtype(dtype).itemsize


def workspace_bytes(kind: str, params: Mapping[str, Any], unfused: bool = False) -> int:
    """GM scratch beside the tensors: none for the fused templates (conv's img2col happens in L1
    through Load3D; the LSTM cell keeps h and c on chip); the op-by-op RNN holds its input
    projection (t b 4h, fp16) for the whole recurrence and the steps' h plus the stacked Y."""
    if kind == "rnn" and unfused:
        t, b, h = params["t"], params["b"], params["h"]
        return 2 * (t * b * 4 * h) + 2 * 2 * (t * b * h)
    return 0


def fits(kind: str, params: Mapping[str, Any], capacity: int, unfused: bool = False) -> bool:
    return tensor_bytes(OP_OF[kind], params) + workspace_bytes(kind, params, unfused) <= capacity


def hbm_fit_count(kind: str, points: Sequence[Mapping[str, Any]], capacity: int,
                  unfused: bool = False) -> tuple[int, list[dict]]:
    """(how many op-shaped `points` fit `capacity` bytes, the ones that do not)."""
    out = [dict(p) for p in points if not fits(kind, p, capacity, unfused)]
    return len(points) - len(out), out


def hbm_capacity() -> int:
    from opcompiler.target import load_target

    t = load_target(TARGET)
    return int(next(m.capacity_bytes for m in t.memories if m.scope == "global"))


# --- measuring ----------------------------------------------------------------------------------

_BE: dict[str, Any] = {}


def backend():
    if "be" not in _BE:
        import opcompiler.api  # noqa: F401  (loads every template, as the CLI does)
        from opcompiler.backend import get_backend
        from opcompiler.target import load_target

        _BE["target"] = load_target(TARGET)
        _BE["be"] = get_backend(_BE["target"])
    return _BE["be"]


def cube_peak_flops() -> float:
    from opcompiler.target import load_target

    t = load_target(TARGET)
    return t.peak_flops_per_cycle[DTYPE] * t.clock_ghz * 1e9 * t.cores


def offchip_gbps() -> float:
    from opcompiler.target import load_target

    return float(next(m.bandwidth_gbps for m in load_target(TARGET).memories if m.scope == "global"))


def _measure(op: str, params: Mapping[str, Any], cfg: Mapping | None = None) -> dict[str, Any]:
    """One kernel in timing mode: cycles, FLOPs (the op's), off-chip bytes (HBM after L2 hits,
    the profile's), the config, the bound."""
    from opcompiler.ops import get_op, workload

    be = backend()
    wl = workload(op, dict(params), dtype=DTYPE)
    k = be.build(wl, dict(cfg) if cfg is not None else None)
    t = be.timing(k)
    p = be.profile(k, t)
    return {"cycles": int(p.cycles), "seconds": p.seconds, "flops": float(get_op(op).flops(wl)),
            "offchip_bytes": float(p.offchip_bytes), "config": dict(k.config), "bound": p.bound}


def _resolve(op: str, params: Mapping[str, Any]):
    from opcompiler.ops import workload

    be = backend()
    wl = workload(op, dict(params), dtype=DTYPE)
    chosen = be.resolve(wl, None)  # (template, config), or a `Choice` carrying them
    tmpl, cfg = chosen if isinstance(chosen, tuple) else (chosen.template, chosen.config)
    return wl, tmpl, dict(cfg)


def _conv_units(tmpl, wl, cfg) -> tuple[int, int]:
    """(tiles per core, tiles per core x k steps) of a conv config (the template's features)."""
    f = tmpl.features(wl, backend().target, cfg)
    return int(f["tiles_per_core"]), int(f["tiles_per_core"] * f["k_steps"])


def _line(x1: float, y1: float, x2: float, y2: float, x: float) -> float:
    return y1 + (y2 - y1) * (x - x1) / (x2 - x1) if x2 != x1 else y1


def _measure_at_full_l2(params: Mapping[str, Any], cfg: Mapping, n_full: int, tpc_full: int,
                        tpc: int) -> dict[str, Any]:
    """A conv at a reduced batch, timed with the L2 hit rate its full batch would have.

    ascend-sim serves the share of GM reads that re-read the input tensors from L2 as far as L2
    holds them (`timing._hbm_fraction`: 1 - reuse x min(1, L2 / unique input bytes)), a
    whole-program figure: a small batch fits L2 and would look faster per tile than the full
    one. So the reduced program's reads are scaled to the full batch's (tiles per core
    `tpc_full` / `tpc`) and its unique bytes to the full batch's data, and that fraction is used."""
    from opcompiler.backend.ascend import timing as sch

    orig = sch._hbm_fraction
    n = params["n"]
    c16 = -(-params["c"] // 16) * 16
    extra = (n_full - n) * c16 * params["h"] * params["w"] * np.dtype(DTYPE).itemsize

    def full_fraction(prog, gm_bytes=None):
        _, r, w = orig(prog, gm_bytes)
        cores = max(prog.active_cores, 1)
        unique = sum(b.nbytes for name, b in prog.gm.items() if name in prog.info.get("gm_inputs", ())) + extra
        total = r * cores * tpc_full / tpc
        if total <= 0 or unique <= 0:
            return 1.0, r, w
        reuse = max(0.0, 1.0 - unique / total)
        return 1.0 - reuse * min(1.0, prog.machine.l2_bytes / unique), r, w

    sch._hbm_fraction = full_fraction
    try:
        return _measure("conv2d", params, cfg)
    finally:
        sch._hbm_fraction = orig


def measure_conv(params: Mapping[str, Any], force_direct: bool = False, direct_units: int | None = None
                 ) -> dict[str, Any]:
    """A conv point: directly when its tiles x k steps per core are at most `direct_units`
    (DIRECT_UNITS), else at two small batches with the full shape's config, timed with the full
    batch's L2 hit rate, and extrapolated linearly in tiles per core (cycles) and batch (bytes)."""
    from opcompiler.ops import workload

    limit = DIRECT_UNITS if direct_units is None else direct_units
    wl, tmpl, cfg = _resolve("conv2d", params)
    tpc, units = _conv_units(tmpl, wl, cfg)
    n = params["n"]
    if force_direct or units <= limit:
        return {**_measure("conv2d", params, cfg), "method": "direct"}
    # two small batches: the smallest whose tiles spread evenly over the cores, >= 4 tiles a core
    tpc_of = lambda m: _conv_units(tmpl, workload("conv2d", {**params, "n": m}, dtype=DTYPE), cfg)[0]  # noqa: E731
    tiles_img = int(tmpl.features(workload("conv2d", {**params, "n": 1}, dtype=DTYPE), backend().target, cfg)["tiles"])
    # (at most a quarter of the batch: the line is fitted in tiles per core, so an uneven
    # spread is accounted for)
    n1 = min(max(1, cfg["block_dim"] // math.gcd(tiles_img, cfg["block_dim"])), max(1, n // 4))
    while 4 * n1 <= n and tpc_of(n1) < 4:
        n1 *= 2
    n2 = 2 * n1
    if n2 >= n:
        return {**_measure("conv2d", params, cfg), "method": "direct"}
    x1, x2 = tpc_of(n1), tpc_of(n2)
    need = _conv_units(tmpl, workload("conv2d", {**params, "n": n2}, dtype=DTYPE), cfg)[1]
    if need > MAX_UNITS:
        raise TooCostly(f"batch {n2} of config {cfg} has {need} tiles x k steps per core (> {MAX_UNITS})")
    a, b = (_measure_at_full_l2({**params, "n": m}, cfg, n, tpc, x) for m, x in ((n1, x1), (n2, x2)))
    cyc = _line(x1, a["cycles"], x2, b["cycles"], tpc)
    byt = _line(n1, a["offchip_bytes"], n2, b["offchip_bytes"], n)
    flops = a["flops"] * n / n1
    clock = a["cycles"] / a["seconds"]
    return {"cycles": int(round(cyc)), "seconds": cyc / clock, "flops": flops, "offchip_bytes": byt,
            "config": cfg, "bound": b["bound"], "method": f"extrapolated from batch {n1}, {n2}"}


def measure_lstm(params: Mapping[str, Any], force_direct: bool = False) -> dict[str, Any]:
    _, _, cfg = _resolve("lstm", params)
    t = params["t"]
    if force_direct or t <= LSTM_DIRECT_T:
        return {**_measure("lstm", params, cfg), "method": "direct"}
    t1, t2 = LSTM_DIRECT_T // 2, LSTM_DIRECT_T
    a, b = (_measure("lstm", {**params, "t": s}, cfg) for s in (t1, t2))
    from opcompiler.ops import get_op, workload

    cyc = _line(t1, a["cycles"], t2, b["cycles"], t)
    clock = a["cycles"] / a["seconds"]
    return {"cycles": int(round(cyc)), "seconds": cyc / clock,
            "flops": float(get_op("lstm").flops(workload("lstm", dict(params), dtype=DTYPE))),
            "offchip_bytes": _line(t1, a["offchip_bytes"], t2, b["offchip_bytes"], t), "config": cfg,
            "bound": b["bound"], "method": f"extrapolated from {t1}, {t2} steps"}


def opbyop_steps():
    """`opcompiler.ops.opbyop.steps`, or None while that module is missing."""
    try:
        from opcompiler.ops.opbyop import steps
    except ImportError:
        return None
    return steps


def measure_unfused_rnn(params: Mapping[str, Any], cache: dict[str, dict]) -> dict[str, Any] | None:
    """The op-by-op plan of one lstm layer: sum of cycles x count and off-chip bytes x count over
    its kernels (each kernel measured once per distinct shape; `cache` keeps them)."""
    steps = opbyop_steps()
    if steps is None:
        return None
    from opcompiler.ops import get_op, workload

    cyc = byt = 0.0
    kernels = []
    for op, kp, count in steps("lstm", dict(params)):
        key = key_of("kernel:" + op, kp)
        if key not in cache:
            cache[key] = _measure(op, kp)
        r = cache[key]
        cyc += r["cycles"] * count
        byt += r["offchip_bytes"] * count
        kernels.append({"op": op, "params": kp, "count": count, "cycles": r["cycles"]})
    from opcompiler.target import load_target

    clock = load_target(TARGET).clock_ghz * 1e9
    return {"cycles": int(cyc), "seconds": cyc / clock,
            "flops": float(get_op("lstm").flops(workload("lstm", dict(params), dtype=DTYPE))),
            "offchip_bytes": byt, "kernels": len(kernels), "launches": sum(k["count"] for k in kernels),
            "method": "sum over opbyop.steps kernels"}


def measure_point(task: tuple[str, dict, dict]) -> dict[str, Any]:
    """One grid point (run in a worker): the fused kernel; for an RNN also the op-by-op plan.
    A point that does not fit HBM is not measured (`fits` False)."""
    kind, paper, kcache = task
    params = op_params(kind, paper)
    out: dict[str, Any] = {"kind": kind, "paper": paper, "params": params, "key": key_of(kind, paper)}
    cap = hbm_capacity()
    out["fits"] = fits(kind, params, cap)
    if kind == "rnn":
        out["fits_unfused"] = fits(kind, params, cap, unfused=True)
    if not out["fits"]:
        return out
    try:
        if kind == "conv":
            out["fused"] = measure_conv(params)
        elif kind == "fc":
            out["fused"] = {**_measure("matmul", params), "method": "direct"}
        else:
            out["fused"] = measure_lstm(params)
            cache = dict(kcache)
            if out["fits_unfused"]:
                out["unfused"] = measure_unfused_rnn(params, cache)
            out["kernel_cache"] = {k: v for k, v in cache.items() if k not in kcache}
    except TooCostly as e:
        out["skipped"] = str(e)
    except Exception as e:  # a point that fails to build is reported, not fatal
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# --- analysis -----------------------------------------------------------------------------------

def utilisation(r: Mapping[str, Any], peak: float) -> float:
    """Achieved FLOP/s over the fp16 cube peak."""
    return r["flops"] / r["seconds"] / peak if r["seconds"] > 0 else 0.0


def regression(X: Mapping[str, Sequence[float]], y: Sequence[float]) -> dict[str, float]:
    """Least-squares weights of y on each standardised column of X (with an intercept): the change
    of y per standard deviation of that parameter. A constant column gets weight 0."""
    names = list(X)
    cols = []
    for n in names:
        v = np.asarray(X[n], dtype=float)
        sd = v.std()
        cols.append((v - v.mean()) / sd if sd > 0 else np.zeros_like(v))
    A = np.column_stack([np.ones(len(y))] + cols)
    w, *_ = np.linalg.lstsq(A, np.asarray(y, dtype=float), rcond=None)
    return {n: float(wi) for n, wi in zip(names, w[1:])}


NEGLIGIBLE = 0.1  # a weight under this share of the largest one's magnitude: no robust sign


def negligible(w: Mapping[str, float]) -> list[str]:
    """The parameters whose weight is under NEGLIGIBLE x the largest magnitude (its sign can
    flip between a subset and the full grid)."""
    top = max((abs(v) for v in w.values()), default=0.0)
    return [p for p, v in w.items() if top and abs(v) < NEGLIGIBLE * top]


def summarise(results: Sequence[Mapping[str, Any]], peak: float, capacity: int) -> dict[str, Any]:
    summ: dict[str, Any] = {"peak_tflops": peak / 1e12, "hbm_bytes": capacity, "ops": {}}
    for kind in ("fc", "conv", "rnn"):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        s: dict[str, Any] = {"points": len(rs), "fits": sum(bool(r["fits"]) for r in rs),
                             "paper_combinations": PAPER_RUNS[kind][0], "paper_npu_ran": PAPER_RUNS[kind][1],
                             "errors": [r["key"] + ": " + r["error"] for r in rs if "error" in r],
                             "skipped": [r["key"] for r in rs if "skipped" in r]}
        series = {"fused": [r for r in rs if "fused" in r]}
        if kind == "rnn":
            s["fits_unfused"] = sum(bool(r.get("fits_unfused")) for r in rs)
            series["unfused"] = [r for r in rs if r.get("unfused")]
        for name, pts in series.items():
            if not pts:
                continue
            u = [utilisation(r[name], peak) for r in pts]
            tf = [r[name]["flops"] / r[name]["seconds"] / 1e12 for r in pts]
            best = pts[int(np.argmax(u))]
            w = regression({p: [r["paper"][p] for r in pts] for p in GRIDS[kind]}, tf) if len(pts) > 2 else {}
            s[name] = {"measured": len(pts), "util_max": max(u), "util_median": float(np.median(u)),
                       "tflops_max": max(tf), "best_at": best["paper"], "best_config": best[name].get("config"),
                       "best_bound": best[name].get("bound"),
                       "extrapolated": sum("extrapolated" in r[name].get("method", "") for r in pts),
                       "weights": w, "signs": {p: ("+" if v > 0 else "-" if v < 0 else "0") for p, v in w.items()},
                       "negligible": negligible(w),
                       "paper_signs": PAPER_SIGNS[kind]}
        s["paper_util"] = {"fc": 82.0, "conv": 84.7}.get(kind)
        summ["ops"][kind] = s
    return summ


def goals(summ: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals, each True / False / None (not measured)."""
    ops = summ["ops"]
    g: dict[str, Any] = {}
    for kind, paper in (("conv", 84.7), ("fc", 82.0)):
        f = ops.get(kind, {}).get("fused")
        g[f"{kind}_peak_within_5_points"] = None if not f else abs(100 * f["util_max"] - paper) <= 5.0
    sign_ok = []
    for kind in ("fc", "rnn"):
        for series in ("fused", "unfused"):
            f = ops.get(kind, {}).get(series)
            if f and f["weights"]:
                sign_ok.append((f"{kind}.{series}", all(f["signs"].get(p) == s and p not in f["negligible"]
                                                        for p, s in PAPER_SIGNS[kind].items())))
    g["fig8_signs"] = {k: v for k, v in sign_ok}
    un = ops.get("rnn", {}).get("unfused")
    dense = [ops.get(k, {}).get("fused") for k in ("fc", "conv")]
    # below both in the best case and in the typical one: max < max and median < median
    g["unfused_rnn_below_dense"] = (None if not un or not all(dense) else
                                    all(un["util_max"] < d["util_max"] and un["util_median"] < d["util_median"]
                                        for d in dense))
    return g


def roofline_plot(results: Sequence[Mapping[str, Any]], peak: float, gbps: float, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = np.logspace(-1, 4, 200)
    ax.plot(xs, np.minimum(peak, xs * gbps * 1e9) / 1e12, "k-", lw=1.2,
            label=f"roofline ({peak / 1e12:.0f} TFLOPS, {gbps:.0f} GB/s)")
    styles = {("fc", "fused"): ("FC (matmul)", "o", "C0"), ("conv", "fused"): ("conv", "s", "C1"),
              ("rnn", "fused"): ("RNN, fused LSTM cell", "^", "C2"),
              ("rnn", "unfused"): ("RNN, op by op (kernels through GM)", "v", "C3")}
    for (kind, series), (label, marker, color) in styles.items():
        pts = [r[series] for r in results if r["kind"] == kind and r.get(series)]
        if not pts:
            continue
        ai = [p["flops"] / p["offchip_bytes"] for p in pts if p["offchip_bytes"] > 0]
        tf = [p["flops"] / p["seconds"] / 1e12 for p in pts if p["offchip_bytes"] > 0]
        ax.scatter(ai, tf, marker=marker, color=color, s=18, alpha=0.75, label=f"{label} ({len(ai)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / off-chip byte)")
    ax.set_ylabel("TFLOPS")
    ax.set_title("ascend-sim, seed 000's operator grids (fp16, forward, default configs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- the run ------------------------------------------------------------------------------------

def load_cache(path: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    r = json.loads(line)
                    out[r["key"]] = r
    return out


def validate(n: int, out=sys.stderr) -> list[dict]:
    """Points measured directly and by extrapolation (forced): the relative cycle and byte error."""
    def conv(n_, c, h, k, r):
        return ("conv", {"n": n_, "c": c, "h": h, "w": h, "k": k, "r": r, "s": r, "stride": 1, "pad": r // 2,
                         "layout": "NCHW"})

    cases = [conv(128, 32, 112, 64, 3), conv(256, 64, 56, 128, 3), conv(128, 128, 28, 256, 1),
             conv(128, 32, 112, 128, 5), ("rnn", {"t": 128, "b": 64, "i": 256, "h": 256}),
             ("rnn", {"t": 256, "b": 32, "i": 128, "h": 128})][:n]
    rows = []
    for kind, p in cases:
        if kind == "conv":
            ex, d = measure_conv(p, direct_units=0), measure_conv(p, force_direct=True)
        else:
            ex, d = measure_lstm(p), measure_lstm(p, force_direct=True)
        rows.append({"kind": kind, "params": p, "direct": d["cycles"], "extrapolated": ex["cycles"],
                     "method": ex["method"], "error_pct": 100 * (ex["cycles"] - d["cycles"]) / d["cycles"],
                     "bytes_error_pct": 100 * (ex["offchip_bytes"] - d["offchip_bytes"]) / d["offchip_bytes"]})
        print(f"validate {kind:<4} {p}: direct {d['cycles']} extrapolated {ex['cycles']} ({ex['method']}) "
              f"cycles {rows[-1]['error_pct']:+.2f} %, bytes {rows[-1]['bytes_error_pct']:+.2f} %", file=out)
    return rows


def run(kinds: Sequence[str], quick: bool, out_dir: str, jobs: int, plot: bool = True,
        points: Mapping[str, Sequence[Mapping[str, int]]] | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    os.makedirs(out_dir, exist_ok=True)
    cache_path = os.path.join(out_dir, "results.jsonl")
    cache = load_cache(cache_path)
    todo: list[tuple[str, dict]] = []
    chosen: list[str] = []
    for kind in kinds:
        pts = points[kind] if points and kind in points else (stratified(grid(kind), QUICK[kind]) if quick else grid(kind))
        for p in pts:
            k = key_of(kind, p)
            chosen.append(k)
            if k not in cache:
                todo.append((kind, p))
    kcache = {k: v for k, v in cache.items() if k.startswith("kernel:")}
    # expensive first (conv, then rnn), so the pool's tail is short
    todo.sort(key=lambda kp: {"conv": 0, "rnn": 1, "fc": 2}[kp[0]])
    tasks = [(kind, p, kcache) for kind, p in todo]
    with open(cache_path, "a") as f:
        def keep(r: dict) -> None:
            for k, v in (r.pop("kernel_cache", None) or {}).items():
                if k not in cache:
                    cache[k] = {**v, "key": k}
                    kcache[k] = cache[k]
                    f.write(json.dumps(cache[k]) + "\n")
            cache[r["key"]] = r
            if "error" not in r and "skipped" not in r:  # retried by the next run
                f.write(json.dumps(r) + "\n")
                f.flush()

        bar = tqdm(total=len(tasks), desc="seed000 points", file=sys.stderr, disable=not tasks)
        if jobs > 1 and len(tasks) > 1 or len(tasks) > 8:  # (workers: each returns its memory)
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(jobs, maxtasksperchild=8) as pool:
                for r in pool.imap_unordered(measure_point, tasks):
                    keep(r)
                    bar.update()
        else:
            for t in tasks:
                keep(measure_point(t))
                bar.update()
        bar.close()
    results = [cache[k] for k in chosen]
    peak = cube_peak_flops()
    cap = hbm_capacity()
    summ = summarise(results, peak, cap)
    summ["grid"] = "quick (stratified subset)" if quick else "full"
    summ["configs"] = "derived default configs of each template (no tuning), timing mode, fp16, forward"
    summ["grids"] = {k: {p: list(v) for p, v in GRIDS[k].items()} for k in kinds}
    summ["grid_hbm_fit"] = {k: hbm_fit_count(k, [op_params(k, p) for p in grid(k)], cap)[0] for k in kinds}
    summ["opbyop"] = "present" if opbyop_steps() else "missing: opcompiler/ops/opbyop.py (no op-by-op RNN series)"
    summ["goals"] = goals(summ)
    if plot:
        summ["roofline_png"] = roofline_plot(results, peak, offchip_gbps(), os.path.join(out_dir, "roofline.png"))
    return {"summary": summ, "points": results}


def print_table(res: Mapping[str, Any], out=sys.stdout) -> None:
    s = res["summary"]
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"Seed 000 single-operator study on {TARGET}: {s['grid']} grid; {s['configs']}.")
    p(f"Peak {s['peak_tflops']:.1f} TFLOPS fp16 (cube), HBM {s['hbm_bytes'] / 2**30:.0f} GiB. "
      f"Op-by-op RNN: {s['opbyop']}.")
    p("")
    p(f"{'op':<5} {'grid':>5} {'fit HBM':>8} {'paper ran':>10} | {'series':<8} {'n':>4} {'extrap':>6} "
      f"{'util max':>8} {'median':>7} {'TFLOPS max':>10} {'paper':>6}")
    for kind, o in s["ops"].items():
        full = s["grid_hbm_fit"].get(kind)
        fitcol = f"{full}/{len(grid(kind))}" if full is not None else "-"
        paper = f"{o['paper_npu_ran']}/{o['paper_combinations']}"
        first = True
        for series in ("fused", "unfused"):
            f = o.get(series)
            if not f:
                continue
            name = {"fc": "matmul", "conv": "conv2d"}.get(kind, "cell" if series == "fused" else "op-by-op")
            pu = f"{o['paper_util']:.1f}" if o.get("paper_util") and series == "fused" else "-"
            p(f"{kind if first else '':<5} {o['points'] if first else '':>5} {fitcol if first else '':>8} "
              f"{paper if first else '':>10} | {name:<8} {f['measured']:>4} {f['extrapolated']:>6} "
              f"{100 * f['util_max']:>7.1f}% {100 * f['util_median']:>6.1f}% {f['tflops_max']:>10.1f} {pu:>6}")
            first = False
        if o["skipped"]:
            p(f"      {len(o['skipped'])} points skipped as too costly to simulate here (--max-units): "
              + "; ".join(k.split("|")[1] for k in o["skipped"]))
        if o["errors"]:
            p(f"      {len(o['errors'])} points failed to build: {o['errors'][0]}")
    p("")
    p("Linear regression of TFLOPS on standardised parameters (TFLOPS per standard deviation;")
    p(f"~: under {NEGLIGIBLE:.0%} of the largest weight, no robust sign):")
    for kind, o in s["ops"].items():
        for series in ("fused", "unfused"):
            f = o.get(series)
            if not f or not f["weights"]:
                continue
            ws = "  ".join(f"{k} {v:+7.2f}{'~' if k in f['negligible'] else ''}" for k, v in f["weights"].items())
            paper = " ".join(f"{k}{v}" for k, v in f["paper_signs"].items()) or "(no signs in the text)"
            p(f"  {kind:<4} {series:<8} {ws}   Fig. 8: {paper}")
    p("")
    p("Best points:")
    for kind, o in s["ops"].items():
        f = o.get("fused")
        if f:
            p(f"  {kind:<4} {f['best_at']}  {100 * f['util_max']:.1f}%  config {f['best_config']}  bound {f['best_bound']}")
    p("")
    p("Goals: " + json.dumps(s["goals"]))
    if s.get("roofline_png"):
        p(f"Roofline: {s['roofline_png']}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="a stratified subset (default)")
    g.add_argument("--full", action="store_true", help="every grid point (long)")
    ap.add_argument("--ops", default="fc,conv,rnn")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "seed000_out"),
                    help="results cache and roofline.png (created; default: TMPDIR/seed000_out, outside the checkout)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--max-units", type=int, default=MAX_UNITS,
                    help="conv: the largest build (tiles x k steps per core) to simulate; more is skipped")
    ap.add_argument("--validate", type=int, default=0, metavar="N", help="first check N extrapolated points")
    a = ap.parse_args(argv)
    kinds = [k.strip() for k in a.ops.split(",") if k.strip()]
    for k in kinds:
        if k not in GRIDS:
            ap.error(f"--ops: unknown {k!r} (fc, conv, rnn)")
    from opcompiler.api import run_op  # noqa: F401  (loads every template, as the CLI does)

    os.environ["SEED000_MAX_UNITS"] = str(a.max_units)  # (read again by each worker)
    globals()["MAX_UNITS"] = a.max_units

    val = validate(a.validate) if a.validate else []
    res = run(kinds, not a.full, a.out, a.jobs, plot=not a.no_plot)
    if val:
        res["summary"]["validation"] = val
    if a.json:
        json.dump(res, sys.stdout, default=str)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
