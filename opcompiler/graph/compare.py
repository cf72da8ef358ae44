"""Fused versus unfused: the same graph, the same target, both plans run and checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import OpcFailure
from ..target import Target, load_target
from .executor import GraphRun, run_plan
from .importer import Graph
from .plan import make_plan


@dataclass(kw_only=True)
class Comparison:
    """The runs of one graph on one target: fuse every pattern, fuse nothing, and (when run)
    the cost-chosen plan that fuses a group only where that is measured to pay."""

    fused: GraphRun
    unfused: GraphRun
    cost: GraphRun | None = None

    @property
    def runs(self) -> dict[str, GraphRun]:
        out = {"unfused": self.unfused, "fused": self.fused}
        if self.cost is not None:
            out["cost"] = self.cost
        return out

    def summary(self) -> dict[str, Any]:
        f, u = self.fused.totals(), self.unfused.totals()
        out = {"kernels": (f["kernels"], u["kernels"]), "seconds": (f["seconds"], u["seconds"]),
               "offchip_bytes": (f["offchip_bytes"], u["offchip_bytes"]),
               "speedup": u["seconds"] / f["seconds"] if f["seconds"] else None,
               "offchip_ratio": u["offchip_bytes"] / f["offchip_bytes"] if f["offchip_bytes"] else None}
        if f["cycles"] is not None and u["cycles"] is not None:
            out["cycles"] = (f["cycles"], u["cycles"])
            out["speedup"] = u["cycles"] / f["cycles"] if f["cycles"] else None
        if f["host_nodes"] or u["host_nodes"]:  # the whole model: the target's kernels and the host's nodes
            fw, uw = f["seconds"] + f["host_seconds"], u["seconds"] + u["host_seconds"]
            out["with_host"] = {"seconds": (fw, uw), "host_nodes": (f["host_nodes"], u["host_nodes"]),
                                "host_seconds": (f["host_seconds"], u["host_seconds"]),
                                "speedup": uw / fw if fw else None}
        if self.cost is not None:
            c = self.cost.totals()
            base = ("cycles" if "cycles" in out and c["cycles"] is not None else "seconds")
            out["cost_plan"] = {"kernels": c["kernels"], "seconds": c["seconds"], "cycles": c["cycles"],
                                "offchip_bytes": c["offchip_bytes"],
                                "speedup_vs_unfused": u[base] / c[base] if c[base] else None,
                                "speedup_vs_fused": f[base] / c[base] if c[base] else None}
        return out

    def attribution(self, plan: str = "fused") -> list[dict[str, Any]]:
        """Per kernel of the `plan` run ("fused" or "cost"), the unfused kernels doing its work,
        matched by primitive (the value each primitive produces), not by ONNX node: a Conv node's
        conv2d and bias_add go wherever each primitive went. Every unfused kernel lands under
        exactly one kernel, so the unfused figures summed over the kernels are the unfused totals.
        `partial_nodes`: ONNX nodes of which this kernel holds only some primitives, with the
        kernels holding the rest (one fused kernel replacing parts of two nodes says so)."""
        return attribute(self.runs[plan], self.unfused)

    def as_dict(self) -> dict[str, Any]:
        s = self.summary()
        out = {"model": self.fused.plan.graph.name, "target": self.fused.plan.target.name,
               "dtype": self.fused.plan.dtype, "batch": self.fused.plan.graph.batch,
               "correct": {k: r.correct for k, r in self.runs.items()},
               "speedup": s["speedup"], "offchip_ratio": s["offchip_ratio"],
               "fused": self.fused.as_dict(), "unfused": self.unfused.as_dict()}
        if "with_host" in s:
            out["with_host"] = s["with_host"]
        out["attribution"] = {"fused": self.attribution("fused")}
        if self.cost is not None:
            out["cost"] = self.cost.as_dict()
            out["cost_plan"] = s["cost_plan"]
            out["attribution"]["cost"] = self.attribution("cost")
        return out


def attribute(run: GraphRun, unfused: GraphRun) -> list[dict[str, Any]]:
    """See `Comparison.attribution`."""
    kernels = [k for k in run.kernels if k.op != "view"]
    owner = {p: i for i, k in enumerate(kernels) for p in k.prims}
    # an unfused plan's op-by-op kernels of a recurrent layer (`graph.unroll`) belong to the
    # fused kernel of their node
    by_node = {n: i for i, k in enumerate(kernels) if len(k.nodes) == 1 for n in k.nodes}
    holders: dict[str, list[str]] = {}  # ONNX node -> kernels holding one of its primitives
    for k in kernels:
        for n in k.nodes:
            holders.setdefault(n, [])
            if k.name not in holders[n]:
                holders[n].append(k.name)
    out = [{"kernel": k.name, "op": k.op, "prim_ops": list(k.prim_ops), "nodes": list(k.nodes), "where": k.where,
            "cycles": k.cycles, "seconds": k.seconds, "offchip_bytes": k.offchip_bytes,
            "partial_nodes": {n: [h for h in holders[n] if h != k.name] for n in k.nodes if len(holders[n]) > 1},
            "unfused": [], "unfused_cycles": 0, "unfused_seconds": 0.0, "unfused_offchip_bytes": 0}
           for k in kernels]
    for u in unfused.kernels:
        if u.op == "view":
            continue
        i = owner.get(u.prims[0]) if u.prims else None
        if i is None and len(u.nodes) == 1:
            i = by_node.get(u.nodes[0])
        if i is None:
            raise OpcFailure(f"unfused kernel {u.name} ({u.op}) holds a primitive no {run.plan.kind} kernel holds")
        a = out[i]
        a["unfused"].append(u.name)
        if u.where != "host":  # host nodes are outside the totals on both sides
            cyc = a["unfused_cycles"]
            a["unfused_cycles"] = None if u.cycles is None or cyc is None else cyc + u.cycles
            a["unfused_seconds"] += u.seconds
            a["unfused_offchip_bytes"] += u.offchip_bytes
    return out


def compare(graph: Graph, target: str | Target = "cpu", *, fallback: str | None = None, check: bool = True,
            config: str = "best", seed: int = 0, progress: bool = False, repeat: int = 1,
            cost_plan: bool = True, fp32_nodes: str | set[str] | None = None) -> Comparison:
    """Run `graph` fused, unfused and (with `cost_plan`) cost-chosen on `target` with the same
    inputs (see `run_plan`). Kernels are built once and shared between the plans."""
    tgt = target if isinstance(target, Target) else load_target(target)
    runs = {}
    for mode in ("fused", "unfused") + (("cost",) if cost_plan else ()):
        p = make_plan(graph, tgt, mode=mode, fallback=fallback, config=config)
        runs[mode] = run_plan(p, check=check, config=config, seed=seed, progress=progress, repeat=repeat,
                              fp32_nodes=fp32_nodes)
    return Comparison(fused=runs["fused"], unfused=runs["unfused"], cost=runs.get("cost"))


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
             f"{c.fused.plan.graph.batch})"]
    for r in c.runs.values():
        lines += [format_run(r), ""]
    if "cycles" in s:
        lines.append(f"total cycles:     fused {s['cycles'][0]:,}  unfused {s['cycles'][1]:,}  "
                     f"speedup {s['speedup']:.2f}x")
    lines.append(f"total time:       fused {_si(f['seconds'], 's')}  unfused {_si(u['seconds'], 's')}"
                 + ("" if "cycles" in s else f"  speedup {s['speedup']:.2f}x" if s["speedup"] else ""))
    lines.append(f"off-chip bytes:   fused {_si(f['offchip_bytes'], 'B')}  unfused {_si(u['offchip_bytes'], 'B')}  "
                 f"ratio {s['offchip_ratio']:.2f}x" if s["offchip_ratio"] else "off-chip bytes: -")
    if "cost_plan" in s:
        cp = s["cost_plan"]
        cost_s = (f"{cp['cycles']:,} cycles, " if cp["cycles"] is not None else "") + _si(cp["seconds"], "s")
        lines.append(f"cost-chosen plan: {cost_s}, off-chip {_si(cp['offchip_bytes'], 'B')}; "
                     f"{cp['speedup_vs_unfused']:.2f}x vs unfused, {cp['speedup_vs_fused']:.2f}x vs fused")
    if "with_host" in s:
        w = s["with_host"]
        lines.append(f"host (fallback):  fused {f['host_nodes']} nodes {_si(f['host_seconds'], 's')}  unfused "
                     f"{u['host_nodes']} nodes {_si(u['host_seconds'], 's')} (wall-clock on this machine, not in "
                     f"the target totals above)")
        lines.append(f"whole model:      fused {_si(w['seconds'][0], 's')}  unfused {_si(w['seconds'][1], 's')}  "
                     f"speedup {w['speedup']:.2f}x (target time plus host time; the host's share: fused "
                     f"{w['host_seconds'][0] / w['seconds'][0]:.0%}, unfused {w['host_seconds'][1] / w['seconds'][1]:.0%})")
    for name, r in c.runs.items():
        if r.correct is not None:
            errs = ", ".join(f"{k} {v:.3g}" for k, v in r.max_abs_err.items())
            lines.append(f"{name} vs onnxruntime: {'OK' if r.correct else 'MISMATCH'} (max abs err {errs})"
                         + (f"; fp32 on the host: {', '.join(r.fp32_kernels)}" if r.fp32_kernels else ""))
            if (r.overflow and not r.correct) or r.drift:
                lines.append(f"  {r.diagnosis()}")
    return "\n".join(lines)
