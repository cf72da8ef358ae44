"""Element-wise ONNX ops: activations and one-step chains (Relu, Sigmoid, Clip, Gelu, ...), the
arithmetic ops (Add, Sub, Mul, Div, Pow, Sum) on `common.binary`, and the runtime masks: int /
bool inputs only mask ops read (`mask_values`), and Cast, Equal, Not, Where and Expand on them."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..importer import Graph, Node
from .common import Ctx, Unsupported, bcast_runtime, binary, ew_params, need_const, runtime, scalar, unary
from .recsys import id_offsets


F32_MAX = float(np.finfo(np.float32).max)


def relu(ctx: Ctx, node: Node) -> None:
    unary(ctx, node, "relu", {})


def chain(step: str) -> Callable[[Ctx, Node], None]:
    def fn(ctx: Ctx, node: Node) -> None:
        unary(ctx, node, "ew_chain", {"chain": step})
    return fn


def clip(ctx: Ctx, node: Node) -> None:
    runtime(ctx, node, node.inputs[0], "input")  # (checked before the bounds are read)
    if ctx.graph.opset < 11:
        lo, hi = node.attrs.get("min", -F32_MAX), node.attrs.get("max", F32_MAX)
    else:
        ins = list(node.inputs) + ["", ""]
        lo = float(need_const(ctx, node, ins[1], "min")) if ins[1] else -F32_MAX
        hi = float(need_const(ctx, node, ins[2], "max")) if ins[2] else F32_MAX
    unary(ctx, node, "ew_chain", {"chain": f"clip:{float(lo)!r}:{float(hi)!r}"})


def hard_sigmoid(ctx: Ctx, node: Node) -> None:
    x = runtime(ctx, node, node.inputs[0], "input")
    a, b = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    ctx.emit("ew_chain", {**ew_params(ctx.shape(x)), "chain": f"affine:{a!r}:{b!r};clip:0.0:1.0"}, (x,),
             node.outputs[0], node)


def gelu(ctx: Ctx, node: Node) -> None:
    approx = node.attrs.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    unary(ctx, node, "ew_chain", {"chain": "gelu_tanh" if approx == "tanh" else "gelu"})


def add(ctx: Ctx, node: Node) -> None:
    fold = id_offsets(ctx, node)
    if fold is not None:  # integer ids + constant offsets: no kernel, each reading Gather adds them
        ctx.id_offsets[node.outputs[0]] = fold
        return
    binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "add")


def mul(ctx: Ctx, node: Node) -> None:
    binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "mul")


def sub(ctx: Ctx, node: Node) -> None:
    binary(ctx, node, node.inputs[0], node.inputs[1], node.outputs[0], "sub")


def div(ctx: Ctx, node: Node) -> None:
    """a / b: times 1/b for a constant b; else a times `rec` of b (the vector unit's reciprocal)."""
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if b in ctx.consts:
        c = ctx.consts[b].astype(np.float64)
        if np.any(c == 0):
            raise Unsupported(node, f"division by a constant {b!r} that holds 0")
        binary(ctx, node, a, ctx.const(f"{node.name}:{b}:rec", 1.0 / c), out, "mul")
        return
    r = f"{out}:rec"
    ctx.shapes[r] = tuple(ctx.shape(b))
    unary(ctx, node, "ew_chain", {"chain": "rec"}, x=b, out=r)
    binary(ctx, node, a, r, out, "mul")


def pow_(ctx: Ctx, node: Node) -> None:
    """x ** p for a constant scalar p: 1 a view, 2 and 3 products (any sign of x), -1 `rec`, any
    other p the `pow` step (exp(p ln x): x > 0, as x ** p is real only there for a fractional p)."""
    x, out = runtime(ctx, node, node.inputs[0], "base"), node.outputs[0]
    p = scalar(ctx, node.inputs[1])
    if p is None:
        raise Unsupported(node, "Pow with a runtime or non-scalar exponent")
    if p == 1.0:
        ctx.emit("view", {}, (x,), out, node)
    elif p in (2.0, 3.0):
        sq = out if p == 2.0 else f"{out}:sq"
        ctx.shapes[sq] = tuple(ctx.shape(x))
        binary(ctx, node, x, x, sq, "mul")
        if p == 3.0:
            binary(ctx, node, sq, x, out, "mul")
    elif p == -1.0:
        unary(ctx, node, "ew_chain", {"chain": "rec"})
    elif float(p).is_integer():
        raise Unsupported(node, f"Pow with the integer exponent {p:g} (2, 3, 1 and -1 are lowered)")
    else:
        unary(ctx, node, "ew_chain", {"chain": f"pow:{p!r}"})


def sum_(ctx: Ctx, node: Node) -> None:
    ins = [v for v in node.inputs if v]
    if len(ins) == 1:
        ctx.emit("view", {}, (ins[0],), node.outputs[0], node)
        return
    acc = ins[0]
    for i, v in enumerate(ins[1:]):
        out = node.outputs[0] if i == len(ins) - 2 else f"{node.outputs[0]}:sum{i}"
        binary(ctx, node, acc, v, out, "add")
        acc = out


# Masks given at run time: an int / bool graph input that only mask ops read (through int / bool
# values: Cast, Equal, Not, the condition of Where, views and Expand) is a mask input. The executor
# stores it as the plan's float dtype when it is fed (`mask_values`), and every int / bool value
# computed from it is a float 0/1 (bool) or integer-valued (int) tensor: Cast is a view (int -> bool
# is clip(x*x, 0, 1)), Equal with a constant c is 1 - clip((x - c)^2, 0, 1), Not is 1 - x, and
# Where(c, a, b) is b + c * (a - b), an `ew_chain`; `-inf` (masked_fill) is kept finite at -3e4.
MASK_OPS = ("Cast", "Equal", "Not", "Where", "Unsqueeze", "Reshape", "Squeeze", "Flatten", "Expand", "Identity")


MASK_NEG = 3.0e4  # |a constant| of a Where is at most this: -inf finite in fp16, and exp(-3e4 - max) is 0


def is_int(dtype: str) -> bool:
    """An integer or bool dtype name (the tensors no target kernel computes with as such)."""
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def mask_values(graph: Graph) -> set[str]:
    """The mask inputs (see above) and every int / bool value computed from them: the graph inputs of
    an int / bool dtype none of whose readers, nor the readers of the int / bool values they compute,
    is anything but a mask op (Where and the views reading them as their data / condition only), and
    that are not graph outputs. An input that a Gather also reads (token ids) is not a mask."""
    readers: dict[str, list[tuple[Node, int]]] = {}
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            if v:
                readers.setdefault(v, []).append((n, i))
    found: set[str] = set()
    for name, _ in graph.inputs:
        if not is_int(graph.dtype(name)):
            continue
        seen, todo, ok = {name}, [name], True
        while todo and ok:
            v = todo.pop()
            ok = v not in graph.outputs
            for n, i in readers.get(v, ()):
                if n.op_type not in MASK_OPS or (i != 0 and n.op_type not in ("Equal",)):
                    ok = False
                    break
                for o in n.outputs:
                    if o and is_int(graph.dtype(o)) and o not in seen:
                        seen.add(o)
                        todo.append(o)
        if ok:
            found |= seen
    return found


def expand(ctx: Ctx, node: Node) -> None:
    """Expand of a runtime tensor (a padding mask to every head): a view when it only adds unit axes,
    else copies by `concat` kernels (`bcast_runtime`)."""
    x = runtime(ctx, node, node.inputs[0], "input")
    out = node.outputs[0]
    y = bcast_runtime(ctx, node, x, ctx.shapes[out], f"{out}:bc")
    ctx.emit("view", {}, (y,), out, node, ctx.shapes[out])


def cast(ctx: Ctx, node: Node) -> None:
    """Cast of a mask value (a view: the plan stores it as floats already; int -> bool is
    clip(x*x, 0, 1), 1 for any nonzero integer), or of a float tensor to float32 (a view)."""
    from onnx import helper
    x = runtime(ctx, node, node.inputs[0], "input")
    to = helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])).name
    src = ctx.graph.dtype(x)
    out = node.outputs[0]
    if is_int(src):  # a mask value (`translate` refuses any other integer tensor)
        if to == "bool" and src != "bool":
            ctx.emit("ew_chain", {**ew_params(ctx.shape(x)), "chain": "mul;clip:0.0:1.0"}, (x, x), out, node,
                     ctx.shape(x))
        else:
            ctx.emit("view", {}, (x,), out, node, ctx.shape(x))
        return
    if to != "float32":
        raise Unsupported(node, f"Cast of a {src} tensor to {to} (a float32 result, or casts of integer / bool "
                                "masks, are lowered)")
    ctx.emit("view", {}, (x,), out, node, ctx.shape(x))


