"""The fused-epilogue vocabulary comes from the catalogue (issue 35, item 5): a fused op declares its
epilogue steps (`OpDef.epilogue`, the chain-step vocabulary of `opcompiler.ops.steps`) and every
conv / matmul template derives which fused ops it lowers from them; no template keeps a list of op names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from opcompiler.api import run_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, list_ops, workload
from opcompiler.ops.steps import lowerable

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"n": 1, "c": 16, "h": 8, "w": 8, "k": 16, "r": 3, "s": 3, "pad": 1}


def test_fused_ops_declare_their_epilogue_as_their_unfused_steps():
    """The epilogue is the chain of the unfused ops after the anchor (conv2d / matmul)."""
    for o in list_ops():
        if o.family not in ("conv2d", "matmul") or not o.fusion:
            continue
        wl = workload(o.name)
        tail = [s for st in o.unfused(wl)[1:] for s in get_op(st.op).steps(workload(st.op, st.params))]
        assert o.epilogue_steps(wl) == tail, o.name


def test_templates_keep_no_fused_op_names():
    # conv2d_bias and matmul_bias are also the DSL's TE stage names of the bias add, which the
    # templates find blocks by: the op names to look for are the others
    names = [o.name for o in list_ops() if o.family in ("conv2d", "matmul") and o.fusion
             and o.name not in ("conv2d_bias", "matmul_bias")]
    for rel in ("schedules/ascend/conv2d.py", "schedules/ascend/matmul.py", "schedules/dsp/conv2d.py",
                "schedules/dsp/grouped.py", "schedules/dsp/matmul.py"):
        text = (ROOT / rel).read_text()
        assert not [n for n in names if re.search(rf'"{n}"', text)], rel


def test_lowerable_keeps_the_pipeline_order():
    table = {"bias": "bias", "bn": "bn", "add": "res", "relu": "relu"}
    assert lowerable([("bn", ()), ("add", ()), ("relu", ())], table, ordered=True) == ("bn", "res", "relu")
    assert lowerable([("relu", ()), ("bias", ())], table, ordered=True) is None
    assert lowerable([("bias", ()), ("hardswish", ())], table) is None


def test_conv2d_bias_hardswish_on_cpu():
    rep = run_op("conv2d_bias_hardswish", "cpu", shape=SHAPE, dtype="float32")
    assert rep["correct"], rep


@pytest.mark.parametrize("shape", [
    SHAPE,
    {"n": 2, "c": 24, "h": 15, "w": 13, "k": 40, "r": 3, "s": 3, "pad": 1, "stride": 2},  # ragged pixel tiles
    {"n": 1, "c": 32, "h": 14, "w": 14, "k": 32, "r": 3, "s": 3, "pad": 1, "groups": 32},  # depthwise
])
def test_conv2d_bias_hardswish_on_ascend_sim(shape):
    """The cube's epilogue lowers the HardSwish step (one catalogue entry, one lowering of the step):
    values against the op's numpy reference (fp16, tolerance of the run's comparison)."""
    rep = run_op("conv2d_bias_hardswish", "ascend-sim", shape=shape, dtype="float16")
    assert rep["correct"] and rep["max_abs_err"] <= 1e-2, rep


def test_hardswish_epilogue_costs_its_five_vector_instructions():
    """Same conv, same tiles (one 16 x 16 output tile per core, one channel group): HardSwish's
    adds, mins, maxs, muls, mul replace ReLU's relu, each 256 fp16 elements = 2 repeats costing
    vec_startup + 2 x vec_cycles_per_repeat; the vector pipe is on the critical path here, so the
    kernel is exactly the 4 extra instructions slower, on both clocks."""
    from collections import Counter

    from opcompiler.backend import get_backend
    from opcompiler.backend.ascend import timing
    from opcompiler.backend.ascend.machine import Machine
    from opcompiler.backend.ascend.program import Vec
    from opcompiler.target import load_target

    be = get_backend(load_target("ascend-sim"))
    got = {}
    for op in ("conv2d_bias_relu", "conv2d_bias_hardswish"):
        kern = be.build(workload(op, SHAPE, dtype="float16"), {"m_tile": 16, "k_tile": 64, "n_tile": 16,
                                                                "double_buffer": 1, "block_dim": 32, "w_resident": 1})
        prog = kern.artifact.plan.make_program(0)
        t = timing.schedule(prog)
        assert t.cycles == be.measure(kern).cycles
        got[op] = (Counter(i.op for i in prog.instrs if isinstance(i, Vec)), t)
    (relu_ops, relu_t), (hs_ops, hs_t) = got.values()
    assert hs_ops - relu_ops == Counter(["adds", "mins", "maxs", "muls", "mul"])
    assert relu_ops - hs_ops == Counter(["relu"])
    m = Machine.from_target(load_target("ascend-sim"))
    per = m.vec_startup + 2 * m.vec_cycles_per_repeat
    assert per == 18
    assert hs_t.busy["V"] - relu_t.busy["V"] == 4 * per
    assert hs_t.cycles - relu_t.cycles == 4 * per


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "dsp-sim"])
def test_a_mobilenet_v3_block_fuses_conv_bias_hardswish(tmp_path, target):
    """MobileNetV3's conv blocks (conv, depthwise conv, 1x1 conv, each + HardSwish) import as the
    `hardswish` op, so the catalogue's pattern conv2d, bias_add, hardswish fuses each into one
    conv2d_bias_hardswish kernel on every target; values against onnxruntime."""
    torch = pytest.importorskip("torch")
    from opcompiler.graph import load, make_plan, run_plan

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 16, 3, 2, 1)
            self.c2 = torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16)
            self.c3 = torch.nn.Conv2d(16, 24, 1)
            self.fc = torch.nn.Linear(24, 10)

        def forward(self, x):
            hs = torch.nn.functional.hardswish
            return self.fc(hs(self.c3(hs(self.c2(hs(self.c1(x)))))).mean((2, 3)))

    torch.manual_seed(0)
    path = tmp_path / "mnv3_block.onnx"
    torch.onnx.export(Block().eval(), (torch.randn(1, 3, 32, 32),), str(path), opset_version=17, dynamo=False,
                      input_names=["x"], output_names=["y"])
    run = run_plan(make_plan(load(path), target))
    assert run.correct, run.max_abs_err
    assert [k.op for k in run.on_target()].count("conv2d_bias_hardswish") == 3
