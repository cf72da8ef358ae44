"""The DSP convolution's TVM schedule is a real schedule of the op's TE compute: with the
simulator's scopes and annotations stripped of meaning, TVM builds it for the host and it
computes the convolution (the program the simulator runs is lowered from this very schedule)."""
import numpy as np
import pytest

from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.verify import compare


@pytest.mark.parametrize("op,shape,knobs", [
    ("conv2d", "n=2,c=5,h=9,w=13,k=20,r=3,s=3,stride=2,pad=1,layout=NHWC", {"rows": 2, "cols": 4, "pw": 3}),
    ("conv2d_bias_relu", "n=2,c=5,h=9,w=9,k=36,r=3,s=3,pad=1,layout=NHWC", {"rows": 3, "pw": 4, "order": "ws"}),
])
def test_schedule_built_for_the_host_computes_the_op(op, shape, knobs):
    import tvm
    from tvm import te  # noqa: F401

    from opcompiler.schedules.dsp.direct import conv_schedule, nhwc_workload
    t = load_target("dsp-sim")
    wl = workload(op, shape=shape)
    tm = get_template("conv2d", "dsp")
    sch = conv_schedule(wl, t, tm.config(wl, t, knobs))
    mod = sch.mod
    # the simulator's scopes are plain memories on the host
    text = mod.script()
    for sc in ("local.SM", "local.AM", "local.GSM", "local.REG"):
        text = text.replace(f'"{sc}"', '"global"')
    mod = tvm.script.from_source(text)
    ex = tvm.compile(mod, target="llvm")
    base = nhwc_workload(wl)
    d = get_op(base.op)
    xs = d.make_inputs(base, 0)
    ref = d.reference(base, xs)
    args = [tvm.runtime.tensor(x) for x in xs] + [tvm.runtime.tensor(np.zeros(ref.shape, "float32"))]
    ex(*args)
    assert compare(args[-1].numpy(), ref)[0]


def test_configs_sharing_their_staging_share_its_schedule_and_lower_alike():
    """Configs that differ only in `pw` and `w_path` continue one cached staged schedule; what
    they lower to is what a schedule built from scratch lowers to. order=ws has no register
    blocks: its `pw` does not make another lowered function."""
    from opcompiler.backend.dsp.lower.direct import lowered
    from opcompiler.schedules.dsp import direct as ts

    t = load_target("dsp-sim")
    wl = workload("conv2d_bn_relu", shape="n=2,c=5,h=9,w=13,k=40,r=3,s=3,pad=1,layout=NHWC")
    tm = get_template("conv2d", "dsp")
    base = tm.config(wl, t, {"rows": 2, "cols": 4, "pw": 3, "order": "out", "w_path": "gsm"})
    ts._STAGED.clear()
    scripts = {}
    for pw, w_path in ((3, "gsm"), (5, "ddr"), (2, "gsm")):
        scripts[pw, w_path] = lowered(ts.conv_schedule(wl, t, {**base, "pw": pw, "w_path": w_path})).script()
    assert len(ts._STAGED) == 1
    for (pw, w_path), text in scripts.items():
        ts._STAGED.clear()
        assert lowered(ts.conv_schedule(wl, t, {**base, "pw": pw, "w_path": w_path})).script() == text
    assert scripts[3, "gsm"] != scripts[5, "ddr"]
    ws = {**base, "order": "ws"}
    assert ts.compacted_func(wl, t, {**ws, "pw": 1}) is ts.compacted_func(wl, t, {**ws, "pw": 4})
    assert tm.apply(wl, t, {**ws, "pw": 1}).key == tm.apply(wl, t, {**ws, "pw": 4}).key