def equal(ctx: Ctx, node: Node) -> None:
    """Equal of a mask value and a scalar constant c: 1 - clip((x - c)^2, 0, 1), one `ew_chain`
    ((x - 2c) * x + c^2 of integer-valued x; x or 1 - x for a bool x). Exact for integers while the
    plan's dtype holds (x - c)^2, and for any larger it is clipped to 1 anyway."""
    a, b = node.inputs[:2]
    if a in ctx.consts:
        a, b = b, a
    x = runtime(ctx, node, a, "input")
    c = scalar(ctx, b)
    if not is_int(ctx.graph.dtype(x)) or c is None:
        raise Unsupported(node, "Equal of a runtime integer / bool mask and a scalar constant is lowered "
                                f"(got {ctx.graph.dtype(x)} {list(ctx.shape(x))} and {b!r})")
    xs, out = ctx.shape(x), node.outputs[0]
    if ctx.graph.dtype(x) == "bool":
        if c:
            ctx.emit("view", {}, (x,), out, node, xs)
        else:
            ctx.emit("ew_chain", {**ew_params(xs), "chain": "affine:-1.0:1.0"}, (x,), out, node, xs)
        return
    chain = f"affine:1.0:{-2.0 * c!r};mul;affine:1.0:{c * c!r};clip:0.0:1.0;affine:-1.0:1.0"
    ctx.emit("ew_chain", {**ew_params(xs), "chain": chain}, (x, x), out, node, xs)


