"""Partition primitive ops into kernels: the fused plan (registered fusion patterns, then
element-wise chains) and the unfused plan (one kernel per primitive, as op-by-op execution).

The patterns come from the op catalogue: every op with `OpDef.fusion` names, through
`OpDef.unfused()`, the primitive sequence it replaces (conv2d_bn_relu <- conv2d, batch_norm, relu).
A run of element-wise primitives no named pattern covers becomes one `ew_chain` kernel.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Callable, Mapping, Sequence

from ..ops import list_ops, workload
from .translate import Prim

GENERIC_CHAIN = "ew_chain"


@dataclass(frozen=True, kw_only=True)
class Group:
    """One kernel of a plan: a catalogue op at fixed params, or a view / host node."""

    name: str
    op: str  # catalogue op, "view" or "host"
    params: Mapping[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    prims: tuple[Prim, ...]
    why: str = ""  # cost-chosen plans: why this group was (or was not) fused

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.node for p in self.prims))

    @property
    def onnx_ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f"{p.onnx_op}" for p in self.prims))

    @property
    def prim_ops(self) -> tuple[str, ...]:
        return tuple(p.kind if p.kind != "ew_chain" else str(p.params["chain"]) for p in self.prims)


@cache
def fusion_patterns() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(fused op, primitive sequence) for every catalogue fusion, longest first."""
    out = []
    for d in list_ops():
        if not d.fusion or d.unfused_fn is None or d.name == GENERIC_CHAIN:
            continue
        seq = tuple(s.op for s in d.unfused(workload(d.name)))
        if len(seq) > 1:
            out.append((d.name, seq))
    return tuple(sorted(out, key=lambda p: -len(p[1])))


def partition(prims: Sequence[Prim], graph_outputs: Sequence[str], fused: bool = True,
              exclude: frozenset[str] = frozenset()) -> list[Group]:
    """Kernels in an executable (topological) order. `exclude`: fused ops not to form (a target
    that cannot build them: `settle` partitions a group again without its op)."""
    if not fused:
        return _toposort([_single(i, p) for i, p in enumerate(prims)])
    uses = Counter(v for p in prims for v in p.inputs)
    uses.update(graph_outputs)  # a graph output must reach memory: it cannot stay inside a kernel
    consumer = {v: p for p in prims for v in p.inputs if uses[v] == 1}
    producer = {o: p for p in prims for o in p.outputs}
    taken: set[tuple[str, ...]] = set()
    groups = []
    # attention first: it takes the head-split transposes that come before its first product
    for p in prims if ATTENTION not in exclude else ():
        attn = _match_attention(p, consumer, producer, taken) if p.outputs not in taken else None
        if attn is not None:
            taken.update(m.outputs for m in attn[0])
            groups.append(Group(name=f"k{len(groups)}", op=ATTENTION, params=attn[1], inputs=attn[2],
                                outputs=attn[0][-1].outputs, prims=tuple(attn[0])))
    for p in prims:
        if p.outputs in taken:
            continue
        free = {q: c for q, c in consumer.items() if c.outputs not in taken}  # a prim joins one kernel only
        named = _match_named(p, free, exclude)
        chain = _match_chain(p, free) if GENERIC_CHAIN not in exclude else [p]
        if len(chain) > 1 and len(chain) > len(named[1]):
            members, g = chain, _chain_group(len(groups), chain)
        elif named[0]:
            members, g = named[1], _fused_group(len(groups), named[0], named[1])
        else:
            members, g = [p], _single(len(groups), p)
        taken.update(m.outputs for m in members)
        groups.append(g)
    return _toposort(groups)


def _next(p: Prim, consumer: Mapping[str, Prim]) -> Prim | None:
    """The sole consumer of p's output, with p's output moved to its first input (add and mul commute)."""
    if len(p.outputs) != 1:
        return None
    q = consumer.get(p.output)
    if q is None or q.kind in ("view", "host"):
        return None
    if q.inputs[0] == p.output:
        return q
    commutes = q.kind == "add" or (q.kind == "ew_chain" and q.params.get("chain") in ("add", "mul"))
    if commutes and len(q.inputs) == 2 and q.inputs[1] == p.output:
        return Prim(kind=q.kind, params=q.params, inputs=(q.inputs[1], q.inputs[0]), outputs=q.outputs, node=q.node,
                    onnx_op=q.onnx_op)
    return None


ATTENTION = "attention"


