"""ONNX -> a small graph IR: runtime inputs with static shapes, constants folded, every value's shape.

We read models with the `onnx` package, not TVM's Relax frontend: every kernel is compiled
through our own op catalogue and templates, so all we need from the model is its nodes,
attributes, weights and shapes; a Relax module would be lowered straight back to these.
Constant subgraphs (Constant, ConstantOfShape, shape arithmetic, anything whose inputs are all
constant) are evaluated once at import with onnx's reference evaluator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..errors import OpcError

MIN_OPSET = 6  # older models are upgraded with onnx.version_converter
UPGRADE_TO = 11  # models below NATIVE_OPSET are converted to this opset at import
NATIVE_OPSET = 9
# integer / bool inputs: token ids (a `gather` kernel), masks (stored as floats when only mask ops read
# them: `translate.mask_values`; else their readers run on the host)
SUPPORTED_DTYPES = ("float32", "int32", "int64", "bool")
# In inference these forward their input: removed at import (their optional outputs unused).
PASS_THROUGH = ("Dropout", "Identity")


@dataclass(frozen=True, kw_only=True)
class Node:
    """One ONNX node that survived constant folding."""

    name: str
    op_type: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    domain: str = ""


@dataclass(frozen=True, kw_only=True)
class Graph:
    """An imported model: nodes in topological order, runtime inputs, folded constants, shapes."""

    name: str
    path: str
    opset: int  # after any upgrade (`source_opset` is the file's own)
    nodes: tuple[Node, ...]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # runtime inputs (float32) with static shapes
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]
    shapes: Mapping[str, tuple[int, ...]]
    batch: int | None
    folded: int  # nodes removed by constant folding
    model: onnx.ModelProto  # the batch-fixed model (what onnxruntime runs as the reference)
    source_opset: int = 0  # the opset the file declared (< NATIVE_OPSET: upgraded to `opset`)
    # numpy dtype names of the runtime inputs and of every value shape inference types that is not
    # float32 (token ids, masks, their casts); a value missing here is float32
    dtypes: Mapping[str, str] = field(default_factory=dict)

    def dtype(self, value: str) -> str:
        if value in self.constants:
            return str(np.asarray(self.constants[value]).dtype)
        return self.dtypes.get(value, "float32")

    def shape(self, value: str) -> tuple[int, ...]:
        if value in self.constants:
            return tuple(self.constants[value].shape)
        return self.shapes[value]


def load(path: str | Path, batch: int | None = None) -> Graph:
    """Read, check, upgrade (opset < 9), batch-fix and fold an ONNX model. Raises OpcError for a
    malformed or truncated file, an opset outside 6..current, or a dynamic dimension without `batch`."""
    model = _read(Path(path))
    source_opset = _opset(model)
    model = _upgrade(model, str(path))
    opset = _opset(model)
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise OpcError("must be a positive integer", arg="--batch", value=batch)
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    inputs = []
    for vi in g.input:
        if vi.name in inits:
            continue  # opset < 9 style: weights listed as inputs
        inputs.append((vi.name, _static_shape(vi, batch, str(path))))
    dtypes: dict[str, str] = {}
    for vi in g.input:
        if vi.name not in inits:
            dtypes[vi.name] = _check_dtype(vi, str(path))
    dynamic = any(not (d.HasField("dim_value") and d.dim_value > 0) for vi in g.input if vi.name not in inits
                  for d in vi.type.tensor_type.shape.dim[:1])
    if batch is not None and not dynamic and inputs and inputs[0][1][:1] != (batch,):
        raise OpcError(f"the model's batch is static ({inputs[0][1][0]}); --batch sets a dynamic batch dimension",
                       arg="--batch", value=batch, expected=f"no --batch, or --batch {inputs[0][1][0]}")
    consts = dict(inits)
    nodes, folded = _fold(_skip_pass_through(_nodes(model), [o.name for o in g.output]), consts, opset)
    protos = {tuple(p.output): p for p in model.graph.node}  # a Loop's body: its proto's graph attribute
    nodes = _embedding_bags(protos, [o.name for o in g.output], nodes, consts, inputs, dtypes)
    _refuse_control_flow(protos, nodes, str(path))
    fixed = _with_shapes(model, dict(inputs))
    shapes = _infer_shapes(fixed, consts, nodes, inputs, str(path), strict=False, dtypes=dtypes)
    while known := {n.name for n in nodes if n.op_type == "Shape" and n.inputs[0] in shapes}:
        # with the batch fixed every Shape is a constant: fold it and what it feeds (view(x.size(0), -1))
        for n in nodes:
            if n.name in known:
                a = n.attrs
                consts[n.outputs[0]] = np.array(shapes[n.inputs[0]][a.get("start", 0):a.get("end")], np.int64)
        nodes, more = _fold([n for n in nodes if n.name not in known], consts, opset)
        folded += len(known) + more
        shapes = _infer_shapes(fixed, consts, nodes, inputs, str(path), strict=False, dtypes=dtypes)
    shapes = _infer_shapes(fixed, consts, nodes, inputs, str(path), dtypes=dtypes)
    return Graph(name=g.name or Path(path).stem, path=str(path), opset=opset, nodes=tuple(nodes),
                 inputs=tuple(inputs), outputs=tuple(o.name for o in g.output), constants=consts, shapes=shapes,
                 batch=batch if batch is not None else (inputs[0][1][0] if inputs and inputs[0][1] else None),
                 folded=folded, model=fixed, source_opset=source_opset,
                 dtypes={k: v for k, v in dtypes.items() if v != "float32"})


def _read(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise OpcError("no such file", arg="MODEL", value=str(path), expected="a path to an .onnx file")
    data = path.read_bytes()
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:  # protobuf's DecodeError and friends
        why = str(e).splitlines()[0] if str(e) else "cannot parse"
        raise OpcError(f"not a valid ONNX file ({type(e).__name__}: {why}; truncated or not ONNX?)", arg="MODEL",
                       value=str(path)) from None
    if not model.graph.node:
        raise OpcError("the file parses but holds no graph nodes (truncated or not ONNX?)", arg="MODEL",
                       value=str(path))
    opset, latest = _opset(model), onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= latest:
        raise OpcError(f"the model uses ONNX opset {opset}", arg="MODEL", value=str(path),
                       expected=f"opset {MIN_OPSET} to {latest}")
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OpcError(f"the ONNX checker rejects the model: {first}", arg="MODEL", value=str(path)) from None
    return model


def _upgrade(model: onnx.ModelProto, path: str) -> onnx.ModelProto:
    """Models older than opset 9 (Caffe2 / early PyTorch exporters) go through onnx's own
    version converter to opset 11. Weights listed as graph inputs stay initializers."""
    if _opset(model) >= NATIVE_OPSET:
        return model
    from onnx import version_converter
    try:
        up = version_converter.convert_version(model, UPGRADE_TO)
        onnx.checker.check_model(up)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OpcError(f"cannot upgrade the model from opset {_opset(model)} to {UPGRADE_TO} with "
                       f"onnx.version_converter: {first}", arg="MODEL", value=path,
                       expected=f"a model at opset {NATIVE_OPSET} or newer (re-export it)") from None
    return up


def _skip_pass_through(nodes: list[Node], graph_outputs: list[str]) -> list[Node]:
    """Drop Dropout / Identity (inference: the output is the input), rewiring their consumers.
    One that produces a graph output, or whose Dropout mask is read, stays (translated to a view)."""
    used = {x for n in nodes for x in n.inputs} | set(graph_outputs)
    alias: dict[str, str] = {}
    kept = []
    for n in nodes:
        if any(x in alias for x in n.inputs):
            n = replace(n, inputs=tuple(alias.get(x, x) for x in n.inputs))
        if (n.op_type in PASS_THROUGH and n.domain == "" and n.outputs[0] not in graph_outputs
                and not any(o in used for o in n.outputs[1:] if o)):
            alias[n.outputs[0]] = n.inputs[0]
            continue
        kept.append(n)
    return kept


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _check_dtype(vi: onnx.ValueInfoProto, path: str) -> str:
    elem = vi.type.tensor_type.elem_type
    name = helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"
    if name not in SUPPORTED_DTYPES:
        raise OpcError(f"graph input {vi.name!r} is {name}", arg="MODEL", value=path,
                       expected="float32 graph inputs (fp16 targets cast internally), int32 / int64 ids, "
                                "or int32 / int64 / bool masks")
    return name


def _static_shape(vi: onnx.ValueInfoProto, batch: int | None, path: str) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    out = []
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
            continue
        label = d.dim_param or "?"
        if i != 0:
            raise OpcError(f"input {vi.name!r} has dynamic dimension {label!r} at axis {i}; only the batch "
                           "axis (0) may be dynamic", arg="MODEL", value=path, expected="a model with static "
                           "non-batch dimensions (re-export with fixed input sizes)")
        if batch is None:
            raise OpcError(f"input {vi.name!r} has a dynamic batch dimension {label!r}", arg="--batch",
                           expected="--batch N to fix it")
        out.append(batch)
    return tuple(out)


def _with_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            for d, s in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = s
    return m


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


CONTROL_FLOW = ("Loop", "If", "Scan")
_BAG_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax"}


def _embedding_bags(protos: Mapping[tuple, onnx.NodeProto], graph_outputs: list[str], nodes: list[Node],
                    consts: dict[str, np.ndarray], inputs: list[tuple[str, tuple[int, ...]]],
                    dtypes: Mapping[str, str]) -> list[Node]:
    """torch's export of nn.EmbeddingBag over a (batch, bag) id tensor: a Loop over the bags whose body
    slices the flat ids from starts[i] to ends[i], gathers those rows of a constant table and reduces
    them (sum, mean, max) over axis 0. When the starts and ends follow from the inputs' static shapes
    alone (not from a runtime offsets tensor) and every bag has the same length, the Loop is the
    lookup of the ids viewed as (bags, bag) followed by the reduction over axis 1: it is rewritten so
    (Reshape, Gather, Reduce), and a sum or mean then folds into one gather kernel with `bag`. Anything
    else is left as it is (and refused as control flow)."""
    by_out = {o: n for n in nodes for o in n.outputs}
    out: list[Node] = []
    changed = False
    for n in nodes:
        rewritten = _bag_loop(n, protos.get(tuple(n.outputs)), by_out, consts, inputs, dtypes)
        out.extend(rewritten if rewritten is not None else [n])
        changed |= rewritten is not None
    keep = set(graph_outputs)
    while changed:  # the loop's own bookkeeping (flat ids, starts, ends) is now read by nothing
        read = {x for n in out for x in n.inputs} | keep
        live = [n for n in out if any(o in read for o in n.outputs)]
        changed = len(live) < len(out)
        out = live
    return out


def _bag_loop(n: Node, proto, by_out, consts, inputs, dtypes) -> list[Node] | None:
    if n.op_type != "Loop" or proto is None or len(n.inputs) != 2 or len(n.outputs) != 1:
        return None
    body = next((a.g for a in proto.attribute if a.name == "body"), None)
    if body is None or len(body.input) != 2 or len(body.output) != 2:
        return None
    it = body.input[0].name
    bn = {o: x for x in body.node for o in x.output}

    def const(v: str) -> list | None:  # a constant of the body or of the outer graph
        x = bn.get(v)
        if x is not None:
            return list(numpy_helper.to_array(x.attribute[0].t).reshape(-1)) if x.op_type == "Constant" else None
        return list(np.asarray(consts[v]).reshape(-1)) if v in consts else None

    red = bn.get(body.output[1].name)
    if red is None or red.op_type not in _BAG_REDUCE:
        return None
    battrs = {a.name: helper.get_attribute_value(a) for a in red.attribute}
    axes = list(battrs.get("axes", []))
    if len(red.input) > 1:
        axes = const(red.input[1])
    if axes != [0] or int(battrs.get("keepdims", 1)) != 0:
        return None
    gat = bn.get(red.input[0])
    if gat is None or gat.op_type != "Gather" or gat.input[0] not in consts or \
            int({a.name: helper.get_attribute_value(a) for a in gat.attribute}.get("axis", 0)) != 0:
        return None
    sl = bn.get(gat.input[1])
    if sl is None or sl.op_type != "Slice" or len(sl.input) < 4:
        return None

    def bound(v: str) -> str | None:  # Unsqueeze(Gather(outer, iteration)) -> outer
        u = bn.get(v)
        g = bn.get(u.input[0]) if u is not None and u.op_type == "Unsqueeze" else None
        return g.input[0] if g is not None and g.op_type == "Gather" and g.input[1] == it else None

    flat, starts, ends = sl.input[0], bound(sl.input[1]), bound(sl.input[2])
    if starts is None or ends is None or const(sl.input[3]) != [0] or (len(sl.input) > 4 and const(sl.input[4]) != [1]):
        return None
    vals = _shape_values((starts, ends), by_out, consts, inputs, dtypes)
    if vals is None:
        return None
    s, e = (np.asarray(v).reshape(-1).astype(np.int64) for v in vals)
    nb = len(e)
    if len(s) < nb or nb == 0:
        return None
    s = s[:nb]
    b = int(e[0] - s[0])
    if b < 1 or not (np.array_equal(s, np.arange(nb) * b) and np.array_equal(e, s + b)):
        return None
    pre, y = f"{n.name}:bag", n.outputs[0]
    src = flat  # the flat ids are a reshape of the (bags, bag) id input: gather with that directly
    while src in by_out and by_out[src].op_type in ("Reshape", "Flatten"):
        src = by_out[src].inputs[0]
    made: list[Node] = []
    if dict(inputs).get(src) != (nb, b):
        consts[pre + ":shape"] = np.array([nb, b], np.int64)
        made.append(Node(name=pre + ":ids", op_type="Reshape", inputs=(flat, pre + ":shape"), outputs=(pre + ":ids",),
                         attrs={}))
        src = pre + ":ids"
    made.append(Node(name=pre + ":rows", op_type="Gather", inputs=(gat.input[0], src), outputs=(pre + ":rows",),
                     attrs={"axis": 0}))
    kind = red.op_type
    if kind == "ReduceSum":
        consts[pre + ":axes"] = np.array([1], np.int64)
        made.append(Node(name=pre, op_type=kind, inputs=(pre + ":rows", pre + ":axes"), outputs=(y,),
                         attrs={"keepdims": 0}))
    else:
        made.append(Node(name=pre, op_type=kind, inputs=(pre + ":rows",), outputs=(y,), attrs={"axes": [1], "keepdims": 0}))
    return made


def _shape_values(values, by_out, consts, inputs, dtypes):
    """The values of `values` when they depend on the graph inputs through Shape nodes only (so their
    static shapes decide them): evaluated with onnx's reference evaluator on zero inputs; else None."""
    from onnx.reference import ReferenceEvaluator

    need: list[Node] = []
    seen: set[str] = set()
    names = {nm for nm, _ in inputs}

    def visit(v: str, through_shape: bool) -> bool:
        if v in consts or v == "":
            return True
        if v in names:
            return through_shape
        n = by_out.get(v)
        if n is None or n.op_type in CONTROL_FLOW:
            return False
        if n.name not in seen:
            seen.add(n.name)
            if not all(visit(x, through_shape or n.op_type == "Shape") for x in n.inputs):
                return False
            need.append(n)
        return True

    if not all(visit(v, False) for v in values):
        return None
    used = {x for n in need for x in n.inputs}
    g = helper.make_graph([_to_proto(n) for n in need], "shape_values",
                          [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(np.dtype(dtypes.get(nm, "float32"))), s)
                           for nm, s in inputs if nm in used],
                          [helper.make_tensor_value_info(v, onnx.TensorProto.UNDEFINED, None) for v in values],
                          initializer=[numpy_helper.from_array(np.asarray(consts[k]), k) for k in used if k in consts])
    try:
        feeds = {nm: np.zeros(s, dtypes.get(nm, "float32")) for nm, s in inputs if nm in used}
        return ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).run(list(values), feeds)
    except Exception:  # noqa: BLE001 (an evaluation the reference cannot do: leave the Loop as it is)
        return None


