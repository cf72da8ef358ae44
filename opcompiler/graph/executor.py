"""Compile every kernel of a plan for its target and run the graph end to end, checked against
onnxruntime.

Each kernel is built with its best verified record (the user's records, then the shipped ones:
`resolve_config(wl, target, "best")`) or, when there is none, its template's default; the report
says which. Kernels are built once per process and shared between plans (`graph.cost`).
A kernel the target cannot build (no template) and ONNX nodes we do not compile run on the host
only when the plan was made with `fallback="cpu"`, and are reported separately.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ..backend import Backend, Kernel, get_backend
from ..errors import OpcError, OpcFailure
from ..ops import get_op, workload
from ..target import Target, load_target
from .importer import _to_proto
from .partition import Group, settle
from .plan import Plan

# End-to-end tolerance against onnxruntime (fp32 math): |out - ref| <= atol * max|ref| + rtol * |ref|.
# fp32 kernels differ from onnxruntime only by summation order; fp16 graphs (Ascend) round every
# kernel's output to fp16 (2^-11 relative) and errors compound over layers, so 2 % of the largest output.
GRAPH_TOLERANCE = {"float32": (1e-3, 1e-4), "float16": (2e-2, 2e-2)}


@dataclass(kw_only=True)
class KernelReport:
    """One kernel (or view / host node) of a run: what it ran, where, and what it cost."""

    name: str
    op: str
    nodes: tuple[str, ...]
    onnx_ops: tuple[str, ...]
    prim_ops: tuple[str, ...]
    where: str  # the target's name, or "host" (fallback / onnxruntime)
    prims: tuple[str, ...] = ()  # the value each of its primitives produces: a primitive's identity across plans
    config_source: str  # "tuning record", "template default", "-" for views and host nodes
    template: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    cycles: int | None = None
    offchip_bytes: int = 0
    flops: int = 0
    percent_of_peak: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"], d["onnx_ops"], d["prim_ops"] = list(self.nodes), list(self.onnx_ops), list(self.prim_ops)
        d["prims"] = list(self.prims)
        return d


@dataclass(kw_only=True)
class GraphRun:
    """A whole-graph run: per-kernel reports, outputs, and the check against onnxruntime."""

    plan: Plan
    kernels: list[KernelReport]
    compile_seconds: float
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    max_abs_err: dict[str, float] = field(default_factory=dict)
    correct: bool | None = None  # None when run in timing-only mode
    overflow: dict[str, Any] | None = None  # the first kernel whose low-precision output overflowed
    drift: dict[str, Any] | None = None  # a low-precision mismatch without overflow: where the error grew
    fp32_kernels: list[str] = field(default_factory=list)  # kernels re-run in fp32 on the host

    def diagnosis(self) -> str:
        """One line: which node overflowed, its fp32 value range, the dtype's limit, the remedy."""
        o = self.overflow
        if not o and self.drift:
            d = self.drift
            head = (f"{d['dtype']} rounding drift (no overflow): each kernel stores its output in {d['dtype']}; "
                    f"the error against onnxruntime's fp32 grows to {d['final_rel']:.2%} of the output's range over "
                    f"{d['kernels']} kernels, first above {d['rtol']:.0%} after node {d['node']!r} ({d['op']}, kernel "
                    f"{d['kernel']}, {d['rel']:.2%})")
            if "kernels_ok" not in d:
                return head + (f"; this is {d['dtype']} storage between kernels, not an overflow: the same graph "
                               "matches in fp32 (--target cpu or dsp-sim)")
            twin = (f"; onnxruntime storing the same tensors in {d['dtype']} is {d['twin_rel']:.2%} off fp32"
                    if d.get("twin_rel") is not None else "")
            if d["kernels_ok"]:
                return (head + f"; every one of the {d['kernels_checked']} kernels is within {d['dtype']} rounding "
                        f"({d['kernel_tolerance']:.2g} of its range) of fp32 on its own inputs{twin}: the drift is "
                        f"{d['dtype']} storage compounding through the model, not a wrong kernel; the graph matches "
                        "fp32 in fp32 (--target cpu or dsp-sim)")
            return (head + f"; kernel {d['worst_kernel']} is {d['worst_kernel_rel']:.2%} of its range off fp32 on "
                    f"its own inputs, beyond {d['dtype']} rounding ({d['kernel_tolerance']:.2g}){twin}: a wrong "
                    "kernel, not drift")
        if not o:
            return ""
        rng = (f"its fp32 values span [{o['fp32_min']:.4g}, {o['fp32_max']:.4g}]" if o.get("fp32_max") is not None
               else "its fp32 values are not finite either")
        return (f"{o['dtype']} overflow in node {o['nodes'][0]!r} ({'+'.join(o['onnx_ops'])} as {o['op']}, kernel "
                f"{o['kernel']}): {rng}, beyond {o['dtype']}'s largest finite {o['limit']:.6g}; "
                f"rerun with --fp32-nodes auto (or --fp32-nodes {','.join(o['nodes'])}) to run such nodes in "
                "fp32 on the host")

    def on_target(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.where != "host" and k.op != "view"]

    def on_host(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.where == "host"]

    def totals(self) -> dict[str, Any]:
        t = self.on_target()
        cyc = [k.cycles for k in t]
        return {"kernels": len(t), "seconds": sum(k.seconds for k in t),
                "cycles": sum(cyc) if t and all(c is not None for c in cyc) else None,
                "offchip_bytes": sum(k.offchip_bytes for k in t), "flops": sum(k.flops for k in t),
                "host_nodes": len(self.on_host()), "host_seconds": sum(k.seconds for k in self.on_host())}

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.plan.graph.name, "target": self.plan.target.name, "plan": self.plan.kind,
                "dtype": self.plan.dtype, "batch": self.plan.graph.batch, "correct": self.correct,
                "max_abs_err": self.max_abs_err, "tolerance": dict(zip(("rtol", "atol_of_max"),
                                                                       GRAPH_TOLERANCE[self.plan.dtype])),
                "compile_seconds": self.compile_seconds, "totals": self.totals(),
                "overflow": self.overflow, "drift": self.drift, "diagnosis": self.diagnosis() or None, "fp32_kernels": self.fp32_kernels,
                "kernels": [k.as_dict() for k in self.kernels]}


