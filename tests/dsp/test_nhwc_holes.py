"""NHWC concat and pool2d on dsp-sim (once refused although cpu and ascend-sim run them).

concat: the catalogue's concat joins (n, c, h, w) and (n, c1, h, w) along axis 1 whatever its
`layout` says, so layout=NHWC is the NCHW kernel (`dsp.concat`: channel blocks by DMA), cycle
for cycle. pool2d NHWC: channels on the lanes (in blocks of `chans`), the window over h and w
(`pool.pool_schedule_nhwc`, lowered by the window lowering of the NCHW kernels). Values are
checked by `run_op` against numpy at `opcompiler.verify.TOLERANCE`; one fact per op is checked by
hand (DMA bytes)."""
import pytest

from opcompiler.api import run_op
from opcompiler.backend import get_backend
from opcompiler.backend.dsp import program as vx
from opcompiler.backend.dsp.execute import execute
from opcompiler.backend.dsp.machine import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op, workload
from opcompiler.ops.limits import unsupported
from opcompiler.schedules.dsp.pool import DspPool2d
from opcompiler.target import load_target
from opcompiler.verify import compare

from dsp_lowering import program

T = load_target("dsp-sim")
M = machine(T)

F32 = 4


def _run(op, shape, config=None):
    """Functional run, checked against numpy at opcompiler.verify.TOLERANCE (`run_op`'s compare)."""
    r = run_op(op, "dsp-sim", shape=shape, dtype="float32", config=config)
    assert r["correct"], (shape, config, r.get("max_abs_err"))
    return r


# ------------------------------------------------------------------ concat
@pytest.mark.parametrize("shape,config", [
    ("n=1,c=2,c1=3,h=4,w=4,layout=NHWC", None),
    ("n=2,c=17,c1=1,h=5,w=3,layout=NHWC", {"path": "am", "tile": 4096, "dbuf": 0, "cores": 2}),
    ("n=2,c=7,c1=16,h=3,w=5,layout=NHWC", {"path": "ddr", "tile": 4096, "dbuf": 1, "cores": 8}),
])
def test_concat_nhwc_values(shape, config):
    _run("concat", shape, config)


def test_concat_nhwc_is_the_nchw_kernel_and_moves_its_bytes():
    """The same tensors as NCHW, the same program: equal cycles. Staged through AM, every byte is
    read from DDR once and written once: DDR and AM bytes are input + output bytes."""
    n, c, c1, h, w = 2, 3, 5, 4, 3
    shape = f"n={n},c={c},c1={c1},h={h},w={w}"
    cfg = {"path": "am", "tile": 4096, "dbuf": 1, "cores": 8}
    a = _run("concat", shape + ",layout=NHWC", cfg)
    b = _run("concat", shape + ",layout=NCHW", cfg)
    assert a["dsp_cycles"] == b["dsp_cycles"]
    moved = n * (c + c1) * h * w * F32  # the inputs' bytes, and the output's
    assert a["bytes_by_level"]["DDR"] == a["bytes_by_level"]["AM"] == 2 * moved
    d = _run("concat", shape + ",layout=NHWC", {**cfg, "path": "ddr"})
    assert d["bytes_by_level"] == {"DDR": moved}  # one DDR -> DDR descriptor per block


# ------------------------------------------------------------------ pool2d
@pytest.mark.parametrize("shape,config", [
    ("n=1,c=3,h=6,w=6,kernel=2,stride=2,pad=0,mode=max", None),
    ("n=2,c=33,h=7,w=5,kernel=3,stride=1,pad=1,mode=max", None),
    ("n=2,c=17,h=5,w=7,kernel=3,stride=2,pad=1,mode=avg", None),
    ("n=1,c=1,h=5,w=3,kernel=3,stride=1,pad=1,mode=avg", {"planes": 1, "rows": 2, "separable": 0, "dbuf": 1,
                                                           "cores": 8}),
    ("n=3,c=8,h=7,w=7,kernel=2,stride=1,pad=1,mode=avg", {"planes": 2, "rows": 4, "separable": 1, "dbuf": 0,
                                                           "cores": 2}),
    ("n=2,c=40,h=16,w=17,kernel=3,stride=2,pad=0,mode=max", {"planes": 1, "rows": 2, "separable": 1, "dbuf": 1,
                                                              "cores": 4}),
    ("n=1,c=5,h=1,w=1,kernel=1,stride=1,pad=0,mode=avg", None),
    # channel blocks (a multiple of the lanes, the last one a tail): runs of `chans` per pixel
    ("n=2,c=70,h=7,w=5,kernel=3,stride=1,pad=1,mode=avg", {"planes": 2, "rows": 7, "chans": 32, "separable": 1,
                                                            "dbuf": 1, "cores": 8}),
    ("n=1,c=100,h=9,w=6,kernel=3,stride=2,pad=1,mode=max", {"planes": 1, "rows": 2, "chans": 64, "separable": 0,
                                                             "dbuf": 0, "cores": 4}),
    ("n=1,c=256,h=7,w=7,kernel=7,stride=1,pad=0,mode=avg", None),  # global pooling: blocks of channels
])
def test_pool_nhwc_values(shape, config):
    _run("pool2d", shape + ",layout=NHWC", config)


