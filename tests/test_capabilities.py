"""Target families are capabilities their backends declare (issue 12, item 6): code outside the
backend registry asks `capabilities(target)`, never compares family names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from opcompiler.backend import FAMILIES, backend_class, capabilities
from opcompiler.ops import default_dtype
from opcompiler.target import builtin_targets, load_target

ROOT = Path(__file__).resolve().parents[1]
FAMILY_CHECK = re.compile(r"""(?<!op)(?<!\))\.family\s*(==|!=|not in|in)\s|family\s*(==|!=)\s*["']""")
# Where a family name may still be compared: the registry itself, and each machine model's guard
# that it was handed a target of its own family (files owned by the simulator and GPU work).
ALLOWED = {
    "opcompiler/capabilities.py",  # the declarations themselves
    "opcompiler/backend/__init__.py",  # the registry
    "opcompiler/backend/base.py",  # Backend.__init__: a backend serves only its own family
    "opcompiler/backend/ascend/machine.py",  # Machine.from_target guards its own family
    "opcompiler/backend/dsp/machine.py",  # machine() guards its own family
}


def test_no_family_comparisons_outside_the_registry():
    hits = []
    for base in (ROOT / "opcompiler", ROOT / "schedules"):
        for p in base.rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            if rel.startswith("opcompiler/schedules/") or rel in ALLOWED:
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if FAMILY_CHECK.search(code) and "get_op(" not in code and "op.family" not in code:
                    hits.append(f"{rel}:{i}: {line.strip()}")
    assert not hits, "compare a capability instead:\n" + "\n".join(hits)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_backend_and_capabilities(family):
    target = next((t for t in builtin_targets().values() if t.family == family), None)
    assert target is not None, f"no shipped target of family {family}"
    caps = capabilities(target)
    assert caps.family == family and caps.default_trials > 0
    assert target.is_simulator == caps.simulator
    if family != "cuda":  # importing the CUDA backend is fine anywhere, but keep this test host-only
        assert backend_class(target).family == family


def test_capabilities_drive_the_defaults():
    assert default_dtype("conv2d", load_target("ascend-sim")) == "float16"
    assert default_dtype("conv2d", "ascend") == "float16"
    assert default_dtype("conv2d", load_target("dsp-sim")) == "float32"
    assert capabilities("cpu").rpc_device == "cpu" and capabilities("dsp").rpc_device is None
    assert capabilities("dsp").simulator and not capabilities("cpu").simulator