def offchip_level(target: Target) -> str | None:
    """The off-chip memory level's name (HBM / GM / DDR): the first `global`-scope level."""
    for m in target.memories:
        if m.scope == "global":
            return m.name
    return target.memories[0].name if target.memories else None


@dataclass
class _Built:
    kernel: Kernel
    backend: Backend
    where: str
    config_source: str
    note: str = ""


def compile_plan(plan: Plan, config: str = "best", progress: bool = False
                 ) -> tuple[list[tuple[Group, _Built | None]], float]:
    """Build every kernel (one build per distinct workload), in execution order.

    A fused kernel the target has no lowering for is split into its primitive kernels (the
    target may have those); a kernel that still cannot build runs on the host with
    `fallback="cpu"`, else raises OpcError naming the op and the node."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    from .cost import backend_for, prebuild
    backend = backend_for(plan.target)
    prebuild(plan.target, [wl for g in plan.groups if (wl := plan.workload(g)) is not None], config)
    cache: dict[str, _Built] = {}
    host: list[Backend] = []
    out: list[tuple[Group, _Built | None]] = []
    for g in tqdm(plan.groups, desc=f"compile {plan.kind}", unit="kernel", disable=not progress, leave=False):
        if g.op in ("view", "host"):
            out.append((g, None))
            continue
        out += _build_or_refuse(plan, g, backend, config, cache, host, frozenset(), "")
    return out, time.perf_counter() - t0


def _build_or_refuse(plan: Plan, g: Group, backend: Backend, config: str, cache: dict[str, _Built],
                     host: list[Backend], exclude: frozenset[str], why: str) -> list[tuple[Group, _Built]]:
    """`g` built, or, when the target rejects its fused op (OpcError, or worse), `g` partitioned
    again without it (`partition.settle`: conv2d_bias_add_relu -> conv2d_bias + add_relu where
    the template has no residual epilogue); a single primitive that still cannot build goes to
    the host."""
    try:
        return [(g, _build(plan, g, backend, config, cache))]
    except Exception as e:  # a template that rejects an op it lacks
        return _without(plan, g, e, backend, config, cache, host, exclude, f"cannot be built for {plan.target.name}")


def _without(plan: Plan, g: Group, err: Exception, backend: Backend, config: str, cache: dict[str, _Built],
             host: list[Backend], exclude: frozenset[str], failed: str) -> list[tuple[Group, _Built]]:
    """`g`, whose kernel `failed` with `err`, partitioned again without its fused op (each part
    built on the target where it can be), or on the host (`--fallback cpu`) when it is a single
    primitive."""
    if len(g.prims) == 1:
        return [(g, _on_host(plan, g, err, config, cache, host))]
    built: dict[str, _Built] = {}

    def judge(s: Group) -> tuple[bool, str]:
        try:
            built[s.name] = _build(plan, s, backend, config, cache)
            return True, ""
        except Exception as e2:
            return False, f"split: {s.op} cannot be built for {plan.target.name} ({_why(e2)})"

    first = f"split: {g.op} {failed} ({_why(err)})"
    out = []
    for s in settle(replace(g, why=first), judge, exclude):
        b = built.get(s.name) if len(s.prims) > 1 else None
        if b is None:
            try:
                b = _build(plan, s, backend, config, cache)
            except Exception as e3:
                b = _on_host(plan, s, e3, config, cache, host)
        out.append((s, _Built(b.kernel, b.backend, b.where, b.config_source,
                              "; ".join(x for x in (s.why, b.note) if x))))
    return out


def _build(plan: Plan, g: Group, backend: Backend, config: str, cache: dict[str, _Built]) -> _Built:
    """Each distinct (target, workload, config) is built once per process (`cost.built`)."""
    from .cost import built
    b = built(backend.target, plan.workload(g), config, backend)
    return _Built(b.kernel, backend, backend.target.name if backend.target is plan.target else "host",
                  b.config_source)


def _why(e: Exception) -> str:
    return (str(e) if isinstance(e, OpcError) else f"{type(e).__name__}: {e}")[:100]


def _on_host(plan: Plan, g: Group, err: Exception, config: str, cache: dict[str, _Built], host: list[Backend]
             ) -> _Built:
    if plan.fallback != "cpu":
        # a crash inside a template is our bug, not bad input: named as such, with the way around it
        what = err if isinstance(err, OpcError) else f"internal error (a bug in opcompiler): {_why(err)}"
        raise OpcError(f"node {g.nodes[0]!r} ({'+'.join(g.onnx_ops)} as {g.op}) cannot be built for "
                       f"{plan.target.name}: {what}", arg="MODEL", value=plan.graph.path,
                       expected="--fallback cpu to run it on the host") from None
    if not host:
        host.append(get_backend(load_target("cpu")))
    b = _build(plan, g, host[0], config, cache)
    return _Built(b.kernel, b.backend, "host", b.config_source, f"fallback cpu: {_why(err)}")


def run_plan(plan: Plan, inputs: Mapping[str, np.ndarray] | None = None, *, check: bool = True,
             config: str = "best", seed: int = 0, progress: bool = False, repeat: int = 1,
             fp32_nodes: str | set[str] | None = None) -> GraphRun:
    """Compile and run `plan`. With `check`, compute real values and compare the graph outputs with
    onnxruntime (raises nothing on mismatch: see `GraphRun.correct`); without, time only.
    `repeat` > 1 re-times each wall-clock kernel and keeps the fastest (a shared machine is noisy;
    simulated cycles are deterministic and are not repeated).

    Low-precision plans (fp16 on Ascend) are watched for overflow: the first kernel whose output
    holds inf/NaN from finite inputs is recorded in `GraphRun.overflow`, with the fp32 range of
    that output (the kernel recomputed in fp32 on the host). `fp32_nodes` is the remedy: "auto"
    re-runs every kernel that overflows, or whose input no longer fits the dtype, in fp32 on the
    host (and keeps its output in fp32); a set of ONNX node names does so for those nodes."""
    from tqdm import tqdm

    built, compile_s = compile_plan(plan, config, progress)
    feeds = dict(inputs) if inputs is not None else make_inputs(plan, seed)
    masks = _mask_inputs(plan)  # int / bool masks: stored as the plan's floats once, when fed
    values: dict[str, np.ndarray] = {k: v.astype(plan.dtype) if k in masks else _as_stored(v, plan.dtype)
                                     for k, v in feeds.items()}
    level = offchip_level(plan.target)
    reports = []
    watch: dict[str, Any] = {}
    if isinstance(fp32_nodes, str) and fp32_nodes != "auto":
        fp32_nodes = {n for n in fp32_nodes.split(",") if n}
    if isinstance(fp32_nodes, set):
        names = {n.name for n in plan.graph.nodes}
        if unknown := sorted(fp32_nodes - names):
            raise OpcError(f"no node named {unknown[0]!r} in the model", arg="--fp32-nodes", value=",".join(unknown),
                           expected="ONNX node names (see --show-plan) or auto")
    for g, b in tqdm(built, desc=f"run {plan.kind}", unit="kernel", disable=not progress, leave=False):
        if g.op == "view":
            if check:
                src = values[g.inputs[0]] if g.inputs[0] in values else plan.constants[g.inputs[0]]  # a constant's view
                values[g.outputs[0]] = _view(src, plan.shape(g.outputs[0]), int(g.params.get("offset", 0)))
            reports.append(_report(g, plan, "view", "-"))
        elif g.op == "host":
            reports.append(_run_host(plan, g, values, check))
        else:
            for g1, b1 in _ran(plan, g, b, values, check, level, repeat, config, reports):
                if check and plan.dtype != "float32":
                    reports[-1] = _watch_precision(plan, g1, b1, values, reports[-1], watch, fp32_nodes, config)
    run = GraphRun(plan=plan, kernels=reports, compile_seconds=compile_s, overflow=watch.get("overflow"),
                   fp32_kernels=watch.get("fp32", []))
    if check:
        run.outputs = {o: values[o] for o in plan.graph.outputs}
        ref = reference(plan, feeds)
        rtol, atol = GRAPH_TOLERANCE[plan.dtype]
        ok = True
        for o in plan.graph.outputs:
            got, want = run.outputs[o].astype(np.float64), ref[o].astype(np.float64)
            if got.shape != want.shape:
                raise OpcFailure(f"output {o!r}: shape {got.shape} but onnxruntime gives {want.shape}")
            err = np.abs(got - want)
            run.max_abs_err[o] = float(err.max()) if err.size else 0.0
            scale = float(np.abs(want).max()) if want.size else 0.0
            ok &= bool(np.all(err <= atol * scale + rtol * np.abs(want))) and not np.isnan(got).any()
        run.correct = ok
        if not ok and plan.dtype != "float32" and run.overflow is None:
            run.drift = _drift(plan, feeds, values, rtol)
            if run.drift is not None and not any(np.isnan(v).any() for v in run.outputs.values()):
                # Is the mismatch the dtype's or ours? Check every kernel on its own inputs, and
                # run onnxruntime storing the same tensors in the dtype (the storage twin).
                run.drift.update(_audit_kernels(plan, built, values, set(run.fp32_kernels)))
                run.drift["twin_rel"] = _storage_twin(plan, feeds, ref)
                run.correct = run.drift["kernels_ok"]
    return run


def _ran(plan: Plan, g: Group, b: _Built, values: dict[str, np.ndarray], check: bool, level: str | None,
         repeat: int, config: str, reports: list[KernelReport]):
    """Run `g`'s kernel, appending its report (a generator: yields (group, built) after each report).
    A kernel that fails inside the simulator or the runtime (an internal error: our bug, never the
    user's input) is split into its parts as a build failure is, each part run in its place, and the
    report's note says so; a single primitive goes to the host with `--fallback cpu`, else the run
    stops with one line naming the node."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is diagnosed below, not warned about
            reports.append(_run_kernel(plan, g, b, values, check, level, repeat))
        yield g, b
        return
    except (OpcError, OpcFailure):
        raise
    except Exception as e:
        if b.where == "host":
            raise
        err = e
    from .cost import backend_for
    subs = _without(plan, g, err, backend_for(plan.target), config, {}, [], frozenset(),
                    f"failed on {plan.target.name} at run time")
    for s, sb in subs:  # each part's note says why it replaced `g` (`_without`, `_on_host`)
        yield from _ran(plan, s, sb, values, check, level, repeat, config, reports)


# Per-kernel tolerance of a low-precision kernel against the same kernel in fp32 on the same
# inputs: 2^-8 of the output's range (8 float16 ulps at the top of the range; one rounding of
# the output is 2^-11, a chain of a few vector ops in float16 a few of those).
KERNEL_TOLERANCE = {"float16": 2.0 ** -8}


def _audit_kernels(plan: Plan, built: list[tuple[Group, _Built | None]], values: Mapping[str, np.ndarray],
                   skip: set[str]) -> dict[str, Any]:
    """Each kernel that ran on the target, recomputed in fp32 on the host from the very inputs it
    was given: the worst error relative to its output's range, and whether every kernel is within
    the dtype's rounding (`KERNEL_TOLERANCE`). A wrong kernel (an address, a weight, a tail) is off
    by far more; drift that only compounds over layers is not."""
    from .cost import prebuild
    tol = KERNEL_TOLERANCE.get(plan.dtype, 0.0)
    todo = [g for g, b in built if b is not None and b.where != "host" and g.name not in skip
            and g.outputs[0] in values]
    prebuild(load_target("cpu"), [workload(g.op, dict(g.params), dtype="float32") for g in todo], "default")

    lim = np.finfo(np.dtype(plan.dtype))

    def off(g: Group) -> float:  # constants as the kernel got them: stored in the plan's dtype
        ins = [values[v] if v in values else _stored(plan.constants[v], plan.dtype) for v in g.inputs]
        # within the dtype's range: a pad filled with the dtype's lowest (max pooling's ceil_mode
        # edge) holds -65504 in float16 where float32 holds -3.4e38, and neither value is wrong
        want = np.clip(_fp32_on_host(plan, g, ins, "default"), float(lim.min), float(lim.max))
        return _rel(values[g.outputs[0]], want)
    rel, g = max(((off(g), g) for g in todo), key=lambda x: x[0], default=(0.0, None))
    return {"kernels_ok": bool(todo) and rel <= tol, "kernels_checked": len(todo), "kernel_tolerance": tol,
            "worst_kernel": g.name if g else None, "worst_kernel_rel": rel}


def _stored(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    """The largest error of `got` against `want`, relative to `want`'s range (0 when empty)."""
    got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30)) if want.size else 0.0