def test_pool_nhwc_moves_rows_of_all_channels():
    """A whole image per stage with windows that tile it: the input is read once, the output
    written once (DDR and AM bytes = input + output bytes). One output row per stage with a 3-row
    window at stride 1: each stage reads its 3 input rows, w*c elements each."""
    n, c, h, w = 1, 3, 6, 6
    r = _run("pool2d", f"n={n},c={c},h={h},w={w},kernel=2,stride=2,pad=0,mode=max,layout=NHWC",
             {"planes": 1, "rows": 3, "separable": 0, "dbuf": 0, "cores": 8})
    moved = (n * h * w * c + n * 3 * 3 * c) * F32
    assert r["bytes_by_level"] == {"DDR": moved, "AM": moved}
    n, c, h, w = 2, 5, 5, 4
    r = _run("pool2d", f"n={n},c={c},h={h},w={w},kernel=3,stride=1,pad=0,mode=max,layout=NHWC",
             {"planes": 1, "rows": 1, "separable": 1, "dbuf": 1, "cores": 8})
    ho, wo = h - 2, w - 2
    assert r["bytes_by_level"]["DDR"] == (n * ho * 3 * w * c + n * ho * wo * c) * F32


def test_pool_nhwc_channel_blocks_move_runs_of_the_block():
    """Blocks of 32 of 70 channels (32, 32, 6), whole images, no padding: every element is still read
    once and written once (DDR bytes = input + output), now as runs of a block's channels per pixel."""
    n, c, h, w = 1, 70, 4, 4
    r = _run("pool2d", f"n={n},c={c},h={h},w={w},kernel=2,stride=2,pad=0,mode=max,layout=NHWC",
             {"planes": 1, "rows": 2, "chans": 32, "separable": 0, "dbuf": 1, "cores": 8})
    assert r["bytes_by_level"]["DDR"] == (n * h * w * c + n * 2 * 2 * c) * F32


@pytest.mark.parametrize("shape", ["n=2,c=37,h=9,w=7,kernel=3,stride=2,pad=1,mode=avg,layout=NHWC",
                                   "n=1,c=70,h=6,w=6,kernel=2,stride=1,pad=1,mode=max,layout=NHWC"])
def test_pool_nhwc_functional_and_timing_agree(shape):
    """Through the backend: the functional run issues what the timing replay counts."""
    wl = workload("pool2d", shape=shape, dtype="float32")
    be = get_backend(T)
    k = be.build(wl, "default")
    xs = get_op("pool2d").make_inputs(wl, 3)
    res = be.run(k, xs)
    assert compare(res.outputs[0], get_op("pool2d").reference(wl, xs))[0]
    assert res.cycles == be.measure(k).cycles
    assert res.metrics["functional_counters"] == res.metrics["counters"]


def _rewrite(fix):
    def f(k):
        return vx.VKernel(tuple(vx.Nest(outer=n.outer, body=n.body, inner=n.inner, pre=n.pre,
                                        post=tuple(fix(i) for i in n.post)) for n in k.nests), k.label)
    return f


@pytest.mark.parametrize("mode,fix", [
    ("max", lambda i: vx.VI("vmin", i.dst, i.srcs) if i.op == "vmax" else i),  # max -> min
    ("max", lambda i: vx.VI(i.op, i.dst, (vx.Mem("AM", i.srcs[0].base + 1, i.srcs[0].steps, i.srcs[0].lane),))
     if i.op == "vld" and i.dst == "x0" else i),  # one tap a channel off
    ("avg", lambda i: vx.VI(i.op, i.dst, (vx.Mem("SM", i.srcs[0].base + 1, i.srcs[0].steps, 0),))
     if i.op == "sld" and i.dst == "rc" else i),  # the column divisor one column off
])
def test_pool_nhwc_a_wrong_instruction_gives_a_wrong_result(mode, fix):
    """The values come from the simulated instructions: change one and the check fails."""
    wl = workload("pool2d", shape=f"n=1,c=5,h=7,w=7,kernel=3,stride=2,pad=1,mode={mode},layout=NHWC",
                  dtype="float32")
    po = DspPool2d()
    cfg = {**po.default(wl, T), "separable": 0}
    xs = get_op("pool2d").make_inputs(wl, 0)
    ref = get_op("pool2d").reference(wl, xs)
    assert compare(execute(M, program(po, wl, T, cfg, True), xs)[0], ref)[0]
    assert not compare(execute(M, program(po, wl, T, cfg, True, vtamper=_rewrite(fix)), xs)[0], ref)[0]


def test_the_limits_are_gone():
    for op, shape in (("concat", {"layout": "NHWC"}), ("pool2d", {"layout": "NHWC"})):
        assert unsupported(op, "dsp", shape, "float32") is None


def test_a_pool_config_that_does_not_fit_is_one_line():
    with pytest.raises(OpcError) as e:
        run_op("pool2d", "dsp-sim", shape="n=1,c=512,h=64,w=64,kernel=3,stride=1,pad=1,mode=max,layout=NHWC",
               dtype="float32", config={"planes": 1, "rows": 64, "chans": 512, "separable": 1, "dbuf": 1, "cores": 8})
    assert "AM needs" in str(e.value) and "\n" not in str(e.value)
