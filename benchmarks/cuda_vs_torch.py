"""fp16 conv2d and matmul on the ResNet-50 presets: our CUDA kernels against PyTorch
(cuDNN / cuBLAS) on the same GPU, measured side by side in one run.

    python benchmarks/cuda_vs_torch.py                       # template defaults (or best records)
    python benchmarks/cuda_vs_torch.py --tune 64             # tune each layer first (64 trials)
    python benchmarks/cuda_vs_torch.py --batch 32 --json out.json

Prints one row per layer: TFLOPS of ours and of PyTorch, and ours / PyTorch. Needs an NVIDIA
GPU and PyTorch with CUDA; without them it says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

CONV_PRESETS = ("resnet50.conv1", "resnet50.res2_1x1a", "resnet50.res2_3x3", "resnet50.res2_1x1b",
                "resnet50.res3_3x3", "resnet50.res3_1x1b", "resnet50.res4_3x3", "resnet50.res4_1x1b",
                "resnet50.res5_3x3", "resnet50.res5_1x1b")
MATMUL_PRESETS = ("resnet50.fc",)


def gpu_torch_or_exit(script: str):
    """PyTorch, once TVM sees a CUDA GPU and PyTorch sees CUDA; otherwise one line naming what is
    missing, and exit status 2 (shared by the GPU benchmarks)."""
    from opcompiler.backend.cuda import has_gpu

    def no_gpu(why: str) -> None:
        print(f"{script}: {why}; this benchmark needs an NVIDIA GPU (nothing was measured)", file=sys.stderr)
        sys.exit(2)

    if not has_gpu():
        no_gpu("no CUDA GPU found (tvm.cuda(0).exist is False)")
    try:
        import torch
    except ImportError:
        no_gpu("PyTorch is not installed (pip install 'opcompiler[torch]')")
    if not torch.cuda.is_available():
        no_gpu("PyTorch sees no CUDA device")
    return torch


def torch_seconds(op: str, wl, inputs, repeats: int = 50) -> float:
    """PyTorch's time for the same layer: cuDNN (benchmark mode) for conv, cuBLAS for matmul."""
    import torch
    torch.backends.cudnn.benchmark = True
    xs = [torch.from_numpy(x).cuda() for x in inputs]
    p = wl.p
    if op == "conv2d":
        x, w = xs
        if p["layout"] == "NHWC":  # our HWIO weights -> torch OIHW, channels_last memory format
            x = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            w = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)

        def call():
            return torch.nn.functional.conv2d(x, w, stride=p["stride"], padding=p["pad"], dilation=p["dilation"],
                                              groups=p["groups"])
    else:
        a, b = xs

        def call():
            return a @ b
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda", help="cuda target name or .toml (default %(default)s)")
    ap.add_argument("--batch", type=int, default=32, help="batch of the conv layers (default %(default)s)")
    ap.add_argument("--fc-batch", type=int, default=256, help="rows of the fc matmul (default %(default)s)")
    ap.add_argument("--layout", choices=("NCHW", "NHWC"), default="NHWC", help="conv layout (default %(default)s)")
    ap.add_argument("--tune", type=int, default=0, help="tune each layer for N trials first (default: no)")
    ap.add_argument("--config", default="best", help="best (best record, else default) or default")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)

    torch = gpu_torch_or_exit("cuda_vs_torch")
    from opcompiler.backend.cuda import CudaBackend

    from tqdm import tqdm

    from opcompiler.api import resolve_config
    from opcompiler.ops import get_op, workload
    from opcompiler.target import load_target
    target = load_target(args.target)
    backend = CudaBackend(target)
    layers = [("conv2d", p, {"layout": args.layout}, args.batch) for p in CONV_PRESETS]
    layers += [("matmul", p, {}, args.fc_batch) for p in MATMUL_PRESETS]
    rows = []
    for op, preset, extra, batch in tqdm(layers, desc="layers", unit="layer"):
        wl = workload(op, extra or None, preset=preset, batch=batch, dtype="float16")
        if args.tune:
            from opcompiler.tune import tune
            tune(op, target, shape=dict(wl.params), dtype="float16", trials=args.tune, progress=False)
        cfg = resolve_config(wl, target, "best") if args.config == "best" else None
        kernel = backend.build(wl, cfg)
        d = get_op(op)
        inputs = d.make_inputs(wl)
        ours = backend.measure(kernel, inputs).seconds
        theirs = torch_seconds(op, wl, inputs)
        flops = d.flops(wl)
        rows.append({"op": op, "preset": preset, "batch": batch, "config": kernel.config,
                     "ours_tflops": flops / ours / 1e12, "torch_tflops": flops / theirs / 1e12,
                     "ratio": theirs / ours})
    gpu = torch.cuda.get_device_name(0)
    print(f"\nfp16 on {gpu} (target {target.name}, peak {target.peak_flops('float16') / 1e12:.0f} TFLOPS)")
    print(f"{'layer':<24}{'batch':>6}{'ours TFLOPS':>13}{'torch TFLOPS':>14}{'ours/torch':>12}")
    for r in rows:
        print(f"{r['preset']:<24}{r['batch']:>6}{r['ours_tflops']:>13.1f}{r['torch_tflops']:>14.1f}{r['ratio']:>12.2f}")
    geo = statistics.geometric_mean([r["ratio"] for r in rows])
    print(f"{'geometric mean':<30}{'':>27}{geo:>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "target": target.name, "rows": rows, "geomean_ratio": geo}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
