"""Recurrent layers end to end: the fused persistent cell against the op-by-op plan, and where
each sits on the roofline (seed 000 §5.3.3 and Fig. 9: the RNN as frameworks run it is memory
bound on the NPU; with the cell fused it should not be).

    python benchmarks/recurrent.py [--targets ascend-sim,dsp-sim] [--models lstm,gru]
                                   [--t 100] [--batch 64] [--hidden 512] [--json out.json]

Each model is torch.nn (`nn.LSTM(H, H)` / `nn.GRU(H, H)`, sequence first, input size = hidden),
exported by torch.onnx at opset 14, and run with `opcompiler compare MODEL --target T
--timing-only --json` in a subprocess with an empty log directory (template defaults). The fused
plan is the one `lstm` / `gru` kernel; the unfused plan is what an op-by-op framework runs
(`opcompiler/ops/opbyop.py`: the input projection, then per step the h R^T matmul and the gate
kernels, every intermediate through GM). The table gives cycles, off-chip bytes, the arithmetic
intensity (FLOPs / off-chip byte: the model's FLOPs for both plans) against the target's ridge
point (peak FLOP/s / off-chip bandwidth, from the target file), which side of it each plan lies
on, and fused / unfused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def export(kind: str, out: Path, t: int, b: int, h: int) -> Path:
    import warnings

    import torch

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(h, h)

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    path = out / f"{kind}_t{t}_b{b}_h{h}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(One().eval(), (torch.randn(t, b, h),), str(path), dynamo=False, opset_version=14,
                          input_names=["x"])
    return path


def ridge(target: str) -> tuple[float, float, float]:
    """(peak FLOP/s of the cube / the fp32 lanes, off-chip bytes/s, ridge FLOP/byte) of `target`."""
    from opcompiler.target import load_target

    tgt = load_target(target)
    dt = "float16" if target.startswith("ascend") else "float32"
    peak = tgt.peak_flops_per_cycle.get(dt, 0.0) * tgt.clock_ghz * 1e9 * tgt.cores
    off = next(m for m in tgt.memories if m.scope == "global" and m.shared).bandwidth_gbps * 1e9
    return peak, off, peak / off


def compare(model: Path, target: str, logs: Path) -> dict:
    env = dict(os.environ, OPC_LOG_DIR=str(logs))
    out = subprocess.run([sys.executable, "-m", "opcompiler", "compare", str(model), "--target", target,
                          "--timing-only", "--json"], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"compare {model.name} on {target} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--models", default="lstm,gru")
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind in args.models.split(","):
            model = export(kind, tmp, args.t, args.batch, args.hidden)
            for target in args.targets.split(","):
                logs = tmp / f"logs-{kind}-{target}"
                logs.mkdir()
                c = compare(model, target, logs)
                peak, off, ridge_pt = ridge(target)
                row = {"model": kind, "target": target, "t": args.t, "batch": args.batch, "hidden": args.hidden,
                       "ridge_flop_per_byte": round(ridge_pt, 1)}
                flops = c["fused"]["totals"]["flops"]
                for plan in ("fused", "unfused"):
                    tot = c[plan]["totals"]
                    ai = flops / tot["offchip_bytes"] if tot["offchip_bytes"] else float("inf")
                    row[plan] = {"kernels": tot["kernels"], "cycles": tot["cycles"], "seconds": tot["seconds"],
                                 "offchip_bytes": tot["offchip_bytes"], "intensity": round(ai, 1),
                                 "side": "compute" if ai >= ridge_pt else "memory",
                                 "percent_of_peak": round(100 * flops / tot["seconds"] / peak, 2)}
                row["fused_vs_unfused"] = round(c["speedup"], 2)
                rows.append(row)
                f, u = row["fused"], row["unfused"]
                print(f"{kind:<5} {target:<11} fused {f['cycles']:>12,} cyc  {f['kernels']:>5} kernel(s)  "
                      f"AI {f['intensity']:>8.1f} ({f['side']}, {f['percent_of_peak']:.1f}% peak) | unfused "
                      f"{u['cycles']:>12,} cyc {u['kernels']:>5} kernels AI {u['intensity']:>7.1f} ({u['side']}, "
                      f"{u['percent_of_peak']:.1f}% peak) | ridge {ridge_pt:.1f} | fused/unfused "
                      f"{row['fused_vs_unfused']:.2f}x", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
