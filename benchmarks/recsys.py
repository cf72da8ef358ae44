"""Recommender models end to end: what fusing the sparse part buys (issue 34, item 2).

    python benchmarks/recsys.py [--targets ascend-sim,dsp-sim] [--batch 2048] [--json out.json]

Two torch models, exported by torch.onnx at opset 17 and run with `opcompiler compare MODEL
--target T --timing-only --json` in a subprocess with an empty log directory (template defaults):

    deepfm   Criteo-style DeepFM: 26 sparse fields (1,000 ids each, one shared table with per-field
             offsets) -> nn.Embedding(26,000, 16); first-order term `lin(ids).sum(1)` (an
             EmbeddingBag written out); FM term `0.5 * (e.sum(1) ** 2 - (e ** 2).sum(1)).sum(1)`;
             MLP 416 -> 400 -> 400 -> 1; sigmoid
    bow      a bag-of-words classifier: nn.Embedding(20,000, 64), the sum over 32 tokens, Linear(64, 4)

The fused plan folds the bag sums into their lookups (`gather` with `bag`) and the FM chain into one
`fm_interaction` kernel; the unfused plan runs them as written (lookup, transpose, row reduction;
two transposes, two reductions, squares, a subtraction). The table gives the whole model (cycles,
kernels, off-chip bytes, fused / unfused) and the sparse part alone: the bag and FM kernels of the
fused plan against the unfused kernels they replace (from `compare`'s attribution).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from default_quality import compare_json  # benchmarks/ is the script's folder: on sys.path

FIELDS, VOCAB, DIM = 26, 1000, 16


def export(kind: str, out: Path, batch: int) -> Path:
    import warnings

    import torch
    from torch import nn

    class DeepFM(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offsets", torch.arange(FIELDS) * VOCAB)
            self.emb = nn.Embedding(FIELDS * VOCAB, DIM)
            self.lin = nn.Embedding(FIELDS * VOCAB, 1)
            self.mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 400), nn.ReLU(), nn.Linear(400, 400), nn.ReLU(),
                                     nn.Linear(400, 1))

        def forward(self, x):
            ids = x + self.offsets
            e = self.emb(ids)
            fm = 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1, keepdim=True)
            return torch.sigmoid(self.lin(ids).sum(1) + fm + self.mlp(e.flatten(1)))

    class Bow(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20000, 64)
            self.fc = nn.Linear(64, 4)

        def forward(self, ids):
            return self.fc(self.emb(ids).sum(1))

    torch.manual_seed(0)
    model, ids = (DeepFM(), torch.randint(0, VOCAB, (batch, FIELDS))) if kind == "deepfm" else \
        (Bow(), torch.randint(0, 20000, (batch // 8, 32)))
    with torch.no_grad():  # trained CTR tables are small: keep the fp16 activations in range
        model.emb.weight.mul_(0.1)
    path = out / f"{kind}_b{batch}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (ids,), str(path), dynamo=False, opset_version=17, input_names=["ids"])
    return path


def compare(model: Path, target: str) -> dict:
    c, err, _ = compare_json(model, target, ["--timing-only"], timeout=3600)
    if c is None:
        raise SystemExit(f"compare {model.name} on {target} failed: {err}")
    return c


SPARSE = ("gather", "fm_interaction")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="ascend-sim,dsp-sim")
    ap.add_argument("--models", default="deepfm,bow")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<7} {'target':<11} {'fused cyc':>12} {'kern':>5} {'off-chip':>10} | {'unfused cyc':>12} "
          f"{'kern':>5} {'off-chip':>10} | {'x':>5} | sparse part: fused -> unfused cycles (x)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind in args.models.split(","):
            model = export(kind, tmp, args.batch)
            for target in args.targets.split(","):
                c = compare(model, target)
                f, u = c["fused"]["totals"], c["unfused"]["totals"]
                sparse = [a for a in c["attribution"]["fused"] if a["op"] in SPARSE]
                sf = sum(a["cycles"] for a in sparse)
                su = sum(a["unfused_cycles"] for a in sparse)
                row = {"model": kind, "target": target, "batch": args.batch,
                       "fused": {k: f[k] for k in ("cycles", "kernels", "offchip_bytes")},
                       "unfused": {k: u[k] for k in ("cycles", "kernels", "offchip_bytes")},
                       "fused_vs_unfused": round(c["speedup"], 2),
                       "sparse": [{"op": a["op"], "cycles": a["cycles"], "unfused_cycles": a["unfused_cycles"],
                                   "unfused_kernels": len(a["unfused"])} for a in sparse],
                       "sparse_fused_vs_unfused": round(su / sf, 2) if sf else None}
                rows.append(row)
                print(f"{kind:<7} {target:<11} {f['cycles']:>12,} {f['kernels']:>5} {f['offchip_bytes']:>10,} | "
                      f"{u['cycles']:>12,} {u['kernels']:>5} {u['offchip_bytes']:>10,} | {c['speedup']:>5.2f} | "
                      + ", ".join(f"{a['op']} {a['cycles']:,} -> {a['unfused_cycles']:,} ({len(a['unfused'])} kernels)"
                                  for a in sparse) + f"  ({row['sparse_fused_vs_unfused']}x)", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
