"""Transformer models as users write them, end to end: what runs on the target, what falls back to
the host, fused vs unfused, and whether the values match onnxruntime.

    python benchmarks/transformer.py [--targets cpu,ascend-sim,dsp-sim] [--models ffn,encoder]
                                     [--seq 128] [--hidden 256] [--heads 4] [--layers 2] [--json out.json]

Models (torch.nn, exported by torch.onnx at opset 17, batch 1):
  ffn       Linear -> GELU -> Linear, residual, LayerNorm (a transformer layer without attention)
  encoder   nn.TransformerEncoder (GELU, batch_first), `--layers` layers: the BERT-style encoder
  encoder14 the same exported at opset 14 (LayerNorm written out as ReduceMean, Sub, Pow, ...)

Each (model, target) runs `opcompiler compare MODEL --target T --fallback cpu --json` in a
subprocess with an empty log directory. The row gives the kernels on the target and on the host,
fused and unfused cycles (seconds on cpu) and their ratio, the host's share of the whole-model
time (the host's wall-clock time added to the target's), and whether all three plans match
onnxruntime.

Then the attention sweep on ascend-sim (`--sweep-sq 256,512,1024,2048,4096 --sweep-d 64,128`,
b=1, h=16, fp16, causal or not, timing mode, template defaults): the fused kernel's cycles and %
of the cube's peak, and the unfused path at the same shape, three kernels with the scores
through GM (batch_matmul Q K^T with trans_b, softmax over the keys, batch_matmul P V; the scale
folded into Q, the causal mask not applied: the unfused figure is a lower bound), up to
`--unfused-max-sq` (the unfused softmax of 2048 x 2048 scores per head takes minutes to emit).
`--sweep-sq ""` skips the sweep.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from default_quality import compare_json  # benchmarks/ is the script's folder: on sys.path


def export(name: str, out: Path, seq: int, hidden: int, heads: int, layers: int) -> Path:
    import torch
    torch.manual_seed(0)
    path = out / f"{name}.onnx"
    x = torch.randn(1, seq, hidden)
    if name == "ffn":
        class Ffn(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)
                self.ln = torch.nn.LayerNorm(hidden)

            def forward(self, x):
                return self.ln(x + self.b(torch.nn.functional.gelu(self.a(x))))
        m, opset = Ffn(), 17
    else:
        layer = torch.nn.TransformerEncoderLayer(d_model=hidden, nhead=heads, dim_feedforward=4 * hidden, dropout=0.0,
                                                 batch_first=True, activation="gelu")
        m = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        opset = 14 if name == "encoder14" else 17
    torch.onnx.export(m.eval(), (x,), str(path), opset_version=opset, input_names=["x"], output_names=["y"],
                      dynamo=False)
    return path


def row(name: str, path: Path, target: str, timeout: int) -> dict:
    d, err, wall = compare_json(path, target, ["--fallback", "cpu"], timeout)
    if d is None:
        return {"model": name, "target": target, "error": err[:200]}
    f, u = d["fused"]["totals"], d["unfused"]["totals"]
    cyc = f["cycles"] is not None
    wh = d.get("with_host") or {}
    share = (wh["host_seconds"][0] / wh["seconds"][0]) if wh else 0.0
    return {"model": name, "target": target, "kernels": f["kernels"], "host_nodes": f["host_nodes"],
            "fused": f["cycles"] if cyc else f["seconds"], "unfused": u["cycles"] if cyc else u["seconds"],
            "unit": "cycles" if cyc else "s", "speedup": d["speedup"], "host_share": share,
            "correct": all(v is True for v in d["correct"].values()), "wall": wall}


def attention_sweep(sqs: list[int], ds: list[int], unfused_max_sq: int, heads: int = 16) -> list[dict]:
    """Fused attention vs the three-kernel path on ascend-sim (see the module docstring)."""
    from opcompiler.backend import get_backend
    from opcompiler.ops import workload
    from opcompiler.target import load_target

    be = get_backend(load_target("ascend-sim"))

    def cycles(op: str, shape: str) -> tuple[int, float, int]:
        res = be.measure(be.build(workload(op, shape, dtype="float16")))
        gm = sum(v for k, v in res.metrics["bytes_by_level"].items() if k.startswith("GM"))
        return res.cycles, res.metrics["percent_of_peak"], gm

    print(f"\nattention on ascend-sim, fp16, b=1, h={heads}, template defaults, timing mode")
    print(f"{'sq=skv':>7} {'d':>4} {'causal':>6} {'fused cyc':>12} {'% peak':>7} {'unfused cyc':>12} "
          f"{'scores in GM':>13} {'f/u':>6}")
    out = []
    for sq in sqs:
        for d in ds:
            for causal in (0, 1):
                fc, pk, _ = cycles("attention", f"b=1,h={heads},sq={sq},skv={sq},d={d},causal={causal}")
                r = {"sq": sq, "d": d, "causal": causal, "fused": fc, "percent_of_peak": pk}
                if sq <= unfused_max_sq:
                    bh = heads
                    parts = [cycles("batch_matmul", f"b={bh},m={sq},k={d},n={sq},trans_b=1"),
                             cycles("softmax", f"m={bh * sq},n={sq}"),
                             cycles("batch_matmul", f"b={bh},m={sq},k={sq},n={d}")]
                    r["unfused"] = sum(c for c, _, _ in parts)
                    r["scores_gm_bytes"] = 4 * bh * sq * sq * 2  # written, read, written (P), read, fp16
                uf = f"{r['unfused']:,}" if "unfused" in r else "-"
                ratio = f"{r['unfused'] / fc:.2f}x" if "unfused" in r else "-"
                gm = f"{r['scores_gm_bytes'] / 2**20:.0f} MiB" if "unfused" in r else "-"
                print(f"{sq:>7} {d:>4} {causal:>6} {fc:>12,} {pk:>6.1f}% {uf:>12} {gm:>13} {ratio:>6}", flush=True)
                out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="cpu,ascend-sim,dsp-sim")
    ap.add_argument("--models", default="ffn,encoder")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--sweep-sq", default="256,512,1024,2048,4096")
    ap.add_argument("--sweep-d", default="64,128")
    ap.add_argument("--unfused-max-sq", type=int, default=1024)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    print(f"batch 1, sequence {a.seq}, hidden {a.hidden}, {a.heads} heads, {a.layers} layers; "
          "--fallback cpu, empty log directory\n")
    print(f"{'model':<10} {'target':<11} {'kernels':>7} {'host':>5} {'fused':>14} {'unfused':>14} {'f/u':>6} "
          f"{'host %':>7} {'correct':>7} {'wall':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            path = export(name, Path(tmp), a.seq, a.hidden, a.heads, a.layers)
            for t in a.targets.split(","):
                r = row(name, path, t, a.timeout)
                rows.append(r)
                if "error" in r:
                    print(f"{name:<10} {t:<11} error: {r['error']}", flush=True)
                    continue
                fmt = (lambda v: f"{v:,}") if r["unit"] == "cycles" else (lambda v: f"{v * 1e6:.1f} us")
                print(f"{name:<10} {t:<11} {r['kernels']:>7} {r['host_nodes']:>5} {fmt(r['fused']):>14} "
                      f"{fmt(r['unfused']):>14} {r['speedup']:>5.2f}x {r['host_share']:>6.0%} "
                      f"{'yes' if r['correct'] else 'NO':>7} {r['wall']:>5.0f}s", flush=True)
    sweep = attention_sweep([int(v) for v in a.sweep_sq.split(",") if v], [int(v) for v in a.sweep_d.split(",")],
                            a.unfused_max_sq) if a.sweep_sq else []
    if a.json:
        Path(a.json).write_text(json.dumps({"models": rows, "attention": sweep}, indent=1))
    return 0 if all(r.get("correct") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