def _storage_twin(plan: Plan, feeds: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> float | None:
    """onnxruntime's fp32 graph with the plan's storage in `plan.dtype`: the inputs, the weights
    and every kernel's output rounded to the dtype. Its error against plain fp32 (relative to the
    output's range) is what storing those tensors in the dtype costs this model, whoever runs it.
    `ref`: the plain fp32 outputs (`reference`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    if plan.dtype == "float32":
        return None
    dt = helper.np_dtype_to_tensor_dtype(np.dtype(plan.dtype))
    m = onnx.ModelProto()
    m.CopyFrom(plan.graph.model)
    low = np.dtype(plan.dtype)
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(a.astype(low).astype(np.float32), init.name))
    stored = {g.outputs[0] for g in plan.groups if g.op not in ("view", "host")}
    outs = {o.name for o in m.graph.output}
    nodes, renamed = [], {}
    for n in m.graph.node:
        for i, v in enumerate(n.input):
            n.input[i] = renamed.get(v, v)
        nodes.append(n)
        for v in n.output:
            if v in stored and v not in outs:
                nodes += [helper.make_node("Cast", [v], [v + "__low"], to=dt),
                          helper.make_node("Cast", [v + "__low"], [v + "__stored"], to=TensorProto.FLOAT)]
                renamed[v] = v + "__stored"
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    try:
        low_feeds = {k: a.astype(low).astype(np.float32) for k, a in feeds.items()}
        twin = ort_session(m).run(list(plan.graph.outputs), low_feeds)
    except Exception:  # an exporter's graph onnxruntime will not rewrite: no twin figure
        return None
    return max(_rel(t, ref[o]) for t, o in zip(twin, plan.graph.outputs))


def _drift(plan: Plan, feeds: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], rtol: float
           ) -> dict[str, Any] | None:
    """Every kernel output that is an ONNX value, against onnxruntime's fp32 value of it: the
    first one whose error exceeds `rtol` of its range, and the error at the graph's output."""
    import onnx
    from onnx import helper
    names = {v for n in plan.graph.nodes for v in n.outputs if v}
    order = [(g, g.outputs[0]) for g in plan.groups if g.op not in ("view", "host") and g.outputs[0] in names
             and g.outputs[0] in values]
    if not order:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(plan.graph.model)
    have = {o.name for o in m.graph.output}
    for _, v in order:
        if v not in have:
            m.graph.output.append(helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, plan.shape(v)))
    try:
        outs = ort_session(m).run([v for _, v in order], {k: a.astype(np.float32) for k, a in feeds.items()})
    except Exception:  # an exporter's graph onnxruntime will not extend: no drift report
        return None
    first, rel = None, 0.0
    for (g, v), want in zip(order, outs):
        rel = _rel(values[v], want)
        if first is None and rel > rtol:
            first = (g, rel)
    if first is None:
        return None
    g, r = first
    return {"dtype": plan.dtype, "kernel": g.name, "node": g.nodes[-1], "op": g.op, "rel": r, "rtol": rtol,
            "final_rel": rel, "kernels": len(order)}