def _head_split(v: str, producer: Mapping[str, Prim], consumer: Mapping[str, Prim], taken: set
                ) -> tuple[list[Prim], str, float, tuple[int, int, int]] | None:
    """The head split that made operand `v`: a (seq, heads, d) -> (heads, seq, d) transpose, a view
    to (b, h, seq, d) and at most one scalar multiply (torch scales Q and K by sqrt(scale)), each
    read by the next alone. (prims, the sequence-first value, the scale, its (seq, heads, d)) or None."""
    chain, scale, cur = [], 1.0, producer.get(v)
    if cur is not None and cur.kind == GENERIC_CHAIN and str(cur.params["chain"]).startswith("affine:") \
            and len(cur.inputs) == 1 and float(str(cur.params["chain"]).split(":")[2]) == 0.0 \
            and ";" not in str(cur.params["chain"]):
        chain.append(cur)
        scale = float(str(cur.params["chain"]).split(":")[1])
        cur = producer.get(cur.inputs[0])
    if cur is None or cur.kind != "view":
        return None
    chain.append(cur)
    tr = producer.get(cur.inputs[0])
    if tr is None or tr.kind != "transpose" or str(tr.params["perm"]) != "102":
        return None
    chain.append(tr)
    if any(consumer.get(q.output) is None or q.outputs in taken for q in chain[1:]) or chain[0].outputs in taken:
        return None
    dims = tuple(int(x) for x in str(tr.params["dims"]).split("x"))
    return chain[::-1], tr.inputs[0], scale, dims


def _head_merge(o: Prim, consumer: Mapping[str, Prim]) -> list[Prim] | None:
    """The head merge after P V: a view of its rows to (b, h, seq, d), then the (b, h, seq, d) ->
    (seq, b, h, d) transpose, each read by the next alone."""
    view = consumer.get(o.output)
    if view is None or view.kind != "view":
        return None
    tr = consumer.get(view.output)
    if tr is None or tr.kind != "transpose" or str(tr.params["perm"]) != "2013":
        return None
    return [view, tr]


def _sequence_first(members: list[Prim], params: dict, ins: tuple[str, ...], producer: Mapping[str, Prim],
                    consumer: Mapping[str, Prim], taken: set) -> tuple[list[Prim], dict, tuple[str, ...]]:
    """Attention whose Q, K and V come from head splits and whose output goes to a head merge
    reads and writes the sequence-first tensors itself (layout=sbhd): the four transposes (and
    torch's scaling of Q and K) join the kernel. Otherwise unchanged."""
    splits = [_head_split(v, producer, consumer, taken) for v in ins[:3]]
    merge = _head_merge(members[-1], consumer)
    if merge is None or any(x is None for x in splits):
        return members, params, ins
    (sq, bh, d), (skv, bh_k, d_k), (skv_v, bh_v, d_v) = (x[3] for x in splits)
    if (sq, bh, d) != (params["sq"], params["b"], params["d"]) or (bh_k, d_k) != (bh, d) or (skv_v, bh_v, d_v) != \
            (params["skv"], bh, d) or skv != params["skv"]:
        return members, params, ins
    scale = float(params["scale"]) * splits[0][2] * splits[1][2] * splits[2][2]
    pre = [q for x in splits for q in x[0]]
    return ([*pre, *members, *merge], {**params, "scale": repr(scale), "layout": "sbhd"},
            (splits[0][1], splits[1][1], splits[2][1], *ins[3:]))


def _match_attention(p: Prim, consumer: Mapping[str, Prim], producer: Mapping[str, Prim] | None = None,
                     taken: set | None = None) -> tuple[list[Prim], dict, tuple[str, ...]] | None:
    """Attention as `translate` emits it: batch_matmul(Q, K^T read as K, trans_b) -> [x scale]
    -> [+ mask] -> softmax over the keys -> batch_matmul(P, V), each value read by the next alone.
    (members, attention params, inputs (q, k, v[, mask])) or None. The batch is one axis here
    (b = batch * heads, h = 1), so a mask is the scores' full (b, sq, skv) constant or value."""
    pp = p.params
    if p.kind != "batch_matmul" or not pp.get("trans_b") or pp.get("trans_a") or pp.get("bcast_b"):
        return None
    b, sq, d, skv = pp["b"], pp["m"], pp["k"], pp["n"]
    members, cur, scale, mask = [p], p, 1.0, None
    while (nxt := _next(cur, consumer)) is not None and nxt.kind in (GENERIC_CHAIN, "add"):
        chain = str(nxt.params.get("chain", "add"))
        if chain.startswith("affine:") and mask is None and float(chain.split(":")[2]) == 0.0:
            scale *= float(chain.split(":")[1])
        elif chain == "add" and mask is None and len(nxt.inputs) == 2:
            mask = nxt.inputs[1]
        else:
            return None
        members.append(cur := nxt)
    sm = _next(cur, consumer)
    if sm is None or sm.kind != "softmax" or (sm.params["m"], sm.params["n"]) != (b * sq, skv):
        return None
    pv = _next(sm, consumer)
    if pv is None or pv.kind != "batch_matmul" or pv.params.get("trans_a") or pv.params.get("trans_b") \
            or pv.params.get("bcast_b") or (pv.params["b"], pv.params["m"], pv.params["k"]) != (b, sq, skv) \
            or pv.params["n"] != d:
        return None
    members += [sm, pv]
    params = {"b": b, "h": 1, "sq": sq, "skv": skv, "d": d, "causal": 0, "mask": 2 if mask else 0,
              "scale": repr(scale)}
    ins = (p.inputs[0], p.inputs[1], pv.inputs[1], *((mask,) if mask else ()))
    if producer is None:
        return members, params, ins
    return _sequence_first(members, params, ins, producer, consumer, taken or set())


