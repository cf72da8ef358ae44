"""Default CPU schedules on the ResNet-50 conv presets against numpy (im2col + BLAS sgemm) and,
when torch is installed, PyTorch CPU (oneDNN) in NCHW and channels-last, all measured in the
same run. Prints a GFLOPS table and the ratios.

    python benchmarks/cpu_default.py [--presets resnet50.res2_3x3,...] [--batch 1] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402

from opcompiler.backend import get_backend  # noqa: E402
from opcompiler.ops import PRESETS, get_op, workload  # noqa: E402
from opcompiler.target import load_target  # noqa: E402
from opcompiler.verify import compare  # noqa: E402

from _timing import bench  # noqa: E402  (benchmarks/ is on sys.path when a script runs)




def numpy_im2col(x: np.ndarray, w: np.ndarray, stride: int, pad: int):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    wmat = w.reshape(k, -1)

    def run():
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (r, s), axis=(2, 3))[:, :, ::stride, ::stride]
        ho, wo = win.shape[2], win.shape[3]
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, c * r * s)
        return (cols @ wmat.T).reshape(n, ho, wo, k).transpose(0, 3, 1, 2)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default=",".join(k for k in PRESETS if k.startswith("resnet50.") and k != "resnet50.fc"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None
    backend = get_backend(load_target("cpu"))
    # Each library is timed in its own phase: thread pools that keep spinning after a call
    # (TVM's, OpenBLAS's, torch's OpenMP) would otherwise steal the cores from the next one.
    cases = []
    for name in args.presets.split(","):
        wl = workload("conv2d", preset=name, batch=args.batch, dtype="float32")
        op = get_op("conv2d")
        ins = op.make_inputs(wl)
        kernel = backend.build(wl)
        ok, _ = compare(backend.run(kernel, ins).outputs[0], op.reference(wl, ins))
        cases.append((name, wl, op.flops(wl), ins, kernel, ok))
    rows = []
    for name, wl, flops, ins, kernel, ok in cases:
        secs = min(backend.measure(kernel, ins).seconds for _ in range(3))
        rows.append({"preset": name, "correct": ok, "gflop": flops / 1e9, "opcompiler": flops / secs / 1e9})
        print(f"  {name}: {rows[-1]['opcompiler']:.1f} GFLOPS", file=sys.stderr)
    for row, (name, wl, flops, ins, kernel, ok) in zip(rows, cases):
        row["numpy"] = flops / bench(numpy_im2col(ins[0], ins[1], wl["stride"], wl["pad"])) / 1e9
    if torch is not None:
        for row, (name, wl, flops, ins, kernel, ok) in zip(rows, cases):
            xt, wt = torch.from_numpy(ins[0]), torch.from_numpy(ins[1])
            with torch.no_grad():
                f = lambda: torch.nn.functional.conv2d(xt, wt, stride=wl["stride"], padding=wl["pad"])  # noqa: E731
                row["torch"] = flops / bench(f) / 1e9
                xc = xt.contiguous(memory_format=torch.channels_last)
                wc = wt.contiguous(memory_format=torch.channels_last)
                f = lambda: torch.nn.functional.conv2d(xc, wc, stride=wl["stride"], padding=wl["pad"])  # noqa: E731
                row["torch_nhwc"] = flops / bench(f) / 1e9
    if args.json:
        print(json.dumps(rows))
        return 0
    cols = ["opcompiler", "numpy"] + (["torch", "torch_nhwc"] if torch is not None else [])
    print(f"\nconv2d fp32, batch {args.batch}, {os.cpu_count()} threads; GFLOPS (higher is better), "
          f"measured in one run")
    head = f"{'preset':<22}{'GFLOP':>7}" + "".join(f"{c:>12}" for c in cols) + "".join(
        f"{'x/' + c:>13}" for c in cols[1:]) + "  ok"
    print(head)
    for r in rows:
        print(f"{r['preset']:<22}{r['gflop']:>7.3f}" + "".join(f"{r[c]:>12.1f}" for c in cols)
              + "".join(f"{r['opcompiler'] / r[c]:>13.2f}" for c in cols[1:]) + f"  {'yes' if r['correct'] else 'NO'}")
    geo = {c: float(np.exp(np.mean([np.log(r["opcompiler"] / r[c]) for r in rows]))) for c in cols[1:]}
    print("geomean speedup of opcompiler's default schedule: " + ", ".join(f"{v:.2f}x vs {c}" for c, v in geo.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
