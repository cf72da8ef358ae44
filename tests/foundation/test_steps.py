"""Each operator in one place (issue 24, item 3): the chain-step vocabulary is one table that the
catalogue and the simulators' element-wise templates read, schedules import no private catalogue
name, and graph/translate/ has one table of ONNX ops."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from opcompiler.api import run_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, list_ops, workload
from opcompiler.ops.steps import STEPS, chain_flops, operand_kinds, parse_chain

ROOT = Path(__file__).resolve().parents[2]
ARGS = {"clip": ":-0.5:0.75", "affine": ":0.5:0.25", "pow": ":0.5"}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_every_step_runs_as_a_chain_on_cpu(step):
    """The step's TE definition (the compute) against its numpy one (the reference)."""
    chain = ("clip:0.5:2;" if step in ("pow", "ln") else "") + step + ARGS.get(step, "")  # pow, ln: x > 0
    rep = run_op("ew_chain", "cpu", shape={"n": 1, "c": 5, "h": 3, "w": 4, "chain": chain}, dtype="float32")
    assert rep["correct"], rep


def test_the_chain_ops_declare_their_steps():
    chains = {o.name: o.steps(workload(o.name)) for o in list_ops() if o.chain}
    assert set(chains) == {"relu", "add", "bias_add", "batch_norm", "bn_relu", "add_relu", "ew_chain", "hardswish"}
    assert chains["bn_relu"] == [("bn", ()), ("relu", ())]
    assert get_op("add_relu").steps(workload("add_relu", "bcast=1")) == [("bias", ()), ("relu", ())]
    assert get_op("conv2d").steps(workload("conv2d")) is None
    for name, steps in chains.items():  # the inputs after x are the steps' operands, in order
        wl = workload(name)
        assert len(get_op(name).inputs(wl)) == 1 + len(operand_kinds(steps)), name


def test_chain_text_is_checked_against_the_vocabulary():
    assert parse_chain("bn;clip:0:6") == [("bn", ()), ("clip", (0.0, 6.0))]
    assert chain_flops(parse_chain("sigmoid;bn;hardswish")) == 4 + 2 + 5
    for bad, words in (("atan", "unknown element-wise step 'atan'"), ("clip:1", "takes 2 bounds"), ("", "empty chain")):
        with pytest.raises(OpcError, match=re.escape(words)):
            workload("ew_chain", {"chain": bad})


def test_schedules_import_no_private_catalogue_name():
    bad = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in (ROOT / "schedules").rglob("*.py")
           for line in p.read_text().splitlines()
           if re.search(r"from opcompiler\.ops(\.\w+)* import .*\b_\w", line)]
    assert not bad, bad


def test_graph_translate_has_one_table():
    from opcompiler.graph import translate
    assert translate.SUPPORTED == (*translate.TABLE, "Constant", "ConstantOfShape")
    # a prim joins an element-wise chain as the step its catalogue op is
    kinds = ("relu", "add", "bias_add", "batch_norm", "conv2d", "pool2d", "softmax", "view", "host")
    steps = {k: translate.Prim(kind=k, params={}, inputs=(), outputs=("y",), node="n", onnx_op="X").step for k in kinds}
    assert steps == {"relu": "relu", "add": "add", "bias_add": "bias", "batch_norm": "bn", "conv2d": None,
                     "pool2d": None, "softmax": None, "view": None, "host": None}
