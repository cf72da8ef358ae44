"""Graph plans on models people write (issue 27, issue 23 item 3): a conv's epilogue (its bias, a
BN folded or not, a residual add, a ReLU) stays with the conv; unfused kernels are attributed to
the fused kernel holding their primitive; global pooling runs as a reduction; AveragePool with
asymmetric pads, ceil_mode and count_include_pad=0 on every target.

The ResNet-style model is written the way torch.onnx.export writes one (opset 17, BN folded into
each Conv's bias, Add, Relu, GlobalAveragePool, Flatten, Gemm). Outputs are checked against
onnxruntime with the executor's GRAPH_TOLERANCE (fp32: |err| <= 1e-4 * max|ref| + 1e-3 |ref|;
fp16 on ascend-sim: 2e-2 of each)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opcompiler.backend import get_backend
from opcompiler.graph import load, make_plan
from opcompiler.graph.compare import compare
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

EPILOGUE = {"bias_add", "batch_norm"}


def resnet_export(path, c=16, hw=8, seed=0, unfolded_bn=False):
    """ResNet-style: stem conv(+bias)+relu; block: conv+relu, conv, + shortcut(conv stride 2 downsample), relu; GAP; FC."""
    rng = np.random.default_rng(seed)
    inits, nodes = {}, []
    def conv(name, x, cin, cout, k, stride, pad, bias=True):
        inits[f"{name}.weight"] = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        ins = [x, f"{name}.weight"]
        if bias:
            inits[f"{name}.bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
            ins.append(f"{name}.bias")
        nodes.append(helper.make_node("Conv", ins, [f"{name}_out"], name=f"/{name}/Conv", kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4, dilations=[1, 1], group=1))
        return f"{name}_out"
    def bn(name, x, ch):
        for n, v in (("scale", rng.uniform(0.5, 1.5, ch)), ("b", 0.1 * rng.standard_normal(ch)),
                     ("mean", 0.1 * rng.standard_normal(ch)), ("var", rng.uniform(0.5, 1.5, ch))):
            inits[f"{name}.{n}"] = v.astype(np.float32)
        nodes.append(helper.make_node("BatchNormalization", [x] + [f"{name}.{n}" for n in ("scale", "b", "mean", "var")],
                                      [f"{name}_out"], name=f"/{name}/BN", epsilon=1e-5))
        return f"{name}_out"
    def relu(name, x):
        nodes.append(helper.make_node("Relu", [x], [f"{name}_out"], name=f"/{name}/Relu"))
        return f"{name}_out"
    def add(name, a, b):
        nodes.append(helper.make_node("Add", [a, b], [f"{name}_out"], name=f"/{name}/Add"))
        return f"{name}_out"
    x = relu("stem_relu", conv("stem", "input", 3, c, 3, 1, 1))
    # block 1 (identity shortcut)
    y = relu("b1_relu1", conv("b1_conv1", x, c, c, 3, 1, 1))
    y = conv("b1_conv2", y, c, c, 3, 1, 1)
    if unfolded_bn:
        y = bn("b1_bn2", y, c)
    x = relu("b1_relu2", add("b1_add", y, x))
    # block 2 (downsample shortcut)
    y = relu("b2_relu1", conv("b2_conv1", x, c, 2 * c, 3, 2, 1))
    y = conv("b2_conv2", y, 2 * c, 2 * c, 3, 1, 1)
    s = conv("b2_down", x, c, 2 * c, 1, 2, 0)
    x = add("b2_add", y, s)   # no relu: conv+bias+add
    x = relu("b2_relu2", x)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="/pool/GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="/Flatten", axis=1))
    inits["fc.weight"] = (rng.standard_normal((10, 2 * c)) / np.sqrt(2 * c)).astype(np.float32)
    inits["fc.bias"] = rng.standard_normal(10).astype(np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], name="/fc/Gemm", transB=1,
                                  alpha=1.0, beta=1.0))
    g = helper.make_graph(nodes, "resnet_export", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    return {"folded": resnet_export(str(d / "r.onnx")), "bn": resnet_export(str(d / "rbn.onnx"), unfolded_bn=True)}


def _standalone_epilogue(groups) -> list[str]:
    """Kernels that are a lone bias_add / batch_norm reading a conv's output."""
    made_by = {o: g for g in groups for o in g.outputs}
    return [g.name for g in groups if g.op in EPILOGUE
            and (src := made_by.get(g.inputs[0])) is not None and src.prims[-1].kind == "conv2d"]


