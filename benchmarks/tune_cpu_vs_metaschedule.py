"""Real hardware: conv2d tuned by opcompiler on the `cpu` target against TVM's own MetaSchedule
(`tvm.s_tir.meta_schedule.tune_tir`, XGBoost + evolutionary search) given the same number of
trials, and against PyTorch CPU (oneDNN, NCHW and channels-last) when torch is installed.
Every kernel is checked against the numpy reference and timed by the same function in the
same process, one after the other; the table prints GFLOPS and ratios.

    python benchmarks/tune_cpu_vs_metaschedule.py [--trials 64] [--presets resnet50.res2_3x3,...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from opcompiler.backend import get_backend  # noqa: E402
from opcompiler.backend.cpu import llvm_target  # noqa: E402
from opcompiler.ops import get_op, workload  # noqa: E402
from opcompiler.target import load_target  # noqa: E402
from opcompiler.tune import tune  # noqa: E402
from opcompiler.verify import compare  # noqa: E402

from _timing import bench  # noqa: E402  (benchmarks/ is on sys.path when a script runs)




def tvm_args(ins: list[np.ndarray], out_shape: tuple, out_dtype: str) -> list:
    dev = tvm.cpu()
    return [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in ins] + [
        tvm.runtime.tensor(np.zeros(out_shape, dtype=out_dtype), dev)]


def _ms_child(wl, trials: int, work_dir: str) -> None:
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    ins, out = get_op(wl.op).compute(wl)
    ms.tune_tir(te.create_prim_func([*ins, out]), llvm_target(), work_dir, max_trials_global=trials,
                num_trials_per_iter=min(64, trials), seed=0)


def metaschedule(wl, trials: int, work_dir: str, timeout: float):
    """Tune the op's plain TE compute with MetaSchedule in a child process (so a stuck builder
    cannot hang the benchmark); returns (compiled function, tuning seconds)."""
    import multiprocessing as mp
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    t0 = time.perf_counter()
    proc = mp.get_context("spawn").Process(target=_ms_child, args=(wl, trials, work_dir))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        print(f"MetaSchedule did not finish in {timeout:.0f} s; using what its database holds", file=sys.stderr)
    tune_s = time.perf_counter() - t0
    ins, out = get_op(wl.op).compute(wl)
    func = te.create_prim_func([*ins, out])
    db = ms.database.JSONDatabase(os.path.join(work_dir, "database_workload.json"),
                                  os.path.join(work_dir, "database_tuning_record.json"), allow_missing=True)
    sch = ms.tir_integration.compile_tir(db, func, llvm_target())
    if sch is None:
        raise RuntimeError("MetaSchedule found no valid schedule")
    return tvm.compile(sch.mod, target=llvm_target()), tune_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--presets", default="resnet50.res2_3x3")
    ap.add_argument("--ms-timeout", type=float, default=1200, help="seconds before MetaSchedule is stopped")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None
    target = load_target("cpu")
    backend = get_backend(target)
    rows = []
    for preset in args.presets.split(","):
        wl = workload("conv2d", preset=preset, dtype="float32")
        op = get_op("conv2d")
        ins = op.make_inputs(wl)
        ref = op.reference(wl, ins)
        flops = op.flops(wl)
        out_shape, out_dt = op.output_spec(wl)
        row: dict = {"preset": preset, "trials": args.trials, "gflop": flops / 1e9}
        with tempfile.TemporaryDirectory() as tmp:
            # ours: one measurement worker (two would share the two cores and spoil each other's timings)
            t0 = time.perf_counter()
            res = tune("conv2d", target, preset=preset, dtype="float32", trials=args.trials, workers=1,
                       log=os.path.join(tmp, "conv2d.jsonl"), early_stop=0, progress=True)
            row["opc_tune_s"] = time.perf_counter() - t0
            kernels = {"opcompiler default": backend.build(wl, None)}
            if res.best is not None:
                kernels["opcompiler tuned"] = backend.build(wl, dict(res.best.config))
            ms_fn, row["ms_tune_s"] = metaschedule(wl, args.trials, os.path.join(tmp, "ms"), args.ms_timeout)
            kernels["metaschedule"] = ms_fn
            for name, k in kernels.items():
                fn = k.artifact if hasattr(k, "artifact") else k
                a = tvm_args(ins, out_shape, out_dt)
                fn(*a)
                ok, _ = compare(a[-1].numpy(), ref)
                row[name] = flops / bench(lambda: fn(*a)) / 1e9
                row[f"{name} ok"] = ok
        if torch is not None:
            xt, wt = torch.from_numpy(ins[0]), torch.from_numpy(ins[1])
            with torch.no_grad():
                y = torch.nn.functional.conv2d(xt, wt, stride=wl["stride"], padding=wl["pad"]).numpy()
                row["torch ok"] = compare(y, ref)[0]
                row["torch"] = flops / bench(lambda: torch.nn.functional.conv2d(
                    xt, wt, stride=wl["stride"], padding=wl["pad"])) / 1e9
                xc, wc = (t.contiguous(memory_format=torch.channels_last) for t in (xt, wt))
                row["torch nhwc"] = flops / bench(lambda: torch.nn.functional.conv2d(
                    xc, wc, stride=wl["stride"], padding=wl["pad"])) / 1e9
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = [c for c in ("opcompiler default", "opcompiler tuned", "metaschedule", "torch", "torch nhwc") if c in rows[0]]
    print(f"\nconv2d fp32 on the host CPU ({os.cpu_count()} threads), {args.trials} trials each; GFLOPS, same run")
    print(f"{'preset':<20}" + "".join(f"{c:>20}" for c in cols) + f"{'tuned/MS':>10}{'tune s (ours/MS)':>18}")
    for r in rows:
        cells = "".join(f"{r[c]:>18.1f}{'' if r.get(c + ' ok', True) else '!!':>2}" for c in cols)
        ratio = r.get("opcompiler tuned", r["opcompiler default"]) / r["metaschedule"]
        print(f"{r['preset']:<20}{cells}{ratio:>9.2f}x{r['opc_tune_s']:>9.0f}/{r['ms_tune_s']:.0f}")
    print("(!! = wrong result against the numpy reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
