"""Small ONNX models built with `onnx.helper` (never downloaded): a ResNet basic block, a
ResNet-50 bottleneck stage, the MiniGo network of seed 004 Table 1, and an "op zoo" that uses
every supported ONNX op. Weights are random (seeded); BN statistics are random but sane.

The batch axis is dynamic (`N`), so `--batch` sets it. MiniGo is NHWC in the paper
((19, 19, 13) boards); ONNX convolutions are NCHW, so the model takes (N, 13, 19, 19) and the
weights are OIHW; the layer shapes are exactly Table 1's.

    python -m opcompiler.graph.models OUTDIR      # writes every model at full size
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, name: str, seed: int = 0):
        self.name, self.rng = name, np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        name = self._id(op.lower())
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, bias: bool = False) -> str:
        name = self._id("w")
        w = self.rng.standard_normal((cout, cin, k, k)).astype(np.float32) * np.float32(np.sqrt(2.0 / (cin * k * k)))
        ins = [x, self.const(name, w)]
        if bias:
            ins.append(self.const(name + "_b", self.rng.standard_normal(cout).astype(np.float32) * 0.1))
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)

    def bn(self, x: str, c: int) -> str:
        name = self._id("bn")
        g = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        b = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
        m = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
        v = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        return self.node("BatchNormalization", [x] + [self.const(f"{name}_{s}", a) for s, a in
                                                      (("g", g), ("b", b), ("m", m), ("v", v))], epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x])

    def gemm(self, x: str, k: int, n: int, trans_b: int = 1) -> str:
        name = self._id("fc")
        w = (self.rng.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float32)
        b = (self.rng.standard_normal(n) * 0.1).astype(np.float32)
        return self.node("Gemm", [x, self.const(name + "_w", w), self.const(name + "_b", b)], transB=trans_b)

    def model(self, inputs: list[tuple[str, list]], outputs: list[str], opset: int = 17) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, self.name,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [], initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="opcompiler")
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        m.graph.output.extend(inferred[o] for o in outputs)  # typed outputs, batch axis still symbolic
        m.ir_version = min(m.ir_version, 8)  # loadable by older onnxruntime builds too
        onnx.checker.check_model(m)
        return m


def resnet_block(c: int = 64, hw: int = 56, seed: int = 0) -> onnx.ModelProto:
    """ResNet basic block: conv3x3-BN-ReLU, conv3x3-BN, + identity, ReLU."""
    b = _Builder("resnet_basic_block", seed)
    y = b.relu(b.bn(b.conv("x", c, c, 3), c))
    y = b.bn(b.conv(y, c, c, 3), c)
    out = b.relu(b.node("Add", [y, "x"]))
    return b.model([("x", ["N", c, hw, hw])], [out])


def resnet50_stage(cin: int = 64, width: int = 64, hw: int = 56, blocks: int = 3, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 conv2_x stage: `blocks` bottlenecks (1x1 width, 3x3 width, 1x1 4*width), the
    first with a 1x1 projection shortcut (conv+BN)."""
    b = _Builder("resnet50_stage", seed)
    x, c = "x", cin
    for i in range(blocks):
        y = b.relu(b.bn(b.conv(x, c, width, 1), width))
        y = b.relu(b.bn(b.conv(y, width, width, 3), width))
        y = b.bn(b.conv(y, width, 4 * width, 1), 4 * width)
        short = b.bn(b.conv(x, c, 4 * width, 1), 4 * width) if i == 0 else x
        x, c = b.relu(b.node("Add", [y, short])), 4 * width
    return b.model([("x", ["N", cin, hw, hw])], [x])


def resnet18(classes: int = 1000, hw: int = 224, seed: int = 0, width: int = 64) -> onnx.ModelProto:
    """ResNet-18 as torchvision builds it (conv7x7/2, maxpool, 4 stages of 2 basic blocks with 1x1
    projection shortcuts, global average pool, FC), random weights. `width` is the first stage's
    channel count (64 in torchvision; the stages have 1, 2, 4 and 8 times it): the weights grow
    with its square (44.7 MB at 64, 0.7 MB at 8)."""
    b = _Builder("resnet18", seed)
    x = b.relu(b.bn(b.conv("x", 3, width, 7, stride=2), width))
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = width
    for stage, width in enumerate((width, 2 * width, 4 * width, 8 * width)):
        for blk in range(2):
            stride = 2 if stage and not blk else 1
            y = b.relu(b.bn(b.conv(x, c, width, 3, stride=stride), width))
            y = b.bn(b.conv(y, width, width, 3), width)
            short = b.bn(b.conv(x, c, width, 1, stride=stride), width) if stride != 1 or c != width else x
            x, c = b.relu(b.node("Add", [y, short])), width
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return b.model([("x", ["N", 3, hw, hw])], [b.gemm(x, c, classes)])


