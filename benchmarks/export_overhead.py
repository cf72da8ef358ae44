"""Call overhead of the export bindings against a direct TVM call of the same kernel.

    python benchmarks/export_overhead.py            # tiny relu (pure overhead) and a ResNet-50 conv+bn+relu
    python benchmarks/export_overhead.py --quick    # the tiny kernel only

For each kernel, all in one process on the same inputs: the direct call of the loaded TVM
function on preallocated TVM tensors (the floor), the plain-Python loader on numpy arrays,
`torch.ops.opcompiler.<name>` on torch tensors (DLPack, no copies), the drop-in
`OpcConvBnReLU` module (folds BN every call), and torch's own layers for reference. Median of
repeated timings; ratios are against the direct call measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _median_us(fn: Callable[[], object], min_time: float = 0.3, repeats: int = 7) -> float:
    fn()  # warm-up
    n, t0 = 1, time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / repeats / once))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples) * 1e6


def bench(op: str, shape: str, out: Path) -> list[tuple[str, float]]:
    import torch
    import tvm

    from opcompiler.export import export, import_folder
    from opcompiler.ops import get_op, workload
    from opcompiler.target import load_target

    wl = workload(op, shape)
    export(wl, load_target("cpu"), "default", to="torch,lib", out=out, name=f"bench_{op}", progress=False)
    pkg = import_folder(out)
    k = pkg.kernel
    ins = get_op(op).make_inputs(wl, seed=0)
    tv = [tvm.runtime.tensor(x, tvm.cpu()) for x in ins]
    tv_out = tvm.runtime.tensor(np.zeros(k.output["shape"], k.output["dtype"]), tvm.cpu())
    tins = [torch.tensor(x) for x in ins]  # torch's allocator: 64-byte aligned, so DLPack without copies
    rows = [("direct TVM call (preallocated tvm tensors)", _median_us(lambda: k._fn(*tv, tv_out))),
            ("lib: kernel(*numpy)", _median_us(lambda: k(*ins))),
            (f"torch.ops.opcompiler.bench_{op}", _median_us(lambda: pkg.op(*tins)))]
    with torch.no_grad():
        if op == "conv2d_bn_relu":
            mod = pkg.OpcConvBnReLU(k)
            x = tins[0]
            rows.append(("OpcConvBnReLU module (folds BN per call)", _median_us(lambda: mod(x))))
            p = wl.p
            ref = torch.nn.Sequential(torch.nn.Conv2d(p["c"], p["k"], p["r"], padding=p["pad"], bias=False),
                                      torch.nn.BatchNorm2d(p["k"]), torch.nn.ReLU()).eval()
            nth = torch.get_num_threads()
            rows.append((f"torch Conv2d+BatchNorm2d+ReLU, {nth} threads", _median_us(lambda: ref(x))))
            # OpenMP's barriers collapse when another process holds a core (a shared machine): say so
            torch.set_num_threads(1)
            rows.append(("torch Conv2d+BatchNorm2d+ReLU, 1 thread", _median_us(lambda: ref(x))))
            torch.set_num_threads(nth)
        elif op == "relu":
            rows.append(("torch.relu", _median_us(lambda: torch.relu(tins[0]))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the tiny kernel")
    args = ap.parse_args()
    import os
    # What importing a torch export does in a user's process; here the export (which runs the
    # kernel to verify it) would otherwise start TVM's pool with spinning workers first.
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    from opcompiler.settings import init_tvm_threads
    init_tvm_threads()
    cases = [("relu", "n=1,c=4,h=4,w=4")]
    if not args.quick:
        cases.append(("conv2d_bn_relu", "resnet50.res2_3x3"))
    with tempfile.TemporaryDirectory() as tmp:
        for op, shape in cases:
            rows = bench(op, shape, Path(tmp) / op)
            base = rows[0][1]
            print(f"\n{op} {shape}")
            print(f"  {'call':<48} {'us/call':>10} {'vs direct':>10} {'overhead us':>12}")
            for name, us in rows:
                print(f"  {name:<48} {us:>10.1f} {us / base:>9.2f}x {us - base:>12.1f}")


if __name__ == "__main__":
    main()