def test_conv_epilogues_fuse_whatever_follows(exported):
    plan = make_plan(load(exported["folded"]), "cpu", mode="fused")
    ops = [g.op for g in plan.groups if g.op != "view"]
    assert ops == ["conv2d_bias_relu", "conv2d_bias_relu", "conv2d_bias_add_relu", "conv2d_bias_relu", "conv2d_bias",
                   "conv2d_bias_add_relu", "pool2d", "matmul_bias"]
    res = next(g for g in plan.groups if g.op == "conv2d_bias_add_relu")
    assert res.inputs[3] == "stem_relu_out"  # the shortcut, read in the epilogue
    # a Conv with a bias followed by an unfolded BN: the bias folds into the BN, which fuses with the conv
    bn = make_plan(load(exported["bn"]), "cpu", mode="fused")
    assert "conv2d_bn_add_relu" in [g.op for g in bn.groups]
    assert not _standalone_epilogue(bn.groups)
    unfused = make_plan(load(exported["bn"]), "cpu", mode="unfused")
    assert [g.op for g in unfused.groups].count("bias_add") == 6  # five convs and the Gemm; not the folded one


@pytest.mark.parametrize("target", ["ascend-sim", "dsp-sim", "cpu"])
def test_resnet_export_plans_and_values(exported, target):
    c = compare(load(exported["folded"]), target, config="default")
    assert all(r.correct for r in c.runs.values()), {k: r.max_abs_err for k, r in c.runs.items()}
    kinds = {"fused": c.fused, "cost": c.cost} if target != "cpu" else {"fused": c.fused}  # cpu: cost is timed
    for name, run in kinds.items():
        groups = [g for g in run.plan.groups]
        assert not _standalone_epilogue(groups), (name, [g.op for g in groups])
        built = [k.op for k in run.kernels]
        assert "bias_add" not in built[:-1] and "batch_norm" not in built, (name, built)  # the Gemm's is fused too
    f, u = c.fused.totals(), c.unfused.totals()
    assert f["kernels"] < u["kernels"] and f["offchip_bytes"] < u["offchip_bytes"]
    if target == "dsp-sim":  # the DSP's direct conv reads the residual in its epilogue: no add_relu kernel left
        for run in (c.fused, c.cost):
            ops = [k.op for k in run.kernels]
            assert ops.count("conv2d_bias_add_relu") == 2 and "add_relu" not in ops and "add" not in ops, ops


@pytest.mark.parametrize("target", ["ascend-sim", "dsp-sim"])
def test_attribution_is_by_primitive_and_adds_up(exported, target):
    c = compare(load(exported["folded"]), target, config="default", check=False)
    total = c.unfused.totals()["cycles"]
    for plan in ("fused", "cost"):
        att = c.attribution(plan)
        assert sum(a["unfused_cycles"] for a in att) == total
        names = [u for a in att for u in a["unfused"]]
        assert sorted(names) == sorted(k.name for k in c.unfused.kernels if k.op != "view")  # each exactly once
    by_kernel = {a["kernel"]: a for a in c.attribution("fused")}
    unfused = {k.name: k for k in c.unfused.kernels}
    for a in by_kernel.values():  # a conv's unfused conv2d sits under the kernel holding that conv2d
        mine = [unfused[u].prim_ops[0] for u in a["unfused"]]
        assert sorted(mine) == sorted(a["prim_ops"]), a
    assert c.as_dict()["attribution"]["fused"] == c.attribution("fused")


