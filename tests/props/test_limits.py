"""The declared limits (`opcompiler/ops/limits.py`): each is true (the target refuses a case it
covers, with one line) and shown by `opcompiler ops`. The property tests check the other way:
no refusal of a valid input that a limit does not declare."""
from __future__ import annotations

import json

import pytest

from opcompiler.errors import OpcError
from opcompiler.ops.limits import LIMITS, limits_of, unsupported

# one case each limit covers: (op, target, shape, dtype)
COVERED = {
    0: ("conv2d", "ascend-sim", "n=1,c=4,h=5,w=5,k=4,r=3,s=3,pad=1", "float32"),
    1: ("conv2d", "dsp-sim", "n=1,c=4,h=5,w=5,k=4,r=3,s=3,pad=1,groups=2,layout=NHWC", "float32"),
    2: ("conv2d_bias_add_relu", "dsp-sim", "n=1,c=4,h=5,w=5,k=4,r=3,s=3,pad=1,groups=2", "float32"),
    3: ("attention", "dsp-sim", "b=1,h=1,sq=8,skv=8,d=8", "float16"),
    4: ("lstm", "dsp-sim", "t=2,b=1,i=4,h=4", "float16"),
    5: ("gru", "ascend-sim", "t=2,b=16,i=16,h=16,lbr=0", "float16"),
    6: ("fm_interaction", "dsp-sim", "b=2,f=3,k=4", "float16"),
}


def test_every_limit_has_a_case():
    assert set(COVERED) == set(range(len(LIMITS)))


@pytest.mark.parametrize("i", sorted(COVERED))
def test_a_declared_limit_is_refused_in_one_line(i):
    from opcompiler.api import run_op
    from opcompiler.ops import workload
    op, target, shape, dtype = COVERED[i]
    wl = workload(op, shape, dtype=dtype)
    assert unsupported(op, target.removesuffix("-sim"), dict(wl.params), dtype) is LIMITS[i]
    with pytest.raises(OpcError) as e:
        run_op(op, target, shape=shape, dtype=dtype)
    assert "\n" not in str(e.value)


def test_ops_lists_the_limits(capsys):
    from opcompiler.cli import main
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "not on ascend: float32 (the cube takes float16 or int8" in out
    assert main(["ops", "--json"]) == 0
    ops = {o["name"]: o for o in json.loads(capsys.readouterr().out)["ops"]}
    assert [u["family"] for u in ops["conv2d"]["unsupported"]] == ["ascend", "dsp"]
    assert ops["concat"]["unsupported"] == [] and ops["pool2d"]["unsupported"] == []
    assert ops["relu"]["unsupported"] == [] and limits_of("relu") == []
