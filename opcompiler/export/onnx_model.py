"""The ONNX binding's models: the fused node in the `opcompiler` domain, and the unfused original.

`model.onnx` holds one node `opcompiler::<op>` whose inputs are the kernel's inputs (the graph
inputs) and whose `kernel` attribute names the export; `model_unfused.onnx` is the op's
unfused decomposition (`OpDef.unfused`) in standard ONNX operators, runnable by onnxruntime,
with the same inputs and output, so the two can be compared value for value.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import OpcError
from ..ops import get_op
from ..workload import Workload

DOMAIN = "opcompiler"
OPSET = 17
_STEP_OPS = ("conv2d", "batch_norm", "bias_add", "relu", "add", "matmul")
_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def check_supported(wl: Workload) -> None:
    """OpcError unless every unfused step has an ONNX spelling here (checked before building)."""
    steps = get_op(wl.op).unfused(wl)
    bad = [s.op for s in steps if s.op not in _STEP_OPS]
    if bad:
        raise OpcError(f"{wl.op} has no ONNX decomposition here (step {bad[0]})", arg="--to", value="onnx",
                       expected=f"an op built from {', '.join(_STEP_OPS)}; or --to torch,lib")
    if wl.dtype not in _DTYPES:
        raise OpcError("ONNX export takes floating-point kernels", arg="--dtype", value=wl.dtype,
                       expected=" or ".join(_DTYPES))


def _value_info(spec: dict[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec["name"], _DTYPES[spec["dtype"]], spec["shape"])


def _attrs(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if isinstance(v, (int, str))}


def fused_model(m: dict[str, Any]) -> onnx.ModelProto:
    """One `opcompiler::<op>` node calling the exported kernel named in its `kernel` attribute."""
    node = helper.make_node(m["op"], [s["name"] for s in m["inputs"]], ["out"], name=m["name"], domain=DOMAIN,
                            kernel=m["name"], target=m["target"]["name"], **_attrs(m["params"]))
    graph = helper.make_graph([node], f"{m['name']}_fused", [_value_info(s) for s in m["inputs"]],
                              [_value_info(m["output"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                              producer_name="opcompiler")
    helper.set_model_props(model, {"opcompiler.record_key": str(m["record_key"]), "opcompiler.fusion": m["fusion"]})
    return model


class _Builder:
    """Emits standard ONNX nodes for the unfused steps, remembering each value's rank."""

    def __init__(self, m: dict[str, Any]):
        self.m = m
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rank: dict[str, int] = {s["name"]: len(s["shape"]) for s in m["inputs"]}
        self.n = 0

    def fresh(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    def node(self, op: str, ins: list[str], rank: int, out: str | None = None, **attrs: Any) -> str:
        out = out or self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        self.rank[out] = rank
        return out

    def transpose(self, x: str, perm: list[int]) -> str:
        return self.node("Transpose", [x], len(perm), perm=perm)

    def per_channel(self, v: str, like: str, layout: str) -> str:
        """Reshape a per-channel vector to broadcast against `like` (channels first or last)."""
        r = self.rank[like]
        shape = [1] * r
        shape[1 if (layout == "NCHW" and r == 4) else r - 1] = -1
        name = self.fresh("shape")
        self.inits.append(numpy_helper.from_array(np.array(shape, dtype=np.int64), name))
        return self.node("Reshape", [v, name], r)

    def conv2d(self, x: str, w: str, p: dict[str, Any]) -> str:
        nhwc = p["layout"] == "NHWC"
        if nhwc:  # ONNX Conv is NCHW / OIHW only
            x, w = self.transpose(x, [0, 3, 1, 2]), self.transpose(w, [3, 2, 0, 1])
        y = self.node("Conv", [x, w], 4, strides=[p["stride"]] * 2, pads=[p["pad"]] * 4,
                      dilations=[p["dilation"]] * 2, group=p["groups"], kernel_shape=[p["r"], p["s"]])
        return self.transpose(y, [0, 2, 3, 1]) if nhwc else y

    def matmul(self, a: str, b: str, p: dict[str, Any]) -> str:
        if p.get("trans_a"):
            a = self.transpose(a, [1, 0])
        if p.get("trans_b"):
            b = self.transpose(b, [1, 0])
        return self.node("MatMul", [a, b], 2)

    def step(self, op: str, ins: list[str], p: dict[str, Any]) -> str:
        layout = str(p.get("layout", "NCHW"))
        if op == "conv2d":
            return self.conv2d(ins[0], ins[1], p)
        if op == "matmul":
            return self.matmul(ins[0], ins[1], p)
        if op == "relu":
            return self.node("Relu", ins, self.rank[ins[0]])
        if op == "add":
            return self.node("Add", ins, self.rank[ins[0]])
        if op == "bias_add":
            return self.node("Add", [ins[0], self.per_channel(ins[1], ins[0], layout)], self.rank[ins[0]])
        if op == "batch_norm":
            y = self.node("Mul", [ins[0], self.per_channel(ins[1], ins[0], layout)], self.rank[ins[0]])
            return self.node("Add", [y, self.per_channel(ins[2], ins[0], layout)], self.rank[ins[0]])
        raise OpcError(f"no ONNX spelling for step {op}", expected=", ".join(_STEP_OPS))


def unfused_model(m: dict[str, Any]) -> onnx.ModelProto:
    """The op's unfused decomposition in standard ONNX, same inputs and output as the fused model."""
    b = _Builder(m)
    names = {f"in{i}": s["name"] for i, s in enumerate(m["inputs"])}
    steps = m["unfused"]
    for i, st in enumerate(steps):
        ins = [names[x] for x in st["inputs"]]
        out = b.step(st["op"], ins, st["params"])
        names[f"s{i}"] = out
    final = names[f"s{len(steps) - 1}"]
    b.nodes.append(helper.make_node("Identity", [final], ["out"], name="out"))
    graph = helper.make_graph(b.nodes, f"{m['name']}_unfused", [_value_info(s) for s in m["inputs"]],
                              [_value_info(m["output"])], initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="opcompiler")
    model.ir_version = min(model.ir_version, 8)  # onnxruntime releases lag the onnx package's IR version
    onnx.checker.check_model(model)
    return model


def write_models(out: Path, m: dict[str, Any]) -> dict[str, str]:
    """Write model.onnx (fused, opcompiler domain) and model_unfused.onnx; return their file names."""
    fused = fused_model(m)
    fused.ir_version = min(fused.ir_version, 8)
    onnx.save(fused, str(out / "model.onnx"))
    onnx.save(unfused_model(m), str(out / "model_unfused.onnx"))
    return {"model": "model.onnx", "unfused_model": "model_unfused.onnx", "domain": DOMAIN,
            "opset": OPSET, "runner": "opc_onnx.py"}