def _refuse_control_flow(protos: Mapping[tuple, onnx.NodeProto], nodes: list[Node], path: str) -> None:
    """Control flow left after folding (a Loop, If or Scan whose trip count or condition is not a
    constant) is not imported: one line naming the node, and for the Loop that torch writes for
    nn.EmbeddingBag (a body gathering rows of a constant table and reducing them), what to write
    instead."""
    for n in nodes:
        if n.op_type not in CONTROL_FLOW:
            continue
        proto = protos.get(tuple(n.outputs))
        body = [a.g for a in (proto.attribute if proto is not None else []) if a.type == onnx.AttributeProto.GRAPH]
        ops = {x.op_type for g in body for x in g.node}
        if n.op_type == "Loop" and "Gather" in ops and ops & {"ReduceSum", "ReduceMean", "ReduceMax"}:
            raise OpcError(f"node {n.name!r} (Loop) is nn.EmbeddingBag's loop over bags whose bounds are computed at "
                           "run time (an offsets input, bags of different lengths), which is not imported",
                           arg="MODEL", value=path,
                           expected="bags of one length: a (batch, bag) id tensor with no offsets (nn.EmbeddingBag or "
                                    "nn.Embedding then .sum(1) / .mean(1)), which folds into one gather kernel")
        raise OpcError(f"node {n.name!r} ({n.op_type}): control flow whose trip count or condition is computed at "
                       "run time is not imported", arg="MODEL", value=path,
                       expected="a graph without Loop / If / Scan (export with static shapes, or unroll the loop)")


