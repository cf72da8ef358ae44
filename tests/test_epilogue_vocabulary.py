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


@pytest.mark.parametrize("target,dtype", [("ascend-sim", "float16"), ("dsp-sim", "float32")])
def test_conv2d_bias_hardswish_is_refused_by_name_on_the_simulators(target, dtype):
    """Neither simulator's conv epilogue lowers a HardSwish step yet: the refusal names the epilogue
    (and opcompiler/ops/limits.py declares it)."""
    with pytest.raises(OpcError, match="hardswish"):
        run_op("conv2d_bias_hardswish", target, shape=SHAPE, dtype=dtype)