def minigo(res_blocks: int = 6, filters: int = 64, board: int = 19, features: int = 13, seed: int = 0
           ) -> onnx.ModelProto:
    """MiniGo (seed 004 Table 1): CONV3_INIT, `res_blocks` residual blocks of CONV3_RES, a policy
    head (CONV1_POLICY, FC1, softmax) and a value head (CONV1_VALUE, FC2+ReLU, FC3, tanh written
    as 2*sigmoid(2x)-1 since Tanh is outside the supported op set). Table 1 gives the shapes,
    not the depth; `res_blocks` is ours."""
    b = _Builder("minigo", seed)
    x = b.relu(b.bn(b.conv("board", features, filters, 3), filters))
    for _ in range(res_blocks):
        y = b.relu(b.bn(b.conv(x, filters, filters, 3), filters))
        y = b.bn(b.conv(y, filters, filters, 3), filters)
        x = b.relu(b.node("Add", [y, x]))
    cells = board * board
    p = b.relu(b.bn(b.conv(x, filters, 2, 1), 2))
    p = b.node("Flatten", [p], axis=1)
    policy = b.node("Softmax", [b.gemm(p, 2 * cells, cells + 1)], axis=1)
    v = b.relu(b.bn(b.conv(x, filters, 1, 1), 1))
    v = b.node("Flatten", [v], axis=1)
    v = b.relu(b.gemm(v, cells, 64))
    v = b.gemm(v, 64, 1)
    two, one = b.const("two", np.array(2.0, np.float32)), b.const("minus_one", np.array(-1.0, np.float32))
    value = b.node("Add", [b.node("Mul", [b.node("Sigmoid", [b.node("Mul", [v, two])]), two]), one])
    return b.model([("board", ["N", features, board, board])], [policy, value])


def op_zoo(opset: int = 17, c: int = 8, hw: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Every supported ONNX op once, at a given opset (9..current): for import and end-to-end tests."""
    b = _Builder(f"op_zoo_opset{opset}", seed)
    x = b.conv("x", 3, c, 3, bias=True)                                          # Conv + bias
    x = b.relu(b.bn(x, c))                                                       # BN, Relu
    if opset >= 11:
        lo, hi = b.const("clip_lo", np.array(0.0, np.float32)), b.const("clip_hi", np.array(4.0, np.float32))
        x = b.node("Clip", [x, lo, hi])
    else:
        x = b.node("Clip", [x], min=0.0, max=4.0)
    s = b.node("Sigmoid", [x])
    cshape = b.node("Constant", [], value=numpy_helper.from_array(np.array([1, c, 1, 1], np.int64)))
    ones = b.node("ConstantOfShape", [cshape], value=numpy_helper.from_array(np.array([0.5], np.float32)))
    x = b.node("Mul", [s, ones])                                                 # per-channel Mul (folded const)
    x = b.node("Sum", [x, s, b.node("Identity", [x])])                           # Sum of 3, Identity
    m = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    a = b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = b.node("Concat", [m, a], axis=1)                                         # (N, 2c, hw/2, hw/2)
    x = b.node("Add", [x, b.conv(x, 2 * c, 2 * c, 1)])
    g = b.node("GlobalAveragePool", [x])
    shape = b.const("flat_shape", np.array([0, -1], np.int64))
    f = b.node("Reshape", [g, shape])                                            # (N, 2c)
    f2 = b.node("Flatten", [x], axis=1)
    mm = b.node("MatMul", [f2, b.const("mm_w", (np.random.default_rng(seed).standard_normal(
        (2 * c * (hw // 2) ** 2, 2 * c)) * 0.05).astype(np.float32))])
    h = b.relu(b.gemm(b.node("Add", [f, mm]), 2 * c, 10))
    out = b.node("Softmax", [b.gemm(h, 10, 10, trans_b=0)], axis=1)
    return b.model([("x", ["N", 3, hw, hw])], [out], opset=opset)


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet_block": resnet_block, "resnet50_stage": resnet50_stage, "minigo": minigo, "resnet18": resnet18,
    "op_zoo": op_zoo,
}


def write(name: str, path: str | Path, **kw) -> Path:
    """Build model `name` (keyword arguments shrink it) and save it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(MODELS[name](**kw), str(path))
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "onnx_models")
    for n in MODELS:
        print(write(n, out / f"{n}.onnx"))
