"""DeepFM's pairwise term written out in a model, found in the ONNX graph and folded into one
`fm_interaction` kernel:

    square_of_sum  = e.sum(1).pow(2)          ReduceSum(e, axis 1) -> Pow(., 2) | Mul(., .)
    sum_of_squares = e.pow(2).sum(1)          Pow(e, 2) | Mul(e, e) -> ReduceSum(axis 1)
    square_of_sum - sum_of_squares            Sub

with e a 3-D (batch, fields, dim) value and both sums over axis 1 with the same keepdims. The
intermediates must be read by the chain only (e itself may feed the deep part too). Unfolded,
the chain is two transposes, two row reductions, two squares and a subtraction, each a kernel
through global memory (`graph.unroll` runs it so in the unfused plan); folded, e is read once and
only the (batch, dim) result leaves the chip. Plain data over the graph's nodes: no kernels here."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence


def find(nodes: Sequence[Any], outputs: Sequence[str], consts: Mapping[str, Any],
         shape: Callable[[str], tuple]) -> tuple[dict[str, tuple[str, bool]], set[str]]:
    """{Sub node name: (e, keepdims)} for every folded chain, and the names of the chain's other
    nodes (the translation skips them)."""
    by_out = {o: n for n in nodes for o in n.outputs}
    readers: dict[str, list] = {}
    for n in nodes:
        for v in set(n.inputs):
            readers.setdefault(v, []).append(n)

    def only_reader(v: str, node) -> bool:
        return v not in outputs and [r.name for r in readers.get(v, [])] == [node.name]

    def square_of(v: str):  # Pow(x, 2) or Mul(x, x) producing v: (node, x)
        n = by_out.get(v)
        if n is None:
            return None
        if n.op_type == "Mul" and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1]:
            return n, n.inputs[0]
        if n.op_type == "Pow" and n.inputs[1] in consts and consts[n.inputs[1]].size == 1 \
                and float(consts[n.inputs[1]].reshape(-1)[0]) == 2.0:
            return n, n.inputs[0]
        return None

    def field_sum(v: str):  # ReduceSum over axis 1 of a 3-D value producing v: (node, x, keepdims)
        n = by_out.get(v)
        if n is None or n.op_type != "ReduceSum":
            return None
        axes = n.attrs.get("axes")
        if axes is None and len(n.inputs) > 1 and n.inputs[1] in consts:
            axes = consts[n.inputs[1]].reshape(-1).tolist()
        try:
            nd = len(shape(n.inputs[0]))
        except KeyError:
            return None
        if nd != 3 or axes is None or [int(a) % 3 for a in axes] != [1]:
            return None
        return n, n.inputs[0], bool(int(n.attrs.get("keepdims", 1)))

    found: dict[str, tuple[str, bool]] = {}
    skip: set[str] = set()
    for sub in (n for n in nodes if n.op_type == "Sub" and len(n.inputs) == 2):
        sq_sum, sum_sq = square_of(sub.inputs[0]), field_sum(sub.inputs[1])
        if sq_sum is None or sum_sq is None:
            continue
        a = field_sum(sq_sum[1])  # the sum, squared
        b = square_of(sum_sq[1])  # the squares, summed
        if a is None or b is None or a[1] != b[1] or a[2] != sum_sq[2] or a[1] in consts:
            continue
        if not (only_reader(sub.inputs[0], sub) and only_reader(sub.inputs[1], sub)
                and only_reader(a[0].outputs[0], sq_sum[0]) and only_reader(b[0].outputs[0], sum_sq[0])):
            continue
        found[sub.name] = (a[1], a[2])
        skip.update(x.name for x in (sq_sum[0], sum_sq[0], a[0], b[0]))
    return found, skip


__all__ = ["find"]
