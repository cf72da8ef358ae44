"""Run ONNX models whose fused nodes live in the `opcompiler` domain (copied as `opc_onnx.py`).

Nodes of the `opcompiler` domain call exported kernels (named by their `kernel` attribute);
every standard node runs on `onnx.reference.ReferenceEvaluator`. `fuse()` rewrites a
framework graph's Conv -> BatchNormalization -> Relu chains (weights as initializers) into
one `opcompiler::conv2d_bn_relu` node that calls a matching exported kernel, folding BN.

    >>> from opc_onnx import Runner, fuse
    >>> y, = Runner("model.onnx", ["."]).run({"data": x, "weight": w, "scale": s, "shift": b})
    >>> fused = fuse(onnx.load("resnet_block.onnx"), ["out/conv"])
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

try:  # inside an export folder
    from .opc_runtime import ExportedKernel, KernelInputError, load
except ImportError:  # as opcompiler.export.onnx_runner
    from .runtime import ExportedKernel, KernelInputError, load

DOMAIN = "opcompiler"


def _kernels(kernels: Sequence[ExportedKernel | str | os.PathLike]) -> dict[str, ExportedKernel]:
    out: dict[str, ExportedKernel] = {}
    for k in kernels:
        k = k if isinstance(k, ExportedKernel) else load(k)
        out[k.name] = k
    return out


def _attr(node: onnx.NodeProto, name: str) -> Any:
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return None


class Runner:
    """Execute `model` with the exported kernels of `kernels` (folders or loaded kernels)."""

    def __init__(self, model: onnx.ModelProto | str | os.PathLike, kernels: Sequence[Any] = ()):
        self.model = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        self.kernels = _kernels(kernels)
        ops = []
        for node in self.model.graph.node:
            if node.domain != DOMAIN:
                continue
            name = _attr(node, "kernel")
            if name not in self.kernels:
                raise KernelInputError(f"node {node.name!r} ({DOMAIN}::{node.op_type}) calls kernel {name!r}; "
                                       f"expected one of the given exports: {sorted(self.kernels) or 'none given'}")
            ops.append(node.op_type)
        self.fused_nodes = len(ops)
        classes = [type(op_type, (OpRun,), {"op_domain": DOMAIN, "_run": self._make_run()})
                   for op_type in sorted(set(ops))]
        self._ev = ReferenceEvaluator(self.model, new_ops=classes)

    def _make_run(self):
        kernels = self.kernels

        def _run(op: OpRun, *inputs: np.ndarray, **_attrs: Any) -> tuple[np.ndarray]:
            k = kernels[_attr(op.onnx_node, "kernel")]
            return (k(*[np.ascontiguousarray(x) for x in inputs]),)
        return _run

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The graph outputs, in order."""
        return list(self._ev.run(None, feeds))


def _consumers(nodes: list[onnx.NodeProto], name: str) -> list[onnx.NodeProto]:
    return [n for n in nodes if name in n.input]


def _conv_params(conv: onnx.NodeProto, w: np.ndarray) -> dict[str, Any] | None:
    """Our conv2d parameters for a Conv node, or None when our kernels cannot express it."""
    strides = _attr(conv, "strides") or [1, 1]
    pads = _attr(conv, "pads") or [0, 0, 0, 0]
    dil = _attr(conv, "dilations") or [1, 1]
    if len(set(strides)) != 1 or len(set(pads)) != 1 or len(set(dil)) != 1 or _attr(conv, "auto_pad") not in (
            None, "NOTSET"):
        return None
    k, cg, r, s = w.shape
    g = int(_attr(conv, "group") or 1)
    return {"k": k, "c": cg * g, "r": r, "s": s, "stride": strides[0], "pad": pads[0], "dilation": dil[0],
            "groups": g, "layout": "NCHW"}


def _match(kernels: dict[str, ExportedKernel], params: dict[str, Any], dtype: str) -> ExportedKernel | None:
    for k in kernels.values():
        m = k.manifest
        if m["op"] == "conv2d_bn_relu" and m["dtype"] == dtype and all(m["params"][a] == v for a, v in params.items()):
            return k
    return None


def fuse(model: onnx.ModelProto, kernels: Sequence[Any]) -> onnx.ModelProto:
    """Replace each Conv -> BatchNormalization -> Relu chain (weights as initializers) that an
    exported conv2d_bn_relu kernel matches by one `opcompiler` node; returns a new model.

    The kernel still checks the data shape when it runs: a graph fed another batch or image
    size fails with expected and got."""
    ks = _kernels(kernels)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    nodes = list(g.node)  # held in a list so the ids below stay valid
    new_nodes, drop = [], set()
    for conv in nodes:
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or conv.input[1] not in inits:
            continue
        bns = _consumers(nodes, conv.output[0])
        if len(bns) != 1 or bns[0].op_type != "BatchNormalization" or not all(i in inits for i in bns[0].input[1:5]):
            continue
        relus = _consumers(nodes, bns[0].output[0])
        if len(relus) != 1 or relus[0].op_type != "Relu":
            continue
        w = numpy_helper.to_array(inits[conv.input[1]])
        params = _conv_params(conv, w)
        k = _match(ks, params, str(w.dtype)) if params else None
        if k is None:
            continue
        bn = bns[0]
        gamma, beta, mean, var = (numpy_helper.to_array(inits[i]).astype(np.float64) for i in bn.input[1:5])
        eps = float(_attr(bn, "epsilon") if _attr(bn, "epsilon") is not None else 1e-5)
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        if len(conv.input) > 2 and conv.input[2]:
            shift = shift + numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) * scale
        base = conv.name or conv.output[0]
        sname, tname = f"{base}_opc_scale", f"{base}_opc_shift"
        g.initializer.extend([numpy_helper.from_array(scale.astype(w.dtype), sname),
                              numpy_helper.from_array(shift.astype(w.dtype), tname)])
        fused = helper.make_node("conv2d_bn_relu", [conv.input[0], conv.input[1], sname, tname], [relus[0].output[0]],
                                 name=f"{base}_opc", domain=DOMAIN, kernel=k.name, target=k.manifest["target"]["name"])
        new_nodes.append((conv, fused))
        drop.update(id(n) for n in (conv, bn, relus[0]))
    if not new_nodes:
        return model
    replaced = {id(c): f for c, f in new_nodes}
    out = [onnx.NodeProto.FromString(replaced.get(id(n), n).SerializeToString())
           for n in nodes if id(n) in replaced or id(n) not in drop]
    del g.node[:]
    g.node.extend(out)
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


def run_model(path: str | Path, feeds: dict[str, np.ndarray], kernels: Sequence[Any] = ()) -> list[np.ndarray]:
    """Run an ONNX file; with no kernels given, the export folder holding the file provides them."""
    path = Path(path)
    return Runner(path, kernels or [path.resolve().parent]).run(feeds)
