"""fp16 tensor-core kernels on one GPU, in one run: our WMMA and mma.sync templates beside
MetaSchedule, cuDNN / cuBLAS (PyTorch eager) and, for the fused conv+BN+ReLU rows, torch.compile.

    python benchmarks/cuda_mma_vs_peers.py                          # defaults, no tuning (minutes)
    python benchmarks/cuda_mma_vs_peers.py --trials 64 --workers 8  # the issue's budget (long)
    python benchmarks/cuda_mma_vs_peers.py --layers res3_3x3,res4_3x3,fc --trials 16 --budget-s 420 \
        --json $OUT/mma.json                                        # what fits a 15-minute GPU lease

Rows: the ResNet-50 layers (fp16, NHWC, batch 32; fc = 256 x 2048 x 1000) and "fused" rows
(conv2d_bn_relu on the 3x3 layers). Columns, all timed on this GPU in this process:

- `wmma`  : our template with `mma = wmma` (the default instructions), tuned `--trials` (else default);
- `mma`   : our template with `mma = mma_sync` (mma.sync.m16n8k16 + ldmatrix, epilogue in registers),
            same trial budget, its output checked against numpy before it is timed; for the fc row the
            tuned (or default) config is then timed at every `split_k` (1, 2, 4, 8: K cut into slices on
            blockIdx.z, a reduction kernel adds them) that check() allows, and the fastest is kept
            (the row's JSON holds each split_k's time or the reason it was refused);
- `MS`    : MetaSchedule, `tune_tir` on the op's TE compute with the same trial budget (tensor-core
            rules: `cuda-tensorcore`), in a spawned child process (`--ms-timeout` each);
- `torch` : PyTorch eager (cuDNN / cuBLAS); fused rows: its three ops conv2d, addcmul (BN folded
            to scale / shift), relu;
- `compile`: fused rows only, `torch.compile` of those three ops.

Printed per row: TFLOPS of each, our best as % of the target's fp16 peak, and the ratios
mma / wmma, mma / torch, mma / MS (and, fused, mma / compile). `--budget-s` stops starting new
work when the time is spent (finished rows are printed and written to `--json` as they come), so
a short GPU lease still yields a table. Without a GPU, or without PyTorch's CUDA, it says so and
exits with status 2; the MetaSchedule column needs `cloudpickle` and `psutil` (apache-tvm's
popen-pool extra) and is skipped with its reason when they are missing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_vs_torch import CONV_PRESETS, gpu_torch_or_exit, torch_seconds  # noqa: E402

FUSED_PRESETS = ("resnet50.res2_3x3", "resnet50.res3_3x3", "resnet50.res4_3x3", "resnet50.res5_3x3")
ALL = tuple(p.split(".")[1] for p in CONV_PRESETS) + ("fc",)


# ------------------------------------------------------------------ our template, one instruction kind

@contextmanager
def pinned_mma(value: str):
    """Tune within `mma = value` only: the template's space offers that one value and its default
    uses it (the tuner samples the space and measures the default in this process)."""
    from opcompiler.schedules.cuda import templates as T
    from opcompiler.template_base import Knob
    space, default = T.CudaGemmTemplate.space, T.CudaGemmTemplate.default

    def pinned_space(self, wl, target):
        return [Knob(k.name, (value,), k.doc) if k.name == "mma" else k for k in space(self, wl, target)]

    def pinned_default(self, wl, target):
        cfg = default(self, wl, target)
        return {**cfg, "mma": value} if "mma" in cfg else cfg
    T.CudaGemmTemplate.space, T.CudaGemmTemplate.default = pinned_space, pinned_default
    try:
        yield
    finally:
        T.CudaGemmTemplate.space, T.CudaGemmTemplate.default = space, default


def ours(backend, target, wl, mma: str, trials: int, workers: int, log_dir: str, check: bool) -> dict:
    """Tune (or take the default of) our template with `mma` (mma_sync on a matmul: then the best
    `split_k`, `best_split_k`), then time it (and check it vs numpy)."""
    from opcompiler.ops import get_op
    from opcompiler.verify import compare
    cfg = None
    with pinned_mma(mma):
        if trials and wl.dtype == "float16":
            from opcompiler.tune import tune
            res = tune(wl.op, target, shape=dict(wl.params), dtype=wl.dtype, trials=trials, workers=workers,
                       progress=False, log=os.path.join(log_dir, f"{wl.op}_{mma}.jsonl"))
            best = res.best or res.best_measured
            cfg = dict(best.config) if best is not None else None
        tmpl_cfg = cfg or {"mma": mma}
        kernel = backend.build(wl, tmpl_cfg)
    d = get_op(wl.op)
    inputs = d.make_inputs(wl, seed=1)
    sweep = None
    if mma == "mma_sync" and d.family == "matmul" and wl.dtype == "float16":
        kernel, sweep = best_split_k(backend, target, wl, kernel, inputs)
    out: dict = {"config": kernel.config, "registers": kernel.info.get("registers_per_thread"),
                 "spill_bytes": kernel.info.get("spill_bytes")}
    if sweep is not None:
        out["split_k_sweep"] = sweep
    if check:
        r = backend.run(kernel, inputs)
        ok, err = compare(r.outputs[0], d.reference(wl, inputs))
        out["max_abs_error"], out["correct"] = float(err), bool(ok)
    out["seconds"] = backend.measure(kernel, inputs).seconds
    return out


def best_split_k(backend, target, wl, kernel, inputs) -> tuple:
    """The small-M GEMM's split_k, on top of the tuned (or default) config: time the config at every
    `split_k` value check() allows and keep the fastest. Returns (kernel, {split_k: seconds or why not})."""
    from opcompiler.ops import get_op
    from opcompiler.template import get_template
    tmpl = get_template(get_op(wl.op).family, "cuda")
    knob = next((k for k in tmpl.space(wl, target) if k.name == "split_k"), None)
    if knob is None:
        return kernel, {}
    sweep: dict = {}
    best, best_s = kernel, None
    for s in knob.values:
        cfg = {**kernel.config, "split_k": s}
        why = tmpl.check(wl, target, cfg)
        if why is not None:
            sweep[s] = f"refused: {why}"
            continue
        try:
            k = kernel if s == kernel.config.get("split_k", 1) else backend.build(wl, cfg)
            secs = backend.measure(k, inputs).seconds
        except Exception as e:  # noqa: BLE001 - one failing split_k must not lose the column
            sweep[s] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            continue
        sweep[s] = secs
        if best_s is None or secs < best_s:
            best, best_s = k, secs
    return best, sweep


# ------------------------------------------------------------------ MetaSchedule, in a child process

def _ms_child(op: str, params: dict, dtype: str, tvm_target: dict, trials: int, work_dir: str) -> None:
    import numpy as np
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from opcompiler.backend.base import device_args
    from opcompiler.ops import get_op, workload
    from opcompiler.schedules.cuda import intrin  # noqa: F401  registers TVM's WMMA / MMA intrinsics (fast import)
    wl = workload(op, params, dtype=dtype)
    d = get_op(op)
    ins, out = d.compute(wl)
    func = te.create_prim_func([*ins, out]).with_attr("global_symbol", "main")
    target = tvm.target.Target(tvm_target)
    t0 = time.perf_counter()
    # the tensor-core rules (WMMA and mma.sync groups); their design-space generation raised a
    # ScheduleError ("not a stage pipeline") once for an NHWC conv here, so fall back to the plain
    # CUDA rules and say which space the figure comes from
    for kind in ("cuda-tensorcore", "cuda"):
        space = ms.space_generator.PostOrderApply(sch_rules=kind, postprocs=kind, mutator_probs=kind)
        try:
            db = ms.tune_tir(func, target, os.path.join(work_dir, kind), max_trials_global=trials,
                             num_trials_per_iter=min(trials, 32), space=space, seed=0)
            break
        except Exception as e:  # noqa: BLE001
            print(f"MetaSchedule with {kind} rules failed: {str(e).splitlines()[-1][:300] if str(e) else e!r}",
                  file=sys.stderr)
    else:
        raise RuntimeError("MetaSchedule failed with the tensor-core and the plain CUDA rules")
    tune_s = time.perf_counter() - t0
    sch = ms.tir_integration.compile_tir(db, func, target)
    if sch is None:
        raise RuntimeError("MetaSchedule found no valid schedule")
    ex = tvm.compile(sch.mod, target=target)
    dev = tvm.cuda(0)
    inputs = d.make_inputs(wl, seed=1)
    args = device_args(wl, inputs, dev)
    ex(*args)
    dev.sync()
    got = args[-1].numpy()
    ref = d.reference(wl, inputs)
    err = float(np.max(np.abs(got.astype(np.float32) - ref.astype(np.float32))))
    f = ex.mod.time_evaluator(ex.mod.entry_name, dev, number=10, repeat=20, min_repeat_ms=10)
    secs = float(statistics.median(f(*args).results))
    Path(work_dir, "result.json").write_text(json.dumps({"seconds": secs, "tune_seconds": tune_s,
                                                         "max_abs_error": err, "space": kind}))


def metaschedule(wl, target, trials: int, timeout: float) -> dict:
    import multiprocessing as mp

    from opcompiler.backend.cuda import tvm_cuda_target
    t = tvm_cuda_target(target)
    spec = {"kind": "cuda", "arch": str(t.arch), "max_threads_per_block": int(t.attrs["max_threads_per_block"]),
            "max_shared_memory_per_block": int(t.attrs["max_shared_memory_per_block"]),
            "thread_warp_size": int(t.attrs["thread_warp_size"]), "registers_per_block": 65536}
    with tempfile.TemporaryDirectory(prefix="opc_ms_") as work:
        proc = mp.get_context("spawn").Process(target=_ms_child, args=(wl.op, dict(wl.params), wl.dtype, spec,
                                                                         trials, work))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            return {"skipped": f"MetaSchedule did not finish in {timeout:.0f} s"}
        res = Path(work, "result.json")
        if not res.exists():
            return {"skipped": f"MetaSchedule failed (exit {proc.exitcode}; its traceback is above)"}
        return json.loads(res.read_text())


def ms_missing() -> str | None:
    for mod in ("cloudpickle", "psutil"):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (pip install cloudpickle psutil: MetaSchedule's local builder/runner)"
    return None


# ------------------------------------------------------------------ PyTorch: eager and torch.compile

def torch_fused_seconds(wl, inputs, compiled: bool, repeats: int = 50) -> float:
    """conv2d_bn_relu as PyTorch runs it: conv2d (cuDNN), addcmul (BN folded to scale / shift), relu;
    eager (three kernels) or `torch.compile`d."""
    import torch
    torch.backends.cudnn.benchmark = True
    x, w, scale, shift = (torch.from_numpy(a).cuda() for a in inputs)
    p = wl.p
    if p["layout"] == "NHWC":
        x = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        w = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    scale, shift = scale.view(1, -1, 1, 1), shift.view(1, -1, 1, 1)

    def f(x, w, scale, shift):
        y = torch.nn.functional.conv2d(x, w, stride=p["stride"], padding=p["pad"], dilation=p["dilation"])
        return torch.relu(torch.addcmul(shift, y, scale))
    fn = torch.compile(f) if compiled else f
    for _ in range(10):
        fn(x, w, scale, shift)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, w, scale, shift)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


# ------------------------------------------------------------------ the run

def _fmt(x: float | None, spec: str = ">8.1f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not math.isnan(x) else format("-", spec[:2] + "s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda", help="cuda target name or .toml (default %(default)s)")
    ap.add_argument("--layers", default="all", help=f"comma-separated, from {','.join(ALL)} (default all)")
    ap.add_argument("--fused", default="all", help="3x3 layers for the fused conv+BN+ReLU rows, 'none' to skip")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--fc-batch", type=int, default=256)
    ap.add_argument("--trials", type=int, default=0, help="tuning trials per layer for wmma, mma and MS (0: defaults)")
    ap.add_argument("--ms-trials", type=int, help="MetaSchedule trials (default: --trials, at least 16)")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="build processes")
    ap.add_argument("--no-ms", action="store_true", help="skip the MetaSchedule column")
    ap.add_argument("--ms-timeout", type=float, default=600.0, help="seconds per MetaSchedule layer")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile in the fused rows")
    ap.add_argument("--budget-s", type=float, default=0, help="start no new layer after this many seconds (0: none)")
    ap.add_argument("--json", help="write the rows here (rewritten after every row)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    torch = gpu_torch_or_exit("cuda_mma_vs_peers")
    from opcompiler.backend.cuda import CudaBackend

    from opcompiler.ops import get_op, workload
    from opcompiler.target import load_target
    target = load_target(args.target)
    backend = CudaBackend(target)
    peak = target.peak_flops("float16")
    gpu = torch.cuda.get_device_name(0)
    names = ALL if args.layers == "all" else tuple(x.strip() for x in args.layers.split(","))
    fused = () if args.fused == "none" else (FUSED_PRESETS if args.fused == "all" else
                                             tuple(f"resnet50.{x.strip()}" for x in args.fused.split(",")))
    unknown = [n for n in names if n not in ALL] + [f for f in fused if f not in FUSED_PRESETS]
    if unknown:
        ap.error(f"unknown layers {unknown}; choose from {ALL} (fused: the 3x3 ones)")
    ms_trials = args.ms_trials or max(16, args.trials)
    ms_why = "--no-ms" if args.no_ms else ms_missing()
    if ms_why:
        print(f"cuda_mma_vs_peers: MetaSchedule column skipped: {ms_why}", file=sys.stderr)

    work = [("matmul" if n == "fc" else "conv2d", f"resnet50.{n}", False) for n in names]
    work += [("conv2d_bn_relu", p, True) for p in fused]
    rows: list[dict] = []
    log_dir = tempfile.mkdtemp(prefix="opc_mma_bench_")
    print(f"fp16 on {gpu} (target {target.name}, peak {peak / 1e12:.0f} TFLOPS); trials {args.trials} "
          f"(MetaSchedule {0 if ms_why else ms_trials}); records in {log_dir}", flush=True)
    head = (f"{'layer':<22}{'GFLOP':>7}{'wmma':>8}{'mma':>8}{'MS':>8}{'torch':>8}{'compile':>8}"
            f"{'%peak':>7}{'mma/wmma':>9}{'mma/torch':>10}{'mma/MS':>8}{'mma/cmp':>8}  (TFLOPS)")
    print(head, flush=True)
    for op, preset, is_fused in work:
        if args.budget_s and time.perf_counter() - t_start > args.budget_s:
            print(f"cuda_mma_vs_peers: --budget-s {args.budget_s:.0f} spent; {preset} ({op}) and later rows not run",
                  file=sys.stderr)
            break
        extra = {} if op == "matmul" else {"layout": "NHWC"}
        batch = args.fc_batch if op == "matmul" else args.batch
        wl = workload(op, extra or None, preset=preset, batch=batch, dtype="float16")
        d = get_op(op)
        flops = d.flops(wl)
        row: dict = {"op": op, "preset": preset, "batch": batch, "fused": is_fused, "gflop": flops / 1e9}
        for mma in ("wmma", "mma_sync"):
            try:
                row[mma] = ours(backend, target, wl, mma, args.trials, args.workers, log_dir, check=mma == "mma_sync")
            except Exception as e:  # noqa: BLE001 - one failing column must not lose the run
                row[mma] = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}
        inputs = d.make_inputs(wl, seed=1)
        try:
            row["torch"] = {"seconds": torch_fused_seconds(wl, inputs, compiled=False) if is_fused
                            else torch_seconds(op, wl, inputs)}
        except Exception as e:  # noqa: BLE001
            row["torch"] = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}
        if is_fused and not args.no_compile:
            try:
                row["compile"] = {"seconds": torch_fused_seconds(wl, inputs, compiled=True)}
            except Exception as e:  # noqa: BLE001
                row["compile"] = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}
        if not ms_why:
            try:
                row["ms"] = metaschedule(wl, target, ms_trials, args.ms_timeout)
            except Exception as e:  # noqa: BLE001
                row["ms"] = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}

        def tf(col: str) -> float:
            s = row.get(col, {}).get("seconds")
            return flops / s / 1e12 if s else float("nan")

        def ratio(a: str, b: str) -> float:
            return tf(a) / tf(b) if tf(b) > 0 else float("nan")
        for col in ("wmma", "mma_sync", "ms", "torch", "compile"):
            if col in row and "seconds" in row[col]:
                row[col]["tflops"] = tf(col)
        best = max((tf(c) for c in ("wmma", "mma_sync") if not math.isnan(tf(c))), default=float("nan"))
        row["percent_of_peak"] = 100 * best * 1e12 / peak if peak and not math.isnan(best) else None
        row["ratios"] = {"mma/wmma": ratio("mma_sync", "wmma"), "mma/torch": ratio("mma_sync", "torch"),
                         "mma/ms": ratio("mma_sync", "ms"), "mma/compile": ratio("mma_sync", "compile")}
        wrong = row["mma_sync"].get("correct") is False
        label = ("fused " if is_fused else "") + preset.split(".")[1] + (" WRONG" if wrong else "")
        print(f"{label:<22}{row['gflop']:>7.1f}{_fmt(tf('wmma'))}{_fmt(tf('mma_sync'))}{_fmt(tf('ms'))}"
              f"{_fmt(tf('torch'))}{_fmt(tf('compile'))}{_fmt(row['percent_of_peak'], '>7.1f')}"
              f"{_fmt(row['ratios']['mma/wmma'], '>9.2f')}{_fmt(row['ratios']['mma/torch'], '>10.2f')}"
              f"{_fmt(row['ratios']['mma/ms'], '>8.2f')}{_fmt(row['ratios']['mma/compile'], '>8.2f')}", flush=True)
        for col in ("wmma", "mma_sync", "ms", "torch", "compile"):
            if "skipped" in row.get(col, {}):
                print(f"    {col}: {row[col]['skipped']}", flush=True)
        if row["mma_sync"].get("split_k_sweep"):
            times = ", ".join(f"{s}: {v * 1e6:.1f} us" if isinstance(v, float) else f"{s}: {v[:60]}"
                              for s, v in row["mma_sync"]["split_k_sweep"].items())
            print(f"    mma split_k {row['mma_sync']['config'].get('split_k')} kept ({times})", flush=True)
        rows.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps({"gpu": gpu, "target": target.name, "trials": args.trials,
                                                   "ms_trials": None if ms_why else ms_trials, "rows": rows},
                                                  indent=1, default=str))
    geo = {}
    for key in ("mma/wmma", "mma/torch", "mma/ms", "mma/compile"):
        xs = [r["ratios"][key] for r in rows if not math.isnan(r["ratios"][key]) and r["ratios"][key] > 0]
        if xs:
            geo[key] = statistics.geometric_mean(xs)
    print("geometric means: " + (", ".join(f"{k} {v:.2f}" for k, v in geo.items()) or "none"), flush=True)
    print(f"wall {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