def test_attribution_names_a_node_split_across_kernels(exported):
    """A cost plan that keeps a Conv's conv2d and its bias_add apart: each kernel says which
    other kernel holds the rest of the node."""
    from opcompiler.graph.compare import attribute
    from opcompiler.graph.executor import run_plan
    from opcompiler.graph.plan import choose
    g = load(exported["folded"])
    fused = make_plan(g, "ascend-sim", mode="fused")

    def cost(op, params):
        return 10.0 if op == "conv2d_bias" else 1.0
    groups = choose(list(fused.groups), cost, load_target("ascend-sim"))
    from dataclasses import replace
    plan = replace(fused, groups=tuple(groups), mode="cost")
    run = run_plan(plan, check=False, config="default")
    un = run_plan(make_plan(g, "ascend-sim", mode="unfused"), check=False, config="default")
    att = {a["op"]: a for a in attribute(run, un) if a["partial_nodes"]}
    assert set(att) == {"conv2d", "bias_add"}
    assert list(att["conv2d"]["partial_nodes"]) == ["/b2_down/Conv"]
    assert att["conv2d"]["partial_nodes"]["/b2_down/Conv"] == [att["bias_add"]["kernel"]]


@pytest.mark.parametrize("target", ["ascend-sim", "dsp-sim"])
def test_global_average_pool_runs_at_elementwise_speed(target):
    """Cycles are simulated and deterministic: the ratio is a property of the kernels."""
    dt = "float16" if target == "ascend-sim" else "float32"
    b = get_backend(load_target(target))

    def cycles(op, shape):
        r = b.measure(b.build(workload(op, shape, dtype=dt), None))
        return r.metrics.get("dsp_cycles") or r.cycles  # the DSP: its own part, not the host's 650 us launch
    pool = cycles("pool2d", "n=1,c=256,h=28,w=28,kernel=28,stride=1,pad=0,mode=avg")
    ew = cycles("bias_add", "n=1,c=256,h=28,w=28")
    assert pool <= 2 * ew, (pool, ew)
    for shape in ("n=2,c=40,h=12,w=12,kernel=12,stride=1,pad=0,mode=avg", "n=1,c=24,h=9,w=9,kernel=9,stride=3,pad=0,mode=max"):
        wl = workload("pool2d", shape, dtype=dt)
        ins = get_op("pool2d").make_inputs(wl)
        got = b.run(b.build(wl, None), ins).outputs[0].astype(np.float32)
        x = ins[0].astype(np.float32)
        want = x.mean(axis=(2, 3), keepdims=True) if wl["mode"] == "avg" else x.max(axis=(2, 3), keepdims=True)
        np.testing.assert_allclose(got, want, rtol=2e-3 if dt == "float16" else 1e-5, atol=2e-3 if dt == "float16" else 1e-6)


def _avgpool_model(path, k, s, pads, ceil, cip):
    n = helper.make_node("AveragePool", ["x"], ["y"], name="ap", kernel_shape=[k, k], strides=[s, s], pads=pads,
                         ceil_mode=ceil, count_include_pad=cip)
    r = helper.make_node("Relu", ["y"], ["z"], name="relu")
    g = helper.make_graph([n, r], "ap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 9, 10])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    onnx.save(onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])),
              path)
    return path


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
@pytest.mark.parametrize("k, s, pads, ceil, cip", [(3, 1, [0, 0, 1, 1], 0, 0), (3, 2, [1, 1, 1, 1], 1, 0),
                                                   (3, 2, [0, 1, 1, 0], 1, 1)])
def test_average_pool_excluding_padding_matches_onnxruntime(tmp_path, target, k, s, pads, ceil, cip):
    c = compare(load(_avgpool_model(str(tmp_path / "ap.onnx"), k, s, pads, ceil, cip)), target, config="default",
                cost_plan=False)
    assert c.fused.correct and c.unfused.correct, (c.fused.max_abs_err, c.unfused.max_abs_err)
