"""A plan: one graph, one target, fused or unfused; its kernels with the workloads they compile."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import numpy as np

from ..capabilities import capabilities
from ..errors import OpcError
from ..ops import get_op, workload
from ..target import Target, load_target
from ..workload import Workload
from .importer import Graph
from .translate import translate
from .partition import Group, partition, settle, split, toposort


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Kernels of `graph` for `target` in execution order, with the constants and shapes they use."""

    graph: Graph
    target: Target
    fused: bool
    dtype: str
    groups: tuple[Group, ...]
    constants: Mapping[str, np.ndarray]
    shapes: Mapping[str, tuple[int, ...]]
    fallback: str | None
    mode: str = ""  # "fused" (every pattern), "unfused" (nothing) or "cost" (each group by measured cost)

    @property
    def kind(self) -> str:
        return self.mode or ("fused" if self.fused else "unfused")

    def workload(self, g: Group) -> Workload | None:
        """The catalogue workload a group compiles (None for views and host nodes)."""
        if g.op in ("view", "host"):
            return None
        return workload(g.op, dict(g.params), dtype=self.dtype)

    def shape(self, v: str) -> tuple[int, ...]:
        return tuple(self.constants[v].shape) if v in self.constants else tuple(self.shapes[v])


MODES = ("fused", "unfused", "cost")


def make_plan(graph: Graph, target: str | Target = "cpu", *, fused: bool = True, fallback: str | None = None,
              dtype: str | None = None, mode: str | None = None, config: str = "best") -> Plan:
    """Translate and partition `graph` for `target` (unsupported nodes raise OpcError unless `fallback`).

    `mode` "fused" fuses every pattern, "unfused" nothing, "cost" keeps a fused group only where
    the fused kernel is measured no slower than its parts (with `config`'s records: see `choose`)."""
    tgt = target if isinstance(target, Target) else load_target(target)
    mode = mode or ("fused" if fused else "unfused")
    if mode not in MODES:
        raise OpcError("unknown plan", arg="--plan", value=mode, expected=" | ".join(MODES))
    prims, consts, shapes = translate(graph, fallback)
    if mode == "unfused":  # a recurrent layer as an op-by-op framework runs it, step by step
        from .unroll import expand
        prims = expand(prims, consts, shapes)
    groups = partition(prims, graph.outputs, mode != "unfused")
    dt = dtype or (capabilities(tgt).preferred_dtypes or ("float32",))[0]  # ascend: float16
    if mode == "cost":
        from .cost import cost, prebuild
        prebuild(tgt, [workload(x.op, dict(x.params), dtype=dt) for g in groups if len(g.prims) > 1
                       for x in [g, *split(g)] if x.op not in ("view", "host")], config)
        groups = choose(groups, lambda op, params: cost(tgt, op, params, dt, config), tgt)
    plan = Plan(graph=graph, target=tgt, fused=mode != "unfused", dtype=dt, groups=tuple(groups), constants=consts,
                shapes=shapes, fallback=fallback, mode=mode)
    for g in groups:  # every kernel's workload is valid before anything compiles
        if g.op not in ("view", "host"):
            try:
                plan.workload(g)
            except OpcError as e:
                raise OpcError(f"node {g.nodes[0]!r} ({'+'.join(g.onnx_ops)}) maps to {g.op} with an invalid "
                               f"shape: {e}", arg="MODEL", value=graph.path) from None
    return plan


def choose(groups: list[Group], cost: Callable[[str, Mapping], float], target: Target) -> list[Group]:
    """Keep each fused group only where its kernel costs no more than its parts run one by one.

    Costs are per kernel and add up (kernels run one after another), so the chosen plan costs
    no more than fusing everything and no more than fusing nothing. A fused kernel the target
    cannot build, or that costs more than its parts, is partitioned again without its op
    (`partition.settle`: conv2d_bias_add_relu -> conv2d_bias + add_relu) and each of those groups
    chosen the same way; every decision is written into `Group.why`. On a real device timings
    are noisy, so a fused kernel is kept unless its parts are faster by more than 10 %."""
    margin = 0.0 if target.is_simulator else 0.10
    return toposort([x for g in groups for x in _choose(g, cost, target, margin)])


def _choose(g: Group, cost: Callable[[str, Mapping], float], target: Target, margin: float) -> list[Group]:
    if len(g.prims) < 2 or g.op in ("view", "host"):
        return [g]
    ok, why = _judge(g, cost, target, margin)
    if ok:
        return [replace(g, why=why)]
    return settle(replace(g, why=why), lambda s: _judge(s, cost, target, margin))