def _watch_precision(plan: Plan, g: Group, b: _Built, values: dict[str, np.ndarray], rep: KernelReport,
                     watch: dict[str, Any], fp32_nodes: str | set[str] | None, config: str) -> KernelReport:
    """Record the first overflow; with `fp32_nodes`, recompute the kernel in fp32 on the host."""
    out = g.outputs[0]
    limit = float(np.finfo(plan.dtype).max)
    ins = [values[v] if v in values else plan.constants[v] for v in g.inputs]
    ins_finite = all(np.isfinite(a).all() for a in ins)
    bad = not np.isfinite(values[out]).all()
    wide_input = any(np.abs(a).max(initial=0) > limit for a in ins if a.dtype == np.float32 and a.size)
    # a named node starts an fp32 region; the region goes on while values do not fit the dtype
    forced = isinstance(fp32_nodes, set) and bool(fp32_nodes & set(g.nodes))
    auto = (fp32_nodes == "auto" and bad) or wide_input
    if not (bad and ins_finite and "overflow" not in watch) and not forced and not auto:
        return rep
    ref32 = _fp32_on_host(plan, g, ins, config) if ins_finite or forced or auto else None
    if bad and ins_finite and "overflow" not in watch:
        fin = ref32 is not None and np.isfinite(ref32).all()
        watch["overflow"] = {"kernel": g.name, "op": g.op, "nodes": list(g.nodes), "onnx_ops": list(g.onnx_ops),
                             "dtype": plan.dtype, "limit": limit,
                             "fp32_min": float(ref32.min()) if fin else None,
                             "fp32_max": float(ref32.max()) if fin else None}
    if (forced or auto) and ref32 is not None:
        values[out] = ref32.reshape(plan.shape(out))  # stays fp32 until it fits the dtype again
        watch.setdefault("fp32", []).append(g.name)
        rep.note = "; ".join(x for x in (rep.note, f"fp32 on the host ({plan.dtype} would overflow)"
                                         if not forced else "fp32 on the host (--fp32-nodes)") if x)
    return rep