def not_(ctx: Ctx, node: Node) -> None:
    unary(ctx, node, "ew_chain", {"chain": "affine:-1.0:1.0"})


def where(ctx: Ctx, node: Node) -> None:
    """Where(c, a, b) with c a bool mask (0/1 floats): b + c * (a - b), one `ew_chain` on the
    broadcast shape (runtime operands broadcast by `bcast_runtime`, constants materialized). Its
    constants are clipped to +-3e4 (masked_fill's -inf: finite in fp16, exp(-3e4 - max) is 0).
    Two forms are additive: constants a and b (a padding mask: c * (a - b) + b, one `affine` on
    c), and masked_fill(c, -inf) of scores that only softmaxes read: scores + c * -3e4 (the same
    probabilities), so the attention pattern (scores + mask -> softmax) keeps its kernel."""
    c, a, b = node.inputs[:3]
    out = node.outputs[0]
    oshape = tuple(ctx.shapes[out])
    if c in ctx.consts:
        raise Unsupported(node, "Where with a constant condition and runtime values (a runtime mask is lowered)")
    if ctx.graph.dtype(c) != "bool":
        raise Unsupported(node, f"Where with a {ctx.graph.dtype(c)} condition")
    for v in (a, b):
        if is_int(ctx.graph.dtype(v)):
            raise Unsupported(node, f"Where of the integer tensor {v!r} (float values are lowered)")

    def const(v: str) -> np.ndarray:
        return np.clip(ctx.consts[v].astype(np.float32), -MASK_NEG, MASK_NEG)
    av = float(const(a).reshape(-1)[0]) if a in ctx.consts and ctx.consts[a].size == 1 else None
    bv = float(const(b).reshape(-1)[0]) if b in ctx.consts and ctx.consts[b].size == 1 else None
    cs = tuple(ctx.shape(c))
    if av is not None and bv is not None:  # c * (a - b) + b, on c's shape, then broadcast
        mid = f"{out}:sel" if cs != oshape else out
        ctx.emit("ew_chain", {**ew_params(cs), "chain": f"affine:{av - bv!r}:{bv!r}"}, (c,), mid, node, cs)
        if mid != out:
            y = bcast_runtime(ctx, node, mid, oshape, f"{out}:bc")
            ctx.emit("view", {}, (y,), out, node, oshape)
        return
    readers = [r for r in ctx.graph.nodes if out in r.inputs]
    if av is not None and av <= -MASK_NEG and b not in ctx.consts and out not in ctx.graph.outputs and readers \
            and all(r.op_type == "Softmax" for r in readers):
        m = f"{out}:mask"
        ctx.emit("ew_chain", {**ew_params(cs), "chain": f"affine:{av!r}:0.0"}, (c,), m, node, cs)
        binary(ctx, node, b, m, out, "add")
        return
    operands: list[str] = []
    steps: list[str] = []

    made: dict[str, str] = {}

    def full(v: str, tag: str) -> str:  # v at the broadcast shape (each made once)
        if tag not in made:
            made[tag] = ctx.const(f"{node.name}:{tag}", np.broadcast_to(const(v), oshape)) if v in ctx.consts \
                else bcast_runtime(ctx, node, v, oshape, f"{out}:{tag}")
        return made[tag]
    if a not in ctx.consts:  # x = a; a - b
        x = full(a, "a")
        if bv is not None:
            steps.append(f"affine:1.0:{-bv!r}")
        else:
            steps.append("sub")
            operands.append(full(b, "b"))
    else:  # x = b; a - b = -b + a
        x = full(b, "b")
        if av is not None:
            steps.append(f"affine:-1.0:{av!r}")
        else:
            steps += ["affine:-1.0:0.0", "add"]
            operands.append(full(a, "a"))
    steps.append("mul")
    operands.append(full(c, "c"))
    if bv is not None:
        steps.append(f"affine:1.0:{bv!r}")
    else:
        steps.append("add")
        operands.append(full(b, "b"))
    ctx.emit("ew_chain", {**ew_params(oshape), "chain": ";".join(steps)}, (x, *operands), out, node, oshape)


def hardswish(ctx: Ctx, node: Node) -> None:
    """HardSwish: the catalogue's one-step `hardswish` op."""
    unary(ctx, node, "hardswish", {})
