"""Simulator-target exports: the saved program is rebuilt through the simulator backend at load time,
runs functionally and matches the reference; the folder refuses an edited target description."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from opcompiler.backend import get_backend
from opcompiler.errors import OpcError
from opcompiler.export import export, load
from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.verify import compare


def _available(target: str) -> bool:
    try:
        get_backend(load_target(target))
        return True
    except OpcError:
        return False


# (target, op, shape, dtype, load in a fresh process): one fresh process is enough to show the
# folder needs nothing of the exporting process; the other loads in-process to keep the suite fast.
CASES = [
    ("ascend910-sim", "conv2d_bn_relu", "n=1,c=16,h=6,w=6,k=32,r=3,s=3,pad=1", "float16", True),
    ("dsp-sim", "conv2d_bn_relu", "n=2,c=8,h=6,w=6,k=16,r=3,s=3,pad=1,layout=NHWC", "float32", False),
]

_CHILD = textwrap.dedent("""
    import json, sys
    from opcompiler.export import load
    from opcompiler.ops import get_op, workload
    from opcompiler.verify import compare
    k = load(sys.argv[1]); m = k.manifest
    wl = workload(m["op"], dict(m["params"]), dtype=m["dtype"])
    ins = get_op(m["op"]).make_inputs(wl, seed=11)
    ok, err = compare(k(*ins), get_op(m["op"]).reference(wl, ins))
    res = {"ok": ok, "err": err, "cycles": k.last_run["cycles"]}
    try:  # a torch integration tested on the simulator, before hardware exists
        import torch
    except ImportError:
        torch = None
    if torch is not None and "torch" in m["bindings"]:
        from opcompiler.export import import_folder
        import_folder(sys.argv[1])
        y = getattr(torch.ops.opcompiler, m["name"])(*[torch.from_numpy(x) for x in ins])
        res["torch_ok"] = compare(y.numpy(), get_op(m["op"]).reference(wl, ins))[0]
        res["torch_dtype"] = str(y.dtype)
    print(json.dumps(res))
""")


@pytest.mark.parametrize("target, op, shape, dtype, fresh", CASES)
def test_simulator_export_runs_through_simulator(tmp_path, target, op, shape, dtype, fresh):
    if not _available(target):
        pytest.skip(f"the {target} backend is not in this build")
    wl = workload(op, shape, dtype=dtype)
    out = tmp_path / "sim"
    m = export(wl, load_target(target), "default", to="torch,lib" if fresh else "lib", out=out, progress=False)
    assert m["artifact"]["kind"] == "simulator-program" and m["target"]["simulator"]
    assert (out / "program" / "target.toml").is_file()
    listing = (out / "program" / "program.txt").read_text()
    assert listing.count("\n") > 3 and ("DDR" in listing or "GM" in listing)  # DMA from off-chip memory is listed
    # load the folder: rebuild through the simulator, run, compare with the reference
    if fresh:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(out)], capture_output=True, text=True, check=False,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
    else:
        k = load(out)
        ins = get_op(op).make_inputs(wl, seed=11)
        ok, err = compare(k(*ins), get_op(op).reference(wl, ins))
        res = {"ok": ok, "err": err, "cycles": k.last_run["cycles"]}
    assert res["ok"], res
    if fresh and importlib.util.find_spec("torch") is not None:
        assert res["torch_ok"] and res["torch_dtype"] == f"torch.{dtype}"
    # the same simulated time as running the kernel through the backend directly
    assert res["cycles"] == m["verification"]["simulated_cycles"] > 0


def test_simulator_kernel_rejects_wrong_shape_and_edited_target(tmp_path):
    target = "ascend910-sim"
    if not _available(target):
        pytest.skip(f"the {target} backend is not in this build")
    wl = workload("conv2d_bn_relu", "n=1,c=16,h=4,w=4,k=16,r=1,s=1,pad=0", dtype="float16")
    out = tmp_path / "sim"
    export(wl, load_target(target), "default", to="lib", out=out, progress=False)
    k = load(out)
    ins = get_op(wl.op).make_inputs(wl)
    ok, _ = compare(k(*ins), get_op(wl.op).reference(wl, ins))
    assert ok
    with pytest.raises(OpcError, match=r"expected float16\[1, 16, 4, 4\], got float32\[1, 16, 4, 4\]"):
        k(ins[0].astype(np.float32), *ins[1:])
    toml = out / "program" / "target.toml"
    text = toml.read_text()
    assert "clock_ghz = { value = 1.0" in text
    toml.write_text(text.replace("clock_ghz = { value = 1.0", "clock_ghz = { value = 1.5", 1))  # a faster chip
    with pytest.raises(OpcError, match="differs from the manifest"):
        load(out)
