"""Bad input on dsp-sim: one-line OpcError naming the argument; CLI exit code 2."""
import subprocess
import sys

import pytest

from opcompiler.backend import get_backend
from opcompiler.errors import CapacityError, OpcError
from opcompiler.ops import workload
from opcompiler.target import load_target


@pytest.fixture(scope="module")
def be():
    return get_backend(load_target("dsp-sim"))


def test_int8_conv_rejected(be):
    with pytest.raises(OpcError, match="--dtype='int8'.*fp32"):
        be.build(workload("conv2d", preset="minigo.conv3_res", dtype="int8"))


def test_tile_that_does_not_fit_am(be):
    wl = workload("conv2d", shape="n=1,c=512,h=14,w=14,k=128,r=3,s=3,pad=1,layout=NHWC")
    with pytest.raises(OpcError, match="AM needs"):
        be.build(wl, {"kv": 4, "rows": 12})


def test_capacity_error_from_the_lowering(be):
    from opcompiler.backend.dsp.program import Allocator
    with pytest.raises(CapacityError, match="'I_s' needs 70000 B in SM"):
        a = Allocator("SM", 65536)
        a.alloc("I_s", 70000 // 4)


@pytest.mark.parametrize("config,match", [({"tile_m": 4}, "unknown knob 'tile_m'"),
                                          ({"pw": 0}, "pw=0 is out of range"),
                                          ("fast", "unknown config name")])
def test_bad_config(be, config, match):
    with pytest.raises(OpcError, match=match):
        be.build(workload("conv2d", preset="minigo.conv3_res", batch=8), config)


def test_cli_exit_code_and_one_line():
    cmd = [sys.executable, "-c", "import sys; from opcompiler.cli import main; sys.exit(main())",
           "run", "conv2d", "--target", "dsp-sim", "--preset", "minigo.conv3_res", "--dtype", "int8"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0