def _nodes(model: onnx.ModelProto) -> list[Node]:
    return [Node(name=n.name or f"{n.op_type}_{i}", op_type=n.op_type, inputs=tuple(n.input), outputs=tuple(n.output),
                 attrs=_attrs(n), domain=n.domain if n.domain != "ai.onnx" else "")
            for i, n in enumerate(model.graph.node)]


def _fold(nodes: list[Node], consts: dict[str, np.ndarray], opset: int) -> tuple[list[Node], int]:
    """Evaluate every node whose inputs are all constant (adding its outputs to `consts`); keep the rest."""
    from onnx.reference import ReferenceEvaluator

    kept, folded = [], 0
    for n in nodes:
        if n.domain == "" and all(x == "" or x in consts for x in n.inputs):
            try:
                vals = ReferenceEvaluator(_single_model(_to_proto(n), n.inputs, consts, opset)).run(None, {})
            except Exception as e:
                raise OpcError(f"cannot fold constant node {n.name!r} ({n.op_type}): {str(e).splitlines()[0]}",
                               arg="MODEL") from None
            for o, v in zip(n.outputs, vals):
                consts[o] = np.asarray(v)
            folded += 1
            continue
        kept.append(n)
    return kept, folded


def _single_model(node: onnx.NodeProto, ins: tuple[str, ...], consts: Mapping[str, np.ndarray], opset: int
                  ) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(consts[x]), x) for x in dict.fromkeys(ins) if x]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
    g = helper.make_graph([node], "fold", [], outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _infer_shapes(model: onnx.ModelProto, consts: Mapping[str, np.ndarray], nodes: list[Node],
                  inputs: list[tuple[str, tuple[int, ...]]], path: str, strict: bool = True,
                  dtypes: dict[str, str] | None = None) -> dict[str, tuple[int, ...]]:
    """Shapes of every runtime value, by onnx shape inference on the folded, batch-fixed model.
    `dtypes` holds the inputs' dtypes (float32 when absent) and gains every inferred value's."""
    dtypes = {} if dtypes is None else dtypes
    g = helper.make_graph(
        [_to_proto(n) for n in nodes], "shapes",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dtypes.get(n, "float32"))), s)
         for n, s in inputs],
        [helper.make_tensor_value_info(o.name, onnx.TensorProto.UNDEFINED, None) for o in model.graph.output],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()
                     if any(k in n.inputs for n in nodes)])
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    try:
        inferred = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception as e:
        raise OpcError(f"shape inference failed: {str(e).strip().splitlines()[-1]}", arg="MODEL", value=path) from None
    shapes = dict(inputs)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.tensor_type.elem_type:
            dtypes.setdefault(vi.name, helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name)
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    for n in nodes if strict else ():
        for o in n.outputs:
            if o and o not in shapes:
                raise OpcError(f"cannot infer a static shape for {o!r} (output of node {n.name!r}, {n.op_type})",
                               arg="MODEL", value=path, expected="static shapes once --batch is fixed")
    return shapes


def _to_proto(n: Node) -> onnx.NodeProto:
    return helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain or None,
                            **{k: (numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v)
                               for k, v in n.attrs.items()})
