"""Fused vs unfused whole graphs: the figures of docs/graph.md (Figures).

    python benchmarks/graph_compare.py [--quick] [--json out.json] [--plots DIR]

For the shipped ResNet-50 conv2_x stage (batch 1) and the MiniGo network (seed 004 Table 1,
batch 96 as in the paper's Table 3) on ascend-sim and dsp-sim: total cycles and off-chip bytes of
the fused and the unfused plan and their ratios (both plans checked against onnxruntime). On the
host CPU: real seconds, fused vs unfused (fastest of 5 timings per kernel). Compile time of the
whole ResNet-50 stage. A ResNet-18 (torchvision's, exported with random weights when torch is
installed; otherwise the same architecture built with onnx.helper) on cpu and ascend-sim.
Nodes a simulator has no template for (softmax, the value head's sigmoid chain on dsp-sim) run
on the host (--fallback cpu) and are listed, not counted in the simulator totals.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from opcompiler.graph import compare, load, make_plan
from opcompiler.graph.executor import compile_plan
from opcompiler.graph.models import write


def _models(outdir: Path, quick: bool) -> dict[str, tuple[Path, int]]:
    out = {
        "resnet50_stage": (write("resnet50_stage", outdir / "resnet50_stage.onnx", **({"hw": 28} if quick else {})), 1),
        "minigo": (write("minigo", outdir / "minigo.onnx", **({"res_blocks": 2} if quick else {})), 8 if quick else 96),
    }
    return out


def _resnet18(outdir: Path, quick: bool) -> tuple[Path, str]:
    hw = 112 if quick else 224
    try:
        import torch
        import torchvision
    except ImportError:
        return write("resnet18", outdir / "resnet18.onnx", hw=hw), "onnx.helper (torch not installed)"
    model = torchvision.models.resnet18(weights=None).eval()
    path = outdir / "resnet18_torch.onnx"
    torch.onnx.export(model, torch.randn(1, 3, hw, hw), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, opset_version=17)
    return path, f"torchvision {torchvision.__version__} export"


def _row(name: str, target: str, batch: int, c, check: bool) -> dict:
    s = c.summary()
    f, u = c.fused.totals(), c.unfused.totals()
    return {"model": name, "target": target, "batch": batch, "kernels": [f["kernels"], u["kernels"]],
            "cycles": list(s["cycles"]) if "cycles" in s else None, "seconds": [f["seconds"], u["seconds"]],
            "offchip_bytes": [f["offchip_bytes"], u["offchip_bytes"]], "speedup": s["speedup"],
            "offchip_ratio": s["offchip_ratio"], "host_nodes": [f["host_nodes"], u["host_nodes"]],
            "correct": [c.fused.correct, c.unfused.correct] if check else None,
            "compile_seconds": [c.fused.compile_seconds, c.unfused.compile_seconds]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller models (a smoke run, not the docs/graph.md figures)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--plots", help="write a fused-vs-unfused plot per row into this folder")
    ap.add_argument("--no-check", action="store_true", help="timing mode only (skip values and onnxruntime)")
    ap.add_argument("--tune-trials", type=int, default=16,
                    help="tune the ResNet-50 stage's kernels on ascend-sim first (0: skip) for the with-records row")
    args = ap.parse_args()
    check = not args.no_check
    tmp = Path(tempfile.mkdtemp(prefix="opc_models_"))
    rows = []
    models = _models(tmp, args.quick)

    print("## simulators: fused vs unfused (cycles, off-chip bytes)\n")
    print("| model | target | batch | kernels f/u | cycles fused | cycles unfused | speedup | off-chip fused | "
          "off-chip unfused | bytes ratio | host nodes f/u | matches onnxruntime |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (path, batch) in models.items():
        g = load(path, batch=batch)
        for target in ("ascend-sim", "dsp-sim"):
            c = compare(g, target, fallback="cpu", check=check)
            r = _row(name, c.fused.plan.target.name, batch, c, check)
            rows.append(r)
            _plot(args.plots, c, f"{name}_{target}")
            print(f"| {name} | {r['target']} | {batch} | {r['kernels'][0]}/{r['kernels'][1]} | {r['cycles'][0]:,} | "
                  f"{r['cycles'][1]:,} | {r['speedup']:.2f}x | {r['offchip_bytes'][0] / 1e6:.2f} MB | "
                  f"{r['offchip_bytes'][1] / 1e6:.2f} MB | {r['offchip_ratio']:.2f}x | {r['host_nodes'][0]}/"
                  f"{r['host_nodes'][1]} | {_ok(r)} |", flush=True)

    print("\n## host CPU: fused vs unfused (real seconds, fastest of 5 per kernel)\n")
    print("| model | batch | kernels f/u | fused | unfused | speedup | compulsory bytes ratio | matches |")
    print("|---|---|---|---|---|---|---|---|")
    r18, r18_src = _resnet18(tmp, args.quick)
    for name, (path, batch) in list(models.items()) + [("resnet18", (r18, 1))]:
        c = compare(load(path, batch=batch), "cpu", check=check, repeat=5)
        r = _row(name, "cpu", batch, c, check)
        rows.append(r)
        _plot(args.plots, c, f"{name}_cpu")
        print(f"| {name} | {batch} | {r['kernels'][0]}/{r['kernels'][1]} | {r['seconds'][0] * 1e3:.2f} ms | "
              f"{r['seconds'][1] * 1e3:.2f} ms | {r['speedup']:.2f}x | {r['offchip_ratio']:.2f}x | {_ok(r)} |",
              flush=True)

    print(f"\n## ResNet-18 ({r18_src}) on ascend-sim\n")
    c = compare(load(r18, batch=1), "ascend-sim", fallback="cpu", check=check)
    r = _row("resnet18", c.fused.plan.target.name, 1, c, check)
    rows.append(r)
    _plot(args.plots, c, "resnet18_ascend-sim")
    print(f"fused {r['cycles'][0]:,} cycles, unfused {r['cycles'][1]:,} ({r['speedup']:.2f}x); off-chip "
          f"{r['offchip_bytes'][0] / 1e6:.2f} MB vs {r['offchip_bytes'][1] / 1e6:.2f} MB ({r['offchip_ratio']:.2f}x); "
          f"host nodes {r['host_nodes']}; matches onnxruntime: {_ok(r)}")

    print("\n## compile time of the whole ResNet-50 stage (fused plan, best record or template default)\n")
    path, batch = models["resnet50_stage"]
    for target in ("cpu", "ascend-sim", "dsp-sim"):
        plan = make_plan(load(path, batch=batch), target, fallback="cpu")
        t0 = time.perf_counter()
        built, secs = compile_plan(plan)
        total = time.perf_counter() - t0
        kernels = [b for _, b in built if b is not None]
        recs = sum(b.config_source == "tuning record" for b in kernels)
        distinct = len({b.kernel.workload.key_str() for b in kernels})
        print(f"{plan.target.name}: {len(kernels)} kernels ({distinct} distinct builds), {recs} from tuning records: "
              f"{total:.2f} s", flush=True)
        rows.append({"model": "resnet50_stage", "target": plan.target.name, "compile_seconds": total,
                     "kernels": len(kernels), "from_records": recs})
    if args.tune_trials:
        rows += _with_records(path, batch, tmp / "logs", args.tune_trials)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _with_records(path: Path, batch: int, logdir: Path, trials: int) -> list[dict]:
    """Tune every distinct kernel of both plans of the stage on ascend-sim (`opcompiler tune`, records in a
    private log dir), then compile and run the stage again: records present."""
    import os
    import subprocess

    from opcompiler.settings import settings

    print(f"\n## ResNet-50 stage on ascend-sim with tuning records ({trials} trials per distinct kernel, "
          "fused and unfused)\n")
    plan = make_plan(load(path, batch=batch), "ascend-sim")
    wls = {}
    for p in (plan, make_plan(load(path, batch=batch), "ascend-sim", fused=False)):  # both plans, a fair ratio
        wls.update({p.workload(g).key_str(): p.workload(g) for g in p.groups if g.op not in ("view", "host")})
    env = {**os.environ, "OPC_LOG_DIR": str(logdir)}
    t0 = time.perf_counter()
    for wl in wls.values():
        cli = "import sys; from opcompiler.cli import main; sys.exit(main())"
        subprocess.run([sys.executable, "-c", cli, "tune", wl.op, "--target", "ascend-sim", "--shape",
                        ",".join(f"{k}={v}" for k, v in wl.params), "--dtype", wl.dtype, "--trials", str(trials)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
    tune_s = time.perf_counter() - t0
    os.environ["OPC_LOG_DIR"] = str(logdir)
    settings.cache_clear()
    t0 = time.perf_counter()
    built, _ = compile_plan(plan)
    comp_s = time.perf_counter() - t0
    recs = sum(b.config_source == "tuning record" for _, b in built if b is not None)
    c = compare(load(path, batch=batch), "ascend-sim")
    r = _row("resnet50_stage (tuned)", c.fused.plan.target.name, batch, c, True)
    print(f"tuned {len(wls)} distinct kernels in {tune_s:.0f} s; compile with records: {comp_s:.2f} s "
          f"({recs} of {len(built)} kernels from records)")
    print(f"fused {r['cycles'][0]:,} cycles, unfused {r['cycles'][1]:,} ({r['speedup']:.2f}x); off-chip "
          f"{r['offchip_bytes'][0] / 1e6:.2f} MB vs {r['offchip_bytes'][1] / 1e6:.2f} MB ({r['offchip_ratio']:.2f}x); "
          f"matches onnxruntime: {_ok(r)}")
    return [r, {"model": "resnet50_stage", "target": "ascend910-sim", "compile_seconds_with_records": comp_s,
                "from_records": recs, "tune_seconds": tune_s}]


def _ok(r: dict) -> str:
    if r["correct"] is None:
        return "not checked"
    return "yes" if all(r["correct"]) else "NO"


def _plot(folder: str | None, c, stem: str) -> None:
    if folder:
        from opcompiler.graph import plot_compare
        plot_compare(c, Path(folder) / f"{stem}.png")


if __name__ == "__main__":
    sys.exit(main())
