"""Bad input: fp32 on the cube, tiles that overflow a buffer, unknown or out-of-range knobs."""
from __future__ import annotations

import pytest

from opcompiler.cli import main
from opcompiler.errors import CapacityError, OpcError
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.template import get_template


def test_fp32_on_the_cube_is_a_clear_error(backend):
    with pytest.raises(OpcError, match="float16") as e:
        backend.build(workload("conv2d", "n=1,c=16,h=8,w=8,k=16,r=3,s=3", dtype="float32"))
    assert "--dtype" in str(e.value) and "vector unit" in str(e.value)


def test_overflowing_tile_names_buffer_level_bytes(backend):
    wl = workload("matmul", "m=1024,k=1024,n=1024", dtype="float16")
    cfg = {"m_tile": 1024, "n_tile": 256, "double_buffer": 0}
    with pytest.raises(CapacityError) as e:
        backend.build(wl, cfg)
    err = e.value
    assert (err.buffer, err.level, err.need_bytes, err.capacity_bytes) == ("C_L0C_0", "L0C", 1024 * 256 * 4, 262144)
    tmpl = get_template("matmul", "ascend")
    why = tmpl.check(wl, load_target("ascend-sim"), tmpl.config(wl, load_target("ascend-sim"), cfg))
    assert why is not None and "L0C" in why and "C_L0C_0" in why


def test_check_agrees_with_build_over_a_space(backend):
    """The tuner's pre-filter: every config `check` accepts builds, every one it rejects fails."""
    wl = workload("conv2d", "n=1,c=64,h=28,w=28,k=128,r=3,s=3,pad=1", dtype="float16")
    tgt = load_target("ascend-sim")
    tmpl = get_template("conv2d", "ascend")
    n_bad = 0
    space = list(tmpl.iter_space(wl, tgt))
    # each new tile shape pays a TVM schedule and trace (~0.05-0.3 s): sample the space sparsely
    sample = space[::100]
    for cfg in sample:
        cfg["block_dim"] = 32
        why = tmpl.check(wl, tgt, cfg)
        if why is None:
            backend.build(wl, cfg)
        else:
            n_bad += 1
            with pytest.raises(CapacityError):
                backend.build(wl, cfg)
    assert n_bad > 0


@pytest.mark.parametrize("cfg,needle", [({"m_tile": 24}, "out of range"), ({"tile_x": 1}, "unknown knob")])
def test_knob_errors_list_the_knobs(backend, cfg, needle):
    with pytest.raises(OpcError, match=needle) as e:
        backend.build(workload("matmul", "m=64,k=64,n=64", dtype="float16"), cfg)
    for knob in ("m_tile", "k_tile", "n_tile", "double_buffer", "block_dim"):
        assert knob in str(e.value)


@pytest.mark.parametrize("args,needle", [
    (["--dtype", "float16", "--config", '{"m_tile": 4096}'], "m_tile"),
    (["--dtype", "float32"], "float16"),
    (["--dtype", "float16", "--config", '{"m_tile": 2048, "n_tile": 64, "double_buffer": 1}'], "L0")])
def test_cli_bad_input_exits_2_with_one_line(capsys, args, needle):
    rc = main(["run", "conv2d", "--target", "ascend-sim", "--preset", "resnet50.res2_3x3", *args])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_gm_overflow_is_rejected_with_a_clear_message(backend, published):
    """Seed 000's conv grid: the chip failed to allocate part of it; the largest point here needs
    more than the 32 GB of HBM and is rejected naming the tensor, the level and the bytes."""
    grid = next(r for r in published.values() if r["what"].startswith("conv parameter grid"))
    n, hw, c, k, f = (max(grid[key]) for key in ("batch", "input_size", "in_channels", "out_channels", "filter"))
    wl = workload("conv2d", f"n={n},c={c},h={hw},w={hw},k={k},r={f},s={f},pad={f // 2}", dtype="float16")
    with pytest.raises(CapacityError) as e:
        backend.build(wl)
    assert e.value.level == "HBM" and e.value.need_bytes > 32 * 2**30 and "smaller batch" in str(e.value)
    small = workload("conv2d", f"n={min(grid['batch'])},c=32,h=112,w=112,k=64,r=1,s=1,pad=0", dtype="float16")
    assert backend.build(small).info["block_dim"] == 32
