"""Schedule templates: look one up by (op family, target family), with every shipped template loaded.

The interface a template implements (`Template`, `Knob`, `register_template`) lives in
`opcompiler.template_base` and is re-exported here; this module adds the lookups, which
import `opcompiler.schedules` (every family's templates) first, so the registry is complete
whatever the user imported before (no import side effect to know about).

    @register_template
    class CpuConv2d(Template):
        name = "cpu.conv2d"; op_families = ("conv2d",); target_family = "cpu"; version = 1
        def space(self, wl, target): return [Knob("tile_k", (8, 16, 32)), ...]
        def apply(self, wl, target, config): ...  # -> a scheduled IRModule (or a simulator plan)
"""
from __future__ import annotations

from .errors import OpcError
from .template_base import (Config, Knob, Template, all_registered, fits, register_template, registered,
                            registered_pairs)


def _load() -> None:
    import opcompiler.schedules  # noqa: F401  (imports every family's template modules by name)


def get_template(op_family: str, target_family: str) -> Template:
    """An instance of the template registered for (op family, target family); OpcError naming the
    op families the target does have when there is none."""
    _load()
    cls = registered(op_family, target_family)
    if cls is None:
        have = sorted(f for f, t in registered_pairs() if t == target_family)
        raise OpcError(f"no {target_family} template for the {op_family} family", arg="op",
                       expected=f"an op of family {', '.join(have) or '(none yet)'} on this target")
    return cls()


def templates() -> list[type[Template]]:
    """Every shipped (and user-registered) template class, by name."""
    _load()
    return all_registered()


__all__ = ["Config", "Knob", "Template", "fits", "get_template", "register_template", "templates"]
