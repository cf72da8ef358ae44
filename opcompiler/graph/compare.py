"""Fused versus unfused: the same graph, the same target, both plans run and checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..target import Target, load_target
from .executor import GraphRun, run_plan
from .importer import Graph
from .plan import make_plan


@dataclass(kw_only=True)
class Comparison:
    """Both runs of one graph on one target."""

    fused: GraphRun
    unfused: GraphRun

    def summary(self) -> dict[str, Any]:
        f, u = self.fused.totals(), self.unfused.totals()
        out = {"kernels": (f["kernels"], u["kernels"]), "seconds": (f["seconds"], u["seconds"]),
               "offchip_bytes": (f["offchip_bytes"], u["offchip_bytes"]),
               "speedup": u["seconds"] / f["seconds"] if f["seconds"] else None,
               "offchip_ratio": u["offchip_bytes"] / f["offchip_bytes"] if f["offchip_bytes"] else None}
        if f["cycles"] is not None and u["cycles"] is not None:
            out["cycles"] = (f["cycles"], u["cycles"])
            out["speedup"] = u["cycles"] / f["cycles"] if f["cycles"] else None
        return out

    def as_dict(self) -> dict[str, Any]:
        s = self.summary()
        return {"model": self.fused.plan.graph.name, "target": self.fused.plan.target.name,
                "dtype": self.fused.plan.dtype, "batch": self.fused.plan.graph.batch,
                "correct": {"fused": self.fused.correct, "unfused": self.unfused.correct},
                "speedup": s["speedup"], "offchip_ratio": s["offchip_ratio"],
                "fused": self.fused.as_dict(), "unfused": self.unfused.as_dict()}


def compare(graph: Graph, target: str | Target = "cpu", *, fallback: str | None = None, check: bool = True,
            config: str = "best", seed: int = 0, progress: bool = False, repeat: int = 1) -> Comparison:
    """Run `graph` fused and unfused on `target` with the same inputs (see `run_plan`)."""
    tgt = target if isinstance(target, Target) else load_target(target)
    runs = {}
    for fused in (True, False):
        p = make_plan(graph, tgt, fused=fused, fallback=fallback)
        runs[fused] = run_plan(p, check=check, config=config, seed=seed, progress=progress, repeat=repeat)
    return Comparison(fused=runs[True], unfused=runs[False])


def _si(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x * 1e3:.4g} ms" if x >= 1e-3 else f"{x * 1e6:.4g} us"
    for scale, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.0f} {unit}" if unit == "B" else f"{x:.3g} {unit}"


def _cost(k, cycles: bool) -> str:
    if cycles and k.cycles is not None:
        return f"{k.cycles:,} cyc"
    return f"{k.seconds * 1e6:.1f} us"


def format_run(run: GraphRun) -> str:
    """Per-kernel table of one run."""
    cyc = run.totals()["cycles"] is not None
    lines = [f"{run.plan.kind}: {run.totals()['kernels']} kernels on {run.plan.target.name}"
             + (f", {run.totals()['host_nodes']} on the host" if run.totals()["host_nodes"] else "")]
    lines.append(f"  {'kernel':<5} {'ops':<44} {'cost':>15} {'off-chip':>11} {'% peak':>7}  config")
    for k in run.kernels:
        if k.op == "view":
            continue
        ops = "+".join(k.prim_ops) if k.op != "host" else f"{k.onnx_ops[0]} (host)"
        pct = f"{k.percent_of_peak:.1f}" if k.percent_of_peak is not None else "-"
        lines.append(f"  {k.name:<5} {ops[:44]:<44} {_cost(k, cyc):>15} {_si(k.offchip_bytes, 'B'):>11} {pct:>7}  "
                     f"{k.config_source}{'  [' + k.where + ']' if k.where == 'host' else ''}")
    lines += [f"  note {k.name}: {k.note}" for k in run.kernels if k.note]
    return "\n".join(lines)


def format_compare(c: Comparison) -> str:
    """Both tables, the totals and the ratios."""
    s = c.summary()
    f, u = c.fused.totals(), c.unfused.totals()
    lines = [f"{c.fused.plan.graph.name} on {c.fused.plan.target.name} ({c.fused.plan.dtype}, batch "
             f"{c.fused.plan.graph.batch})", format_run(c.fused), "", format_run(c.unfused), ""]
    if "cycles" in s:
        lines.append(f"total cycles:     fused {s['cycles'][0]:,}  unfused {s['cycles'][1]:,}  "
                     f"speedup {s['speedup']:.2f}x")
    lines.append(f"total time:       fused {_si(f['seconds'], 's')}  unfused {_si(u['seconds'], 's')}"
                 + ("" if "cycles" in s else f"  speedup {s['speedup']:.2f}x" if s["speedup"] else ""))
    lines.append(f"off-chip bytes:   fused {_si(f['offchip_bytes'], 'B')}  unfused {_si(u['offchip_bytes'], 'B')}  "
                 f"ratio {s['offchip_ratio']:.2f}x" if s["offchip_ratio"] else "off-chip bytes: -")
    if f["host_nodes"] or u["host_nodes"]:
        lines.append(f"host (fallback):  fused {f['host_nodes']} nodes {_si(f['host_seconds'], 's')}  unfused "
                     f"{u['host_nodes']} nodes {_si(u['host_seconds'], 's')} (not in the totals above)")
    for name, r in (("fused", c.fused), ("unfused", c.unfused)):
        if r.correct is not None:
            errs = ", ".join(f"{k} {v:.3g}" for k, v in r.max_abs_err.items())
            lines.append(f"{name} vs onnxruntime: {'OK' if r.correct else 'MISMATCH'} (max abs err {errs})")
    return "\n".join(lines)
