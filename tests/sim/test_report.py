"""One typed profile under both machines' reports: what each backend returns is recomputed
here from the replay's raw figures and the target's (by hand, not through `report`), and
the profile's roofline and bound are consistent."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.backend.ascend import backend as abe, timing as asc
from opcompiler.backend.dsp import timing as dsp
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
    """What the backend reports, recomputed here from the replay's raw figures (cycles, busy
    cycles per pipe, bytes per path) and the target's, not through `report`."""
    k = ASC.build(workload(op, shape, dtype=dtype))
    m, plan = ASC.machine, k.artifact.plan
    t = asc.schedule(k.artifact.program)
    got = ASC.measure(k).metrics
    n = plan.active_cores
    assert got["cycles"] == t.cycles and got["time_us"] == pytest.approx(t.cycles / m.clock_hz * 1e6)
    names = {"M": "mac_ratio", "V": "vec_ratio", "S": "scalar_ratio", "MTE1": "mte1_ratio", "MTE2": "mte2_ratio",
             "MTE3": "mte3_ratio"}
    assert got["pipe_ratios"] == {names[p]: round(t.busy[p] / t.cycles, 4) for p in names}
    peak = (m.peak_flops_per_cycle[dtype] if plan.unit == "cube" else 256 // 2) * m.clock_hz * m.cores
    assert got["percent_of_peak"] == pytest.approx(100 * plan.flops / (t.cycles / m.clock_hz) / peak)
    reads = sum(v for key, v in t.bytes_by_path.items() if key.startswith("GM->"))
    writes = sum(v for key, v in t.bytes_by_path.items() if key.endswith("->GM"))
    assert got["gm_bytes"] == (reads + writes) * n and got["active_cores"] == n
    assert got["bytes_by_level"]["GM_read"] == reads * n and got["bytes_by_level"]["GM_write"] == writes * n
    busiest = max(names, key=lambda p: t.busy[p])
    assert (got["bound"] == "latency (pipes wait on each other)") == (t.busy[busiest] < 0.5 * t.cycles)
    assert got["instructions_core0"] == len(k.artifact.program.instrs) and got["mode"] == "timing"
    p = abe.profile(m, plan, t, dtype)
    assert isinstance(p, Profile) and p.cycles == t.cycles and p.seconds == t.cycles / m.clock_hz
    assert p.attainable_flops <= p.peak_flops and p.roofline_bound in ("compute", "memory")


@pytest.mark.parametrize("op,shape,config", [("conv2d", "n=4,c=32,h=19,w=19,k=32,r=3,s=3,pad=1", None),
                                             ("matmul", "m=64,k=128,n=96", None), ("softmax", "m=9,n=100", None)])
def test_dsp_report_is_the_backends(op, shape, config):
    """What the backend reports, recomputed here from the replay's raw figures (cycles, busy
    cycles per resource, counters) and the target's, not through `report`."""
    k = DSP.build(workload(op, shape, dtype="float32"), config)
    m = dsp_machine(load_target("dsp-sim"))
    prog = k.artifact["program"]
    t = dsp.timing(m, prog)
    got = DSP.measure(k).metrics
    assert got["cycles"] == t.cycles and got["dsp_cycles"] + got["host_cycles"] == t.cycles
    assert got["time_us"] == pytest.approx(t.cycles / 1.8e9 * 1e6)
    assert got["gflops"] == pytest.approx(prog.flops / (t.cycles / 1.8e9) / 1e9)
    peak = 8 * 1.8e9 * 192  # 2.76 TFLOPS: 8 cores x 32 lanes x 3 FMACs x 2 flops
    assert got["percent_of_peak"] == pytest.approx(100 * prog.flops / (t.cycles / 1.8e9) / peak)
    assert got["fmac_utilization"] == pytest.approx(t.busy.get("fmac", 0.0) / (8 * t.cycles))
    assert got["busy_ratios"]["DDR bandwidth"] == round(t.busy.get("ddr", 0.0) / t.cycles, 4)
    assert got["bytes_by_level"] == dict(t.counters.bytes_by_level) and got["bytes_by_level"]["DDR"] > 0
    assert got["counters"]["fmas"] == t.counters.fmas and got["cores_used"] == prog.cores_used
    p = dsp.profile(m, prog, t)
    assert p.offchip_bytes == t.counters.bytes_by_level.get("DDR", 0) and got["roofline"] == p.roofline()
