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
onnxruntime. The attention kernel with on-chip scores (issue 33) is not built yet: the
encoder's batched MatMuls (Q K^T, P V) are the host nodes, and there is no attention sweep to print.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="cpu,ascend-sim,dsp-sim")
    ap.add_argument("--models", default="ffn,encoder")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600)
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
    print("\nattention sweep (sq 256-4096, d 64/128): not run: the fused attention kernel is not built yet")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("correct") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