def _fp32_on_host(plan: Plan, g: Group, ins: list[np.ndarray], config: str) -> np.ndarray:
    """The kernel's output computed in fp32 by the cpu backend from the same inputs."""
    from .cost import backend_for, built
    host = load_target("cpu")
    wl = workload(g.op, dict(g.params), dtype="float32")
    kernel = built(host, wl, "default").kernel
    args = [np.ascontiguousarray(a.astype(np.float32).reshape(shape))
            for a, (_, shape, _) in zip(ins, get_op(wl.op).inputs(wl))]
    return backend_for(host).run(kernel, args).outputs[0].astype(np.float32)


def make_inputs(plan: Plan, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: float32 from a normal distribution; integer inputs (token ids) uniform over
    the rows of the smallest table a Gather reads with them, less the largest constant offset
    added on the way (0 or 1 when none does); masks (int /
    bool inputs only mask ops read) 1 over a random prefix of each last-axis row, 0 after."""
    rng = np.random.default_rng(seed)
    g = plan.graph
    out = {}
    masks = _mask_inputs(plan)
    for n, s in g.inputs:
        dt = g.dtype(n)
        if n in masks and s:  # 1 over a random prefix of 1 .. n-1 of each last-axis row, 0 after: every
            # row keeps and masks at least one position, whichever value masks (a row all -inf is NaN)
            length = rng.integers(1, max(s[-1], 2), size=(*s[:-1], 1))
            out[n] = (np.arange(s[-1]) < length).astype(dt)
        elif dt.startswith("int") or dt == "bool":
            rows = _id_ranges(g, n)
            out[n] = rng.integers(0, max(1, min(rows)) if rows else 2, size=s).astype(dt)
        else:
            out[n] = rng.standard_normal(s).astype(np.float32)
    return out


def _id_ranges(g, n: str) -> list[int]:
    """For each Gather that reads ids `n` (directly, or through an Add of a constant offset: a
    DeepFM's per-field offsets into one table), how many ids from 0 stay inside its table."""
    out = []
    for x in g.nodes:
        if x.op_type == "Gather" and len(x.inputs) > 1 and x.inputs[1] == n:
            out.append(g.shape(x.inputs[0])[int(x.attrs.get("axis", 0))])
        elif x.op_type == "Add" and n in x.inputs:
            other = next((v for v in x.inputs if v != n), None)
            if other in g.constants:
                top = int(np.max(g.constants[other]))
                out += [r - top for r in _id_ranges(g, x.outputs[0])]
    return out


def _mask_inputs(plan: Plan) -> set[str]:
    """The int / bool graph inputs the plan takes as floats (masks only mask ops read: `mask_values`)."""
    from .translate import mask_values
    return {n for n, _ in plan.graph.inputs} & mask_values(plan.graph)


def _as_stored(v: np.ndarray, dtype: str) -> np.ndarray:
    """A value as the plan stores it: floats in the plan's dtype, integers as they are."""
    return v.astype(dtype) if np.issubdtype(v.dtype, np.floating) else v


def ort_session(model):
    """An onnxruntime CPU session; the IR version is lowered to the least its opsets need, so a
    model saved by a newer `onnx` than onnxruntime knows still runs."""
    import onnx
    try:
        import onnxruntime as ort
    except ImportError:
        raise OpcError("onnxruntime is not installed: it is the reference graphs are checked against",
                       expected="pip install onnxruntime, or --timing-only") from None

    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.ir_version = min(m.ir_version, onnx.helper.find_min_ir_version_for(list(m.opset_import)))
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _view(src: np.ndarray, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """A view: `src` reshaped, or (`offset`) the contiguous range of its elements from there (a
    step's rows of a recurrent layer's input projection in the unfused plan)."""
    size = int(np.prod(shape, dtype=np.int64))
    if not offset and size == src.size:
        return src.reshape(shape)
    return src.reshape(-1)[offset:offset + size].reshape(shape)


def reference(plan: Plan, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph outputs computed by onnxruntime (CPU, fp32) on the same inputs."""
    sess = ort_session(plan.graph.model)
    outs = sess.run(list(plan.graph.outputs), {k: _as_stored(v, "float32") for k, v in feeds.items()})
    return dict(zip(plan.graph.outputs, outs))


def _report(g: Group, plan: Plan, where: str, source: str, **kw) -> KernelReport:
    return KernelReport(name=g.name, op=g.op, nodes=g.nodes, onnx_ops=g.onnx_ops, prim_ops=g.prim_ops,
                        prims=tuple(p.outputs[0] for p in g.prims), where=where, config_source=source, **kw)


def _run_kernel(plan: Plan, g: Group, b: _Built, values: dict[str, np.ndarray], check: bool,
                level: str | None, repeat: int = 1) -> KernelReport:
    wl = b.kernel.workload
    op = get_op(wl.op)
    if check:
        args = []
        for v, (_, shape, dt) in zip(g.inputs, op.inputs(wl)):
            arr = values[v] if v in values else plan.constants[v]
            args.append(np.ascontiguousarray(arr.astype(dt).reshape(shape)))
        res = b.backend.run(b.kernel, args)
        if res.outputs is None:
            raise OpcFailure(f"backend {b.where} returned no outputs for {g.name} ({g.op})")
        values[g.outputs[0]] = res.outputs[0].astype(plan.dtype).reshape(plan.shape(g.outputs[0]))
    else:
        res = b.backend.measure(b.kernel)
    seconds = float(res.seconds)
    if res.cycles is None or b.where == "host":
        for _ in range(repeat - 1):
            seconds = min(seconds, float(b.backend.measure(b.kernel, args if check else None).seconds))
        if repeat == 1:  # one figure per distinct kernel, shared by every plan that runs it
            from .cost import seconds_of
            seconds = seconds_of(b.kernel, b.backend, seconds)
    by_level = res.metrics.get("bytes_by_level") or {}
    off = int(by_level[level]) if b.where != "host" and level in by_level else op.bytes(wl)
    fl = op.flops(wl)
    pct = res.metrics.get("percent_of_peak")
    tgt = b.backend.target
    peak = tgt.peak_flops_per_cycle.get(wl.dtype, 0) * tgt.cores * tgt.clock_ghz * 1e9
    if pct is None and peak > 0 and seconds > 0:
        pct = 100.0 * fl / seconds / peak
    return _report(g, plan, b.where, b.config_source, template=b.kernel.template, config=dict(b.kernel.config),
                   seconds=seconds,
                   cycles=None if res.cycles is None or b.where == "host" else int(res.cycles), offchip_bytes=off,
                   flops=fl, percent_of_peak=None if pct is None else float(pct), note=b.note)


def _run_host(plan: Plan, g: Group, values: dict[str, np.ndarray], check: bool) -> KernelReport:
    """An unsupported ONNX node run by onnxruntime on the host (fp32), timed as the median of 5 runs."""
    from onnx import helper, numpy_helper

    node = next(n for n in plan.graph.nodes if n.name == g.prims[0].node)
    runtime = [v for v in dict.fromkeys(node.inputs) if v and v not in plan.constants]
    consts = [numpy_helper.from_array(np.asarray(plan.constants[v]), v) for v in dict.fromkeys(node.inputs)
              if v and v in plan.constants]
    def elem(v: str) -> int:
        return helper.np_dtype_to_tensor_dtype(np.dtype(plan.graph.dtype(v)))

    gp = helper.make_graph(
        [_to_proto(node)], "host",
        [helper.make_tensor_value_info(v, elem(v), plan.shape(v)) for v in runtime],
        [helper.make_tensor_value_info(o, elem(o), plan.shape(o)) for o in node.outputs if o],
        initializer=consts)
    sess = ort_session(helper.make_model(gp, opset_imports=list(plan.graph.model.opset_import)))
    feeds = {v: (values[v] if check else np.zeros(plan.shape(v), np.float32)).astype(plan.graph.dtype(v))
             for v in runtime}
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    if check:
        for o, val in zip([o for o in node.outputs if o], outs):
            values[o] = _as_stored(np.asarray(val), plan.dtype)
    nbytes = sum(a.nbytes for a in feeds.values()) + sum(np.asarray(o).nbytes for o in outs)
    return _report(g, plan, "host", "-", template="onnxruntime", seconds=float(statistics.median(times)),
                   offchip_bytes=int(nbytes), note=f"fallback cpu: {g.prims[0].reason}")