def _judge(g: Group, cost: Callable[[str, Mapping], float], target: Target, margin: float) -> tuple[bool, str]:
    """(keep the fused kernel, why): it builds and costs no more than its parts."""
    parts = split(g)
    try:
        fused = cost(g.op, g.params)
    except Exception as e:  # no template / does not fit / a bug in the template: the parts may still build
        return False, f"split: the fused {g.op} cannot be built for {target.name} ({_short(e)})"
    try:
        apart = sum(cost(p.op, p.params) for p in parts if p.op not in ("view", "host"))  # a view costs nothing
    except Exception as e:
        return True, f"fused: its parts cannot all be built alone ({_short(e)})"
    if fused <= apart * (1 + margin):
        return True, f"fused: {_us(fused)} <= {_us(apart)} for its {len(parts)} parts"
    return False, f"split: fused {g.op} {_us(fused)} > {_us(apart)} for its {len(parts)} parts"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} us"


def _short(e: Exception) -> str:
    """One line of `e`; an error that is not an OpcError is ours and says so."""
    text = str(e) if isinstance(e, OpcError) else f"internal error: {type(e).__name__}: {e}"
    return " ".join(text.split())[:90]


def describe(g: Group) -> str:
    """`conv2d_bn_relu  n=1,c=64,...` for a plan listing."""
    if g.op == "view":
        return "view (no kernel)"
    if g.op == "host":
        return f"host: {g.prims[0].onnx_op} via onnxruntime ({g.prims[0].reason})"
    shown = {k: v for k, v in g.params.items() if k not in ("layout", "dilation", "groups", "trans_a", "trans_b")
             or v not in ("NCHW", 1, 0)}
    return f"{g.op}  " + ",".join(f"{k}={v}" for k, v in shown.items())


def format_plan(plan: Plan) -> str:
    """A readable listing: which ONNX nodes went into which kernel."""
    lines = [f"{plan.kind} plan of {plan.graph.name} for {plan.target.name} ({plan.dtype}): "
             f"{sum(g.op not in ('view', 'host') for g in plan.groups)} kernels, "
             f"{sum(g.op == 'view' for g in plan.groups)} views, {sum(g.op == 'host' for g in plan.groups)} host "
             f"nodes; {plan.graph.folded} constant nodes folded at import"]
    holders: dict[str, list[str]] = {}
    for g in plan.groups:
        for n in g.nodes:
            holders.setdefault(n, []).append(g.name)
    for g in plan.groups:
        lines.append(f"  {g.name:<4} {describe(g)}")
        lines.append(f"       <- {', '.join(f'{n} ({p})' for n, p in zip(g.nodes, _node_ops(g)))}")
        if len(g.prims) > 1 and g.op not in ("view", "host"):
            lines.append(f"       {fusion_note(g)}")
        if g.why:
            lines.append(f"       {g.why}")
        for n in g.nodes:
            if len(holders[n]) > 1 and g.op != "view":
                lines.append(f"       part of node {n}: {'+'.join(p.kind for p in g.prims if p.node == n)} here, "
                             f"the rest in {', '.join(h for h in holders[n] if h != g.name)}")
    return "\n".join(lines)


def fusion_note(g: Group) -> str:
    """What a fused kernel does in one line: its primitives in order, and for a conv or matmul
    anchor which of them run in the epilogue (a residual: the tensor read there)."""
    kinds = [p.kind if p.kind != "ew_chain" else f"ew_chain({p.params['chain']})" for p in g.prims]
    head = g.prims[0].kind
    if head in ("conv2d", "matmul"):
        epi = []
        for p in g.prims[1:]:
            epi.append(f"add of the residual {p.inputs[1]}" if p.kind == "add" else p.kind)
        return f"one {g.op} kernel: {head}, epilogue {' -> '.join(epi)} applied before the output leaves the core"
    return f"one {g.op} kernel: {' -> '.join(kinds)}, intermediates stay on chip"


def _node_ops(g: Group) -> list[str]:
    seen: dict[str, str] = {}
    for p in g.prims:
        seen.setdefault(p.node, p.onnx_op)
    return list(seen.values())


def flops(plan: Plan, g: Group) -> int:
    wl = plan.workload(g)
    return get_op(wl.op).flops(wl) if wl is not None else 0


__all__ = ["Plan", "make_plan", "choose", "format_plan", "fusion_note", "describe", "flops", "MODES"]
