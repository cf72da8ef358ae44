"""One typed profile under both machines' reports: the report each machine builds from its
`Profile` is what its backend returns (same keys, same values), and the profile's roofline
and bound are consistent."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import scheduler as asc
from opcompiler.backend.dsp import engine as dsp
from opcompiler.backend.dsp.machine import machine as dsp_machine
from opcompiler.ops import workload
from opcompiler.sim import Profile
from opcompiler.target import load_target

ASC = get_backend(load_target("ascend-sim"))
DSP = get_backend(load_target("dsp-sim"))


@pytest.mark.parametrize("op,shape,dtype", [("conv2d", "n=1,c=32,h=14,w=14,k=64,r=3,s=3,pad=1", "float16"),
                                            ("matmul", "m=256,k=512,n=256", "float16"),
                                            ("softmax", "m=8,n=100", "float16")])
def test_ascend_report_is_the_backends(op, shape, dtype):
    k = ASC.build(workload(op, shape, dtype=dtype))
    t = asc.schedule(k.artifact.program)
    got = asc.report(ASC.machine, k.artifact.plan, t, dtype, functional=False)
    want = ASC.measure(k).metrics
    assert {key: got[key] for key in want} == want
    p = asc.profile(ASC.machine, k.artifact.plan, t, dtype)
    assert isinstance(p, Profile) and p.cycles == t.cycles and p.seconds == t.cycles / ASC.machine.clock_hz
    assert p.attainable_flops <= p.peak_flops and p.roofline_bound in ("compute", "memory")


@pytest.mark.parametrize("op,shape,config", [("conv2d", "n=4,c=32,h=19,w=19,k=32,r=3,s=3,pad=1", None),
                                             ("matmul", "m=64,k=128,n=96", None), ("softmax", "m=9,n=100", None)])
def test_dsp_report_is_the_backends(op, shape, config):
    k = DSP.build(workload(op, shape, dtype="float32"), config)
    m = dsp_machine(load_target("dsp-sim"))
    prog = k.artifact["program"]
    t = dsp.timing(m, prog)
    got = dsp.report(m, prog, t)
    want = DSP.measure(k).metrics
    assert {key: got[key] for key in want} == want
    p = dsp.profile(m, prog, t)
    assert p.offchip_bytes == t.counters.bytes_by_level.get("DDR", 0) and got["roofline"] == p.roofline()
    assert p.percent_of_peak == pytest.approx(got["percent_of_peak"])
