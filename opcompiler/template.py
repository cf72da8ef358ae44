"""Schedule templates: look one up by (op family, target family) in the registry the core owns.

The interface a template implements (`Template`, `Knob`, `register_template`) lives in
`opcompiler.template_base` and is re-exported here; this module adds the lookups. The registry
is filled from above: the shipped templates register themselves when `opcompiler.schedules`
(every family's template modules, by name) is imported, and the first lookup imports it through
`settings.template_loader`, which the package (`opcompiler/__init__.py`, above every layer)
installs: every caller (the CLI, the API, the tuner's workers, a script calling
`get_backend(...).build(...)`) sees every template whatever it imported before, nobody imports
TVM before a template is needed, and the core still imports no template. Only without that loader
(the core used on its own) does a lookup say `TemplatesNotLoaded` instead of "no template".

    @register_template
    class CpuConv2d(Template):
        name = "cpu.conv2d"; op_families = ("conv2d",); target_family = "cpu"; version = 1
        def space(self, wl, target): return [Knob("tile_k", (8, 16, 32)), ...]
        def apply(self, wl, target, config): ...  # -> a scheduled IRModule (a `Scheduled` on a simulator)
"""
from __future__ import annotations

import sys

from . import settings
from .errors import OpcError
from .template_base import (Config, Knob, Template, all_registered, fits, register_template, registered,
                            registered_pairs)

SHIPPED = "opcompiler.schedules"  # the package whose import registers every shipped template


class TemplatesNotLoaded(RuntimeError):
    """A template lookup with the shipped templates not loaded and no loader installed (the core
    used without the package's `opcompiler/__init__.py`): not a missing template."""


def loaded() -> bool:
    """Whether the shipped templates are registered (`opcompiler.schedules` was imported)."""
    return SHIPPED in sys.modules


def _ensure_loaded() -> None:
    """Load the shipped templates through the loader the package installed (`settings.template_loader`,
    set by `opcompiler/__init__.py`, which stands above every layer): the core imports no template."""
    if not loaded() and settings.template_loader is not None:
        settings.template_loader()


def get_template(op_family: str, target_family: str) -> Template:
    """An instance of the template registered for (op family, target family); OpcError naming the
    op families the target does have when there is none."""
    _ensure_loaded()
    cls = registered(op_family, target_family)
    if cls is None:
        if not loaded():
            raise TemplatesNotLoaded(f"no template for ({op_family}, {target_family}): the shipped templates are "
                                     f"not loaded (import {SHIPPED}, as the package's template loader does)")
        have = sorted(f for f, t in registered_pairs() if t == target_family)
        raise OpcError(f"no {target_family} template for the {op_family} family", arg="op",
                       expected=f"an op of family {', '.join(have) or '(none yet)'} on this target")
    return cls()


def templates() -> list[type[Template]]:
    """Every registered template class (the shipped ones once loaded, and the user's), by name."""
    _ensure_loaded()
    if not loaded():
        raise TemplatesNotLoaded(f"the shipped templates are not loaded (import {SHIPPED}, as the package's "
                                 "template loader does)")
    return all_registered()


__all__ = ["Config", "Knob", "Template", "TemplatesNotLoaded", "fits", "get_template", "loaded",
           "register_template", "templates"]