def _match_named(p: Prim, consumer: Mapping[str, Prim], exclude: frozenset[str] = frozenset()
                 ) -> tuple[str, list[Prim]]:
    for op, seq in fusion_patterns():
        if p.kind != seq[0] or op in exclude:
            continue
        members, cur = [p], p
        for want in seq[1:]:
            cur = _next(cur, consumer)
            if cur is None or cur.kind != want or _ew_key(cur) != _ew_key(members[-1] if len(members) > 1 else cur):
                break
            members.append(cur)
        if len(members) == len(seq):
            return op, members
    return "", []


def _ew_key(p: Prim) -> tuple:
    return tuple(sorted((k, v) for k, v in p.params.items() if k != "chain"))


def _match_chain(p: Prim, consumer: Mapping[str, Prim]) -> list[Prim]:
    if p.step is None:
        return [p]
    members, cur = [p], p
    while (nxt := _next(cur, consumer)) is not None and nxt.step is not None and _ew_key(nxt) == _ew_key(p):
        members.append(nxt)
        cur = nxt
    return members


def _inputs(members: Sequence[Prim]) -> tuple[str, ...]:
    """The anchor's inputs, then each later member's inputs other than the chained value."""
    out = list(members[0].inputs)
    for m in members[1:]:
        out.extend(m.inputs[1:])
    return tuple(out)


def _single(i: int, p: Prim) -> Group:
    return Group(name=f"k{i}", op=p.kind, params=p.params, inputs=p.inputs, outputs=p.outputs, prims=(p,))


def _fused_group(i: int, op: str, members: Sequence[Prim]) -> Group:
    params = dict(members[0].params)
    if op == "add_relu":
        params["bcast"] = 0
    elif op == "add_layer_norm":  # the residual add's shape is the normalisation's rows
        params = dict(members[-1].params)
    return Group(name=f"k{i}", op=op, params=params, inputs=_inputs(members), outputs=members[-1].outputs,
                 prims=tuple(members))


def _chain_group(i: int, members: Sequence[Prim]) -> Group:
    params = {k: v for k, v in members[0].params.items() if k != "chain"}
    params["chain"] = ";".join(m.step for m in members)
    return Group(name=f"k{i}", op=GENERIC_CHAIN, params=params, inputs=_inputs(members),
                 outputs=members[-1].outputs, prims=tuple(members))


def _toposort(groups: list[Group]) -> list[Group]:
    """Kahn's order (stable): a fused group runs once every input it takes is produced."""
    producer = {o: g.name for g in groups for o in g.outputs}
    deps = {g.name: {producer[v] for v in g.inputs if v in producer and producer[v] != g.name} for g in groups}
    done: set[str] = set()
    order: list[Group] = []
    pending = list(groups)
    while pending:
        ready = next(g for g in pending if deps[g.name] <= done)
        pending.remove(ready)
        done.add(ready.name)
        order.append(ready)
    return [replace(g, name=f"k{i}") for i, g in enumerate(order)]


def settle(g: Group, judge: Callable[[Group], tuple[bool, str]], exclude: frozenset[str] = frozenset()
           ) -> list[Group]:
    """A fused group the target cannot build (or that costs more than its parts), partitioned
    again without its op, and again without every smaller fused op `judge` refuses, until each
    multi-primitive group is accepted: conv2d_bias_add_relu on a template without a residual
    epilogue becomes conv2d_bias + add_relu (conv2d_bias_add refused too), not four kernels.
    `judge(group)` -> (accepted, why). Kernels are named g.name.0, g.name.1, ...; each carries the
    decisions that led to it in `why`."""
    excl = set(exclude) | {g.op}
    whys: list[str] = [g.why] if g.why else []
    while True:
        subs = [replace(s, name=f"{g.name}.{i}")
                for i, s in enumerate(partition(list(g.prims), g.outputs, True, frozenset(excl)))]
        verdicts = {}
        for s in subs:
            if len(s.prims) < 2:
                continue
            ok, why = judge(s)
            if not ok:
                excl.add(s.op)
                whys.append(why)
                break
            verdicts[s.name] = why
        else:
            history = "; ".join(whys)
            return [replace(s, why=f"{verdicts[s.name]} ({history})" if verdicts.get(s.name) else history)
                    for s in subs]


def split(g: Group) -> list[Group]:
    """A fused group as one kernel per primitive (what the unfused plan runs for it)."""
    return [replace(_single(i, p), name=f"{g.name}.{i}") for i, p in enumerate(g.prims)]


def toposort(groups: list[Group]) -> list[Group]:
    return _toposort(groups)
