"""What each unsourced figure of a simulated target costs: move it by -20 % and +20 % and see how
far the calibration set's cycles move.

The calibration set is the seed workloads the calibration tests run (tests/ascend/
test_calibration.py for ascend-sim, tests/dsp/test_paper.py for dsp-sim), with their configs.
An unsourced figure is one whose source in the target file says `assumed` or `calibrated`. Each
is changed on a copy of the loaded target (`dataclasses.replace`, with its own digest so no
cache hands back the unchanged machine); integer figures are rounded, and one that rounding
would leave unchanged (or a zero) is moved by one unit instead -- the table shows the value
used. Effects are ranked by the mean |change| of the set's cycles, scaled to a 20 % move of
the figure (elasticity x 20), so a figure moved by one unit compares fairly. The last column
names the calibration checks (the tests' asserted quantities, with their tolerances) that the
move pushes out of bounds.

    python benchmarks/sensitivity.py                    # both simulators (3-4 minutes, 2 processes)
    python benchmarks/sensitivity.py --target dsp-sim   # one
    python benchmarks/sensitivity.py --jobs 1           # one process
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from types import MappingProxyType
from typing import Any, Callable

from opcompiler.backend import get_backend
from opcompiler.calibration import fit_rows
from opcompiler.ops import get_op, workload
from opcompiler.target import Target, get_figure, load_target, with_figures

STEP = 0.20


# --- figures -----------------------------------------------------------------------------------

def unsourced(target: Target) -> list[str]:
    """Keys of the figures whose source says `assumed` or `calibrated` (numeric ones only)."""
    keys = []
    for key, src in target.sources.items():
        s = src.lower()
        if ("assumed" in s or "calibrated" in s) and _is_numeric(get_figure(target, key)):
            keys.append(key)
    return keys


def _is_numeric(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, MappingProxyType) and all(_is_numeric(x) for x in v.values()) and len(v) > 0


def moved(value: Any, sign: int) -> tuple[Any, float]:
    """(value moved by sign x 20 %, the relative move actually applied)."""
    if isinstance(value, MappingProxyType):  # e.g. slow_ops: move every entry alike
        items = {k: moved(v, sign)[0] for k, v in value.items()}
        base = sum(value.values())
        return MappingProxyType(items), (sum(items.values()) - base) / base if base else float(sign)
    if isinstance(value, int):
        new = round(value * (1 + sign * STEP))
        if new == value:
            new = value + sign
        if value >= 1:
            new = max(new, 1)  # a count or rate of 1 is not moved to 0 (that is no machine at all)
        new = max(new, 0)
        return new, (new - value) / value if value else float(new - value)
    if value == 0:
        return float(sign > 0), 1.0
    return value * (1 + sign * STEP), sign * STEP


# --- the calibration sets ------------------------------------------------------------------------

Case = tuple[str, Callable[[Target], int]]


def _m(op: str, shape: str | None = None, *, preset: str | None = None, batch: int | None = None,
       dtype: str | None = "float16", config: Any = None, cores: int | None = None,
       mode: str | None = None) -> Callable[[Target], int]:
    def run(t: Target) -> int:
        if cores is not None:
            t = dataclasses.replace(t, cores=cores)
        if mode is not None:
            t = dataclasses.replace(t, extra=MappingProxyType({**t.extra, "data_mode": mode}))
        be = get_backend(t)
        kw = {"dtype": dtype} if dtype else {}
        return be.measure(be.build(workload(op, shape, preset=preset, batch=batch, **kw), config)).cycles
    return run


def _unfused(preset: str, batch: int) -> Callable[[Target], int]:
    def run(t: Target) -> int:
        be = get_backend(t)
        wl = workload("conv2d_bn_relu", preset=preset, batch=batch, dtype="float16")
        return sum(be.measure(be.build(workload(s.op, dict(s.params), dtype="float16"))).cycles
                   for s in get_op(wl.op).unfused(wl))
    return run


def ascend_cases() -> list[Case]:
    """tests/ascend/test_calibration.py, workload by workload."""
    cases: list[Case] = []
    for kt in (16, 32, 64, 128, 256):
        for nt in (16, 32, 64, 128, 256, 512, 1024):
            cfg = {"m_tile": 16, "k_tile": kt, "n_tile": nt, "double_buffer": 0, "block_dim": 1}
            cases.append((f"fig14 k{kt} n{nt}", _m("matmul", preset="seed.matmul_16x256x1024", config=cfg)))
    for i, c in enumerate([None, {"k_tile": 256}, {"m_tile": 128, "n_tile": 256}]):
        cases.append((f"matmul 2048^3 cfg{i}", _m("matmul", "m=2048,k=2048,n=2048", config=c)))
    for i, c in enumerate([None, {"m_tile": 512, "n_tile": 128}]):
        cases.append((f"conv n128 c256 28x28 cfg{i}", _m("conv2d", "n=128,c=256,h=28,w=28,k=256,r=3,s=3,pad=1", config=c)))
    for op, s in [("matmul", "m=16,k=1024,n=1024"), ("matmul", "m=32,k=4096,n=4096"),
                  ("conv2d", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1"),
                  ("conv2d", "n=1,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3")]:
        cases.append((f"thin {op} {s}", _m(op, s)))
    for dt in ("float16", "float32"):
        cases.append((f"batch_norm 32x256x56x56 {dt}", _m("batch_norm", "n=32,c=256,h=56,w=56", dtype=dt)))
    for preset, b in [("resnet50.res2_3x3", 1), ("resnet50.res3_3x3", 8)]:
        cases.append((f"conv_bn_relu {preset} b{b} fused", _m("conv2d_bn_relu", preset=preset, batch=b)))
        cases.append((f"conv_bn_relu {preset} b{b} unfused", _unfused(preset, b)))
    for b in (1, 2, 8, 32):
        cases.append((f"fig8 res3_3x3 b{b}", _m("conv2d", preset="resnet50.res3_3x3", batch=b)))
    for c in (16, 32, 64, 128, 256):
        cases.append((f"fig8 width {c}", _m("conv2d", f"n=8,c={c},h=28,w=28,k={c},r=3,s=3,pad=1")))
    for mm in (16, 64, 256, 1024):
        cases.append((f"fig8 fc m{mm}", _m("matmul", f"m={mm},k=1024,n=1024")))
    return cases


BEST = {"pw": 10, "kv": 2, "rows": 1, "order": "out", "dbuf": 1, "w_path": "gsm", "out_path": "ddr", "split": "items"}


def dsp_cases() -> list[Case]:
    """tests/dsp/test_paper.py, workload by workload (paper schedule unless named)."""
    cases: list[Case] = []
    for b in (96, 768):
        cases.append((f"conv3_res b{b} paper", _m("conv2d", preset="minigo.conv3_res", batch=b, dtype=None, config="paper")))
        cases.append((f"conv3_res b{b} paper 1 core", _m("conv2d", preset="minigo.conv3_res", batch=b, dtype=None,
                                                          config="paper", cores=1)))
        cases.append((f"conv3_res b{b} best", _m("conv2d", preset="minigo.conv3_res", batch=b, dtype=None, config=BEST)))
    for fc in ("fc1", "fc2", "fc3"):
        for cores in (None, 1):
            cases.append((f"{fc} b96 paper{' 1 core' if cores else ''}",
                          _m("matmul_bias_relu", preset=f"minigo.{fc}", batch=96, dtype=None, config="paper", cores=cores)))
    for p in ("conv3_init", "conv3_res", "conv1_policy", "conv1_value"):
        cases.append((f"{p} b96 copy mode", _m("conv2d", preset=f"minigo.{p}", batch=96, dtype=None, config="paper",
                                                 mode="copy")))
        if p != "conv3_res":
            cases.append((f"{p} b96 shared", _m("conv2d", preset=f"minigo.{p}", batch=96, dtype=None, config="paper")))
    for cores in (None, 1):
        cases.append((f"conv3_init b768 paper{' 1 core' if cores else ''}",
                      _m("conv2d", preset="minigo.conv3_init", batch=768, dtype=None, config="paper", cores=cores)))
    return cases


# --- the checks the calibration tests assert (value from the set's cycles, tolerance band) ------

def ascend_checks(c: dict[str, int], t: Target) -> dict[str, tuple[float, float, float]]:
    fig = {row["what"]: row for row in fit_rows("ascend910")}
    peak = t.peak_flops_per_cycle["float16"] * t.cores
    mm = 2 * 2048 ** 3 / min(c[f"matmul 2048^3 cfg{i}"] for i in range(3)) / peak * 100
    conv_flops = 2 * 128 * 28 * 28 * 256 * 256 * 9
    conv = conv_flops / min(c[f"conv n128 c256 28x28 cfg{i}"] for i in range(2)) / peak * 100
    f14 = [v for k, v in c.items() if k.startswith("fig14")]
    past = max(c[f"fig14 k{k} n{n}"] for k in (128, 256) for n in (512, 1024)) / min(f14)
    bn = c["batch_norm 32x256x56x56 float16"] / c["batch_norm 32x256x56x56 float32"]
    fc, cv = fig["best fully-connected throughput"]["percent_of_peak"], fig["best conv2d throughput"]["percent_of_peak"]
    r = fig["ResNet-50 with BatchNorm in fp32 vs fp16"]["ratio"]
    return {"FC % peak": (mm, fc - 8, fc + 8), "conv % peak": (conv, cv - 8, cv + 8),
            "fig14 past knee / best": (past, 0.0, 1.10), "BN fp16/fp32": (bn, r - 0.10, r + 0.10)}


def dsp_checks(c: dict[str, int], t: Target) -> dict[str, tuple[float, float, float]]:
    rows = {row["what"]: row for row in fit_rows("ft_m7032")}
    peak = t.peak_flops_per_cycle["float32"] * t.cores
    out = {}
    for b in (96, 768):
        pub = rows[f"CONV3_RES forward, 8 DSP cores, batch {b}"]["percent_of_peak"]
        flops = 2 * b * 19 * 19 * 9 * 64 * 64
        out[f"conv3_res b{b} % peak"] = (flops / c[f"conv3_res b{b} paper"] / peak * 100, pub - 3, pub + 3)
    copy = rows["forward ms, copy mode (DSP-SMP) -> shared mode (DSP+SMP), batch 96"]["conv3_res"]
    ratio = copy[0] / copy[1]
    out["conv3_res copy/shared"] = (c["conv3_res b96 copy mode"] / c["conv3_res b96 paper"], ratio * 0.75, ratio * 1.25)
    return out


SETS = {"ascend-sim": (ascend_cases, ascend_checks), "dsp-sim": (dsp_cases, dsp_checks)}


def measure_set(target_name: str, key: str | None, sign: int) -> tuple[str | None, int, dict[str, int]]:
    """(key, sign, cycles per workload of the calibration set) with `key` moved by sign x 20 %."""
    base = load_target(target_name)
    t = base
    if key is not None:
        value, _ = moved(get_figure(base, key), sign)
        t = with_figures(base, {key: value}, f"{key}{'+' if sign > 0 else '-'}")
    cases, _ = SETS[target_name]
    return key, sign, {name: run(t) for name, run in cases()}


def _fmt(v: Any) -> str:
    if isinstance(v, MappingProxyType):
        return "{" + ",".join(f"{k}:{x:g}" for k, x in v.items()) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def report(target_name: str, jobs: int) -> list[tuple[str, float]]:
    base_t = load_target(target_name)
    keys = unsourced(base_t)
    _, checks = SETS[target_name]
    t0 = time.time()
    work = [(target_name, None, 0)] + [(target_name, k, s) for k in keys for s in (-1, 1)]
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        results = list(ex.map(measure_set, *zip(*work)))
    base = results[0][2]
    base_checks = checks(base, base_t)
    by_key: dict[str, dict[int, tuple[Any, dict[str, int]]]] = {}
    for key, sign, cyc in results[1:]:
        by_key.setdefault(key, {})[sign] = (moved(get_figure(base_t, key), sign)[0], cyc)
    rows = []
    for key in keys:
        old = get_figure(base_t, key)
        per_sign = {}
        for sign in (-1, 1):
            value, cyc = by_key[key][sign]
            rel = moved(old, sign)[1]
            deltas = {n: (cyc[n] - base[n]) / base[n] * 100 for n in base}
            mean = sum(abs(d) for d in deltas.values()) / len(deltas)
            worst = max(deltas, key=lambda n: abs(deltas[n]))
            t = with_figures(base_t, {key: value}, "chk")
            broken = [name for name, (v, lo, hi) in checks(cyc, t).items() if not lo <= v <= hi]
            per_sign[sign] = (value, rel, mean, worst, deltas[worst], broken)
        # effect per 20 % move of the figure (elasticity x 20), over the directions it could move
        scaled = [per_sign[s][2] * STEP / abs(per_sign[s][1]) for s in (-1, 1) if per_sign[s][1]]
        rows.append((key, old, per_sign, sum(scaled) / len(scaled) if scaled else 0.0))
    rows.sort(key=lambda r: -r[3])
    print(f"\n{target_name}: {len(keys)} unsourced figures, calibration set of {len(base)} workloads "
          f"({time.time() - t0:.0f} s)")
    print("calibration checks at the shipped figures: "
          + "; ".join(f"{n} {v:.3g} in [{lo:.3g}, {hi:.3g}]" for n, (v, lo, hi) in base_checks.items()))
    print(f"{'rank':>4} {'figure':<38} {'value':>10} {'-move':>12} {'+move':>12} {'mean|d| per 20%':>16} "
          f"{'worst case (d %)':<44} checks broken")
    for i, (key, old, ps, eff) in enumerate(rows, 1):
        lo, hi = ps[-1], ps[1]
        worst = max((lo, hi), key=lambda p: abs(p[4]))
        broken = sorted(set(lo[5]) | set(hi[5]))
        print(f"{i:>4} {key:<38} {_fmt(old):>10} {_fmt(lo[0]):>12} {_fmt(hi[0]):>12} {eff:>15.2f}% "
              f"{worst[3][:34] + f' ({worst[4]:+.1f})':<44} {', '.join(broken) or '-'}")
    return [(k, e) for k, _, _, e in rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=sorted(SETS), action="append")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    for name in args.target or sorted(SETS):
        report(name, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
