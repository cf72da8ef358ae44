"""ONNX nodes -> primitive ops of the catalogue (one kernel each in the unfused plan).

Each supported ONNX node becomes one or more `Prim`s: Conv with a bias is conv2d then bias_add
(the bias folded into a following BN that alone reads it), BatchNormalization is batch_norm
with (scale, shift) folded from its constants, Gemm is matmul then bias_add, Sum is a chain of adds; Flatten, Reshape and Identity are zero-cost views.
A node we cannot compile raises `Unsupported`; with `fallback="cpu"` it becomes a host prim
that onnxruntime runs on the host, reported separately.

`translate` is the entry; `TABLE` maps each supported ONNX op to its translation, one module per
model family: `elementwise`, `cnn`, `shape`, `transformer`, `recurrent`, `recsys` (with `fm`, the
DeepFM matcher), all on `common` (`Prim`, `Ctx`, `Unsupported`, the shared helpers).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...errors import OpcError
from ..importer import Graph, Node
from . import cnn, elementwise, fm, recurrent, shape, transformer
from .common import Ctx, Prim, Unsupported, ew_params
from .elementwise import is_int, mask_values
from .recsys import emit_fm, id_offsets
from .transformer import emit_layer_norm, written_out_layer_norms

__all__ = ["translate", "Prim", "Unsupported", "Ctx", "TABLE", "SUPPORTED", "ew_params", "mask_values", "is_int"]


def translate(graph: Graph, fallback: str | None = None) -> tuple[list[Prim], dict[str, np.ndarray], dict[str, tuple]]:
    """Prims in topological order, the constants they use (folded BN etc. added), all shapes."""
    if fallback not in (None, "cpu"):
        raise OpcError("unknown fallback", arg="--fallback", value=fallback, expected="cpu")
    ctx = Ctx(graph=graph, consts=dict(graph.constants), shapes=dict(graph.shapes))
    ctx.uses.update(v for n in graph.nodes for v in n.inputs if v)
    ctx.uses.update(graph.outputs)
    written_ln, skip = written_out_layer_norms(ctx)
    fm_chains, fm_skip = fm.find(graph.nodes, graph.outputs, ctx.consts, ctx.shape)  # DeepFM's pairwise term
    skip |= fm_skip
    masks = mask_values(graph)  # int / bool values the plan stores as floats (runtime masks)
    for node in graph.nodes:
        if node.name in skip:
            continue
        try:
            fn = (lambda c, n: emit_layer_norm(c, n, *written_ln[n.name])) if node.name in written_ln else \
                (lambda c, n: emit_fm(c, n, *fm_chains[n.name])) if node.name in fm_chains else \
                TABLE.get(node.op_type)
            if fn is None:
                raise Unsupported(node, f"op {node.op_type} is not supported (supported: {', '.join(SUPPORTED)})")
            ints = [v for v in node.inputs if v and v not in ctx.consts and is_int(graph.dtype(v)) and v not in masks]
            if node.op_type == "Gather" and node.inputs[0] in ctx.consts:  # an embedding lookup: `gather` takes the ids
                ints = [v for v in ints if v != node.inputs[1]]
            if node.op_type == "Add" and id_offsets(ctx, node) is not None:  # ids + offsets: folds into the gathers
                ints = []
            if ints:  # token ids, masks and what is computed from them: no target kernel takes integers
                raise Unsupported(node, f"{node.op_type} of the integer tensor {ints[0]!r} ({graph.dtype(ints[0])}): "
                                        "integer tensors run on the host")
            mark = len(ctx.prims)
            try:
                fn(ctx, node)
            except Unsupported:
                del ctx.prims[mark:]
                raise
        except Unsupported as e:
            if fallback is None:
                raise OpcError(f"node {node.name!r} ({node.op_type}): {e.reason}", arg="MODEL", value=graph.path,
                               expected="--fallback cpu to run unsupported nodes on the host") from None
            ctx.prims.append(Prim(kind="host", params={}, inputs=node.inputs, outputs=node.outputs, node=node.name,
                                  onnx_op=node.op_type, reason=e.reason))
    return _drop_unread_row_views(ctx, graph), ctx.consts, ctx.shapes


def _drop_unread_row_views(ctx: Ctx, graph: Graph) -> list[Prim]:
    """The prims without the views back to N-D that nothing reads (every reader took the 2-D value):
    a kept view would count as a second reader of the 2-D value and stop its fusion. A row view
    reads a kernel's 2-D output, never another row view, so one pass drops them all."""
    read = {v for p in ctx.prims for v in p.inputs} | set(graph.outputs)
    return [p for p in ctx.prims if not (p.kind == "view" and p.output in ctx.row_views and p.output not in read)]


# The one table of supported ONNX ops: each op's translation (in its family's module). Constant and
# ConstantOfShape never reach it: the importer folds every constant subgraph (`importer.py`).
TABLE: dict[str, Callable[[Ctx, Node], None]] = {
    "Conv": cnn.conv, "BatchNormalization": cnn.batch_norm, "Relu": elementwise.relu, "Add": elementwise.add,
    "Sum": elementwise.sum_, "Mul": elementwise.mul, "Gemm": transformer.gemm, "MatMul": transformer.matmul,
    "MaxPool": cnn.pool("max"), "AveragePool": cnn.pool("avg"), "GlobalAveragePool": cnn.global_avg,
    "Flatten": shape.view, "Reshape": shape.view, "Squeeze": shape.view, "Unsqueeze": shape.view,
    "Softmax": transformer.softmax, "LogSoftmax": transformer.log_softmax, "Clip": elementwise.clip,
    "Concat": shape.concat, "Sigmoid": elementwise.chain("sigmoid"), "HardSigmoid": elementwise.hard_sigmoid,
    "HardSwish": elementwise.hardswish, "Transpose": shape.transpose, "Slice": shape.slice_,
    "ReduceMean": cnn.reduce("mean"), "ReduceSum": cnn.reduce("sum"), "ReduceMax": cnn.reduce("max"),
    "LRN": cnn.lrn, "Identity": shape.view, "Dropout": shape.dropout, "Sub": elementwise.sub,
    "Div": elementwise.div, "Pow": elementwise.pow_, "Erf": elementwise.chain("erf"),
    "Tanh": elementwise.chain("tanh"), "Gelu": elementwise.gelu, "Sqrt": elementwise.chain("pow:0.5"),
    "Reciprocal": elementwise.chain("rec"), "LayerNormalization": transformer.layer_norm, "Gather": shape.gather,
    "LSTM": recurrent.lstm, "GRU": recurrent.gru, "Cast": elementwise.cast, "Equal": elementwise.equal,
    "Not": elementwise.not_, "Where": elementwise.where, "Expand": elementwise.expand,
}
SUPPORTED = (*TABLE, "Constant", "ConstantOfShape")  # what `translate` takes, as its error message lists it
