"""pad on dsp-sim for NHWC and degenerate shapes (unit extents, no padding at all).

The pad schedule (schedules/dsp/move.py `pad_schedule`) viewed every tensor as NCHW's
(n*c, h, w): an NHWC tensor's compute axes (n, h, w, c) were fused as n*c + h, which TVM's
transform_layout cannot invert unless h + pt + pb happens to equal c ("Check failed: ... scale,
expected_scale", or "Could not parse mapping as sum of iterators"). NHWC is now viewed as
(n, h, w*c). Outputs are compared with the numpy reference exactly (tolerance 0: pad only copies
and stores a fill constant); the CLI's own check (`run_op`'s `correct`, verify.compare at the
float32 tolerance rtol 1e-4, atol 1e-5) is asserted for the two reported command lines."""
import numpy as np
import pytest

from opcompiler.api import run_op
from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target

T = load_target("dsp-sim")
BE = get_backend(T)

# the two reported command lines (`opcompiler run pad --target dsp-sim --shape ...`)
REPORTED = ["n=1,c=2,h=2,w=1,pt=0,pl=0,pb=1,pr=0,fill=zero,layout=NHWC",   # InternalError: scale check
            "n=1,c=2,h=1,w=1,pt=0,pl=0,pb=0,pr=0,fill=zero,layout=NHWC"]   # not a sum of iterators

# more from the sweep (n 1,2; c 1,2,3,17; h, w 1..3; pads 0..2; both fills; both layouts),
# each of which failed before in one of the two ways, plus degenerate NCHW shapes that must stay exact
CASES = REPORTED + [
    "n=2,c=2,h=1,w=2,pt=0,pl=0,pb=0,pr=0,fill=zero,layout=NHWC",      # no padding, two images
    "n=1,c=17,h=2,w=2,pt=1,pl=0,pb=2,pr=0,fill=lowest,layout=NHWC",
    "n=2,c=3,h=3,w=1,pt=1,pl=0,pb=1,pr=2,fill=lowest,layout=NHWC",
    "n=1,c=2,h=1,w=1,pt=2,pl=2,pb=0,pr=1,fill=zero,layout=NHWC",
    "n=2,c=17,h=3,w=3,pt=2,pl=2,pb=2,pr=2,fill=zero,layout=NHWC",
    "n=2,c=3,h=2,w=3,pt=0,pl=1,pb=0,pr=0,fill=lowest,layout=NHWC",    # left columns only
    "n=2,c=1,h=3,w=2,pt=1,pl=0,pb=0,pr=1,fill=zero,layout=NHWC",
    "n=1,c=1,h=1,w=1,pt=0,pl=0,pb=0,pr=0,fill=zero,layout=NCHW",      # one element, a copy
    "n=2,c=17,h=1,w=1,pt=2,pl=1,pb=0,pr=2,fill=lowest,layout=NCHW",
]


def _exact(shape: str, config=None, seed: int = 0):
    wl = workload("pad", shape, dtype="float32")
    ins = get_op("pad").make_inputs(wl, seed)
    res = BE.run(BE.build(wl, config), ins)
    np.testing.assert_array_equal(res.outputs[0], get_op("pad").reference(wl, ins))  # tolerance 0
    return res


@pytest.mark.parametrize("shape", REPORTED)
def test_reported_command_lines_run_and_verify(shape) -> None:
    """What `opcompiler run pad --target dsp-sim --shape ...` does: build, run, compare."""
    rep = run_op("pad", "dsp-sim", shape=shape)
    assert rep["correct"] is True and rep["max_abs_err"] == 0.0


@pytest.mark.parametrize("shape", CASES)
def test_outputs_equal_numpy_exactly(shape) -> None:
    res = _exact(shape)
    # the timing program (what the cycles come from) is the program that executes
    assert res.metrics["functional_counters"] == res.metrics["counters"]


@pytest.mark.parametrize("config", [{"planes": 2, "rows": 1, "dbuf": 0, "cores": 2},
                                    {"planes": 1, "rows": 4, "dbuf": 1, "cores": 8},
                                    {"planes": 4, "rows": 2, "dbuf": 1, "cores": 1}])
def test_nhwc_knobs(config) -> None:
    """NHWC's planes are images, its rows image rows of w*c elements (side padding pl*c, pr*c)."""
    res = _exact("n=5,c=3,h=4,w=5,pt=1,pl=2,pb=2,pr=1,fill=lowest,layout=NHWC", config, seed=4)
    assert res.metrics["functional_counters"] == res.metrics["counters"]


@pytest.mark.parametrize("pads", ["pt=1,pl=2,pb=0,pr=1", "pt=0,pl=0,pb=0,pr=0"])
def test_nhwc_with_one_channel_is_the_nchw_kernel(pads) -> None:
    """With c=1 NHWC and NCHW are the same memory: the same program, the same cycles."""
    cyc = []
    for layout in ("NCHW", "NHWC"):
        wl = workload("pad", f"n=2,c=1,h=7,w=9,{pads},layout={layout}", dtype="float32")
        kernel = BE.build(wl)
        cyc.append(int(BE.measure(kernel).metrics["dsp_cycles"]))
    assert cyc[0] == cyc[1]


def test_a_row_wider_than_am_is_refused_cleanly() -> None:
    """An NHWC row (w*c elements, with its padding) that no AM tile holds: a one-line OpcError,
    not a TVM internal error."""
    with pytest.raises(OpcError, match="AM needs"):
        BE.build(workload("pad", "n=1,c=1024,h=2,w=224,pt=0,pl=1,pb=0,pr=1,layout=NHWC", dtype="float32"))
