"""One config resolver (issue 12, item 6): every backend's build resolves default / paper / best /
knobs through `opcompiler.config.resolve_config`, which always runs the template's `check`."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.config import Choice, InvalidConfig, choose, parse_config, resolve_config
from opcompiler.errors import CapacityError, OpcError
from opcompiler.ops import workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.template_base import Knob, Template

CPU = load_target("cpu")


class _Fits(Template):
    """A template whose `check` rejects tile=64: the resolver must say so for every spec."""

    name = "test.fits"
    op_families = ("matmul",)
    target_family = "cpu"

    def space(self, wl, target):
        return [Knob("tile", (8, 16, 64))]

    def check(self, wl, target, config):
        return "tile 64 overflows the test's buffer" if config["tile"] == 64 else None


WL = workload("matmul", "m=16,k=16,n=16")


@pytest.mark.parametrize("spec,want", [(None, {"tile": 8}), ("default", {"tile": 8}), ({"tile": 16}, {"tile": 16}),
                                       ('{"tile": 16}', {"tile": 16})])
def test_specs_resolve_to_full_configs(spec, want):
    assert resolve_config(_Fits(), WL, CPU, spec) == want


@pytest.mark.parametrize("spec,needle", [({"tile": 64}, "tile 64 overflows"), ({"tile": 7}, "out of range"),
                                         ({"tiles": 8}, "unknown knob"), ("fast", "unknown config name"),
                                         ("paper", "has no paper schedule"), (3, "not int")])
def test_bad_specs_name_the_argument(spec, needle):
    with pytest.raises(OpcError, match=needle) as e:
        resolve_config(_Fits(), WL, CPU, spec)
    assert str(e.value).startswith("--config") and "\n" not in str(e.value)


def test_a_rejected_config_is_an_invalid_config_listing_the_knobs():
    with pytest.raises(InvalidConfig) as e:
        resolve_config(_Fits(), WL, CPU, {"tile": 64})
    assert e.value.config == {"tile": 64} and "tile in {8, 16, 64}" in str(e.value)


def test_best_without_a_record_is_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path))
    wl = workload("matmul", "m=3,k=5,n=7")
    c = choose(wl, CPU, "best")
    assert c == Choice(spec=None, source="template default (no verified record for this key)")
    tmpl = get_template("matmul", "cpu")
    assert resolve_config(tmpl, wl, CPU, "best") == resolve_config(tmpl, wl, CPU, None)


def test_parse_config_keeps_names_and_reads_json(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"tile_m": 4}')
    assert parse_config("paper") == "paper" and parse_config("default") is None
    assert parse_config(str(f)) == {"tile_m": 4}
    with pytest.raises(OpcError, match="not valid JSON"):
        parse_config("{oops")


def test_cpu_build_runs_check(monkeypatch):
    """The CPU backend rejects what the template's `check` rejects, before compiling anything."""
    tmpl = get_template("matmul", "cpu")
    monkeypatch.setattr(type(tmpl), "check", lambda self, wl, target, config: "nope")
    with pytest.raises(InvalidConfig, match="nope"):
        get_backend(CPU).build(WL)


def test_ascend_build_runs_check_and_reports_the_builders_capacity_error(monkeypatch):
    """Regression (issue 12): Ascend's build skipped `check`. Now it runs it; a rejected config reports
    the builder's CapacityError (buffer, level, bytes) when emitting it overflows, else the check's reason."""
    tgt = load_target("ascend-sim")
    be = get_backend(tgt)
    wl = workload("matmul", "m=1024,k=1024,n=1024", dtype="float16")
    with pytest.raises(CapacityError) as e:
        be.build(wl, {"m_tile": 1024, "n_tile": 256, "double_buffer": 0})
    assert e.value.level == "L0C"
    tmpl = get_template("matmul", "ascend")
    monkeypatch.setattr(type(tmpl), "check", lambda self, wl, target, config: "rejected by check")
    small = workload("matmul", "m=64,k=64,n=64", dtype="float16")
    full = {"m_tile": 64, "k_tile": 64, "n_tile": 64, "double_buffer": 1, "block_dim": 32, "a_layout": "zZ"}
    with pytest.raises(InvalidConfig, match="rejected by check"):
        be.build(small, full)
    # the default: no candidate passes, so the workload is refused as beyond the machine, in one line
    with pytest.raises(OpcError, match="does not fit ascend910-sim with any tiling.*rejected by check"):
        be.build(small)


def test_dsp_paper_and_bad_name():
    be = get_backend(load_target("dsp-sim"))
    wl = workload("conv2d", preset="minigo.conv3_res", batch=8)
    assert be.build(wl, "paper").config == get_template("conv2d", "dsp").paper(wl, be.target)
    with pytest.raises(OpcError, match="unknown config name"):
        be.build(wl, "fastest")
