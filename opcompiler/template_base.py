"""The template interface and its registry: `Template`, `Knob`, `register_template`.

Schedule templates (`schedules/<family>/`) import this module, never `opcompiler.template`,
whose lookup loads the shipped templates: so the import graph runs one way (the lookup ->
the templates -> this interface) and has no cycle.

Templates are registered under (op family, target family) and own their knob space.

A template subclass declares its knobs (`space`) next to the schedule code that uses them
(`apply`) and states validity from the target description (`check`). A config is a plain
`dict[str, int | str]` (JSON in records); `Template.config()` validates one against the
space and fills defaults, raising `OpcError` that lists every knob and its range.

    @register_template
    class CpuConv2d(Template):
        name = "cpu.conv2d"; op_families = ("conv2d",); target_family = "cpu"; version = 1
        def space(self, wl, target): return [Knob("tile_k", (8, 16, 32)), ...]
        def apply(self, wl, target, config): ...  # -> what the backend builds
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from .errors import OpcError
from .target import Target
from .workload import Workload

Config = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    """One tunable choice: a name, its candidate values, and a one-line doc."""

    name: str
    values: tuple
    doc: str = ""

    def describe(self) -> str:
        vs = list(self.values)
        shown = vs if len(vs) <= 8 else vs[:3] + ["..."] + vs[-2:]
        return f"{self.name} in {{{', '.join(map(str, shown))}}}"


@dataclass(eq=False)
class HostLayout:
    """The host-side layout a simulator kernel expects (not counted in its cycles): `pack` turns
    the user's arrays into the device buffers by name, `unpack` the named output buffer (of
    `out_shape` / `out_dtype`) back into the user's array. None: the arrays go as they are."""

    pack: Callable[[list], dict] | None = None
    unpack: Callable[[Any], Any] | None = None
    out_name: str = ""
    out_shape: tuple = ()
    out_dtype: str = ""


@dataclass(eq=False)
class Scheduled:
    """What a simulator template's `apply` returns: a scheduled TIR module and what the backend
    needs to lower it, never a program. The backend picks its lowering by `lowering` (and by the
    module's own annotations: buffer scopes, intrinsic names, pipeline stages) and assembles the
    program itself.

    `module()` builds the scheduled module lazily ((IRModule, argument specs)); `key` names it
    for the backend's compile-and-trace cache (equal keys, equal modules). `params` carries the
    tiling facts a lowering reads that the module does not state (slots, groups, core split).
    `buffers` are the (level, name, bytes) the lowering will allocate, so a config that does not
    fit is refused with the machine's CapacityError before TVM is paid for."""

    lowering: str
    key: tuple = ()
    module: Callable[[], Any] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    host: HostLayout = field(default_factory=HostLayout)
    buffers: Sequence[tuple[str, str, int]] = ()
    flops: float = 0.0
    info: Mapping[str, Any] = field(default_factory=dict)


class Template:
    """Base class of schedule templates. Subclasses set the class attributes and implement
    `space`, `default` and `apply`; `check` returns why a config is invalid (None if valid)."""

    name: ClassVar[str]
    op_families: ClassVar[tuple[str, ...]]
    target_family: ClassVar[str]
    version: ClassVar[int] = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        raise NotImplementedError

    def default(self, wl: Workload, target: Target) -> Config:
        """A sensible default config (not necessarily the best); must pass `check`."""
        return {k.name: k.values[0] for k in self.space(wl, target)}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        """Why `config` cannot work on `target` (capacity, alignment), or None."""
        return None

    def complete(self, wl: Workload, target: Target, given: Mapping[str, Any]) -> Config:
        """The knobs a partial config `given` is filled in from: the default here; templates with a
        ranking of their candidates take the best-ranked one that fits together with `given`."""
        return self.default(wl, target)

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Any:
        """Build the schedule (what the backend compiles) for one config."""
        raise NotImplementedError

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        """Derived quantities for the cost model (bytes per memory level, arithmetic intensity,
        buffer occupancy, alignment waste, trip counts, work per core). Knob values are added
        by the tuner itself; templates override this to add what they know."""
        return {}

    # -- helpers shared by every template -------------------------------------------------

    def config(self, wl: Workload, target: Target, config: Mapping[str, Any] | None) -> Config:
        """Validate a (possibly partial) config against the space; defaults fill the rest."""
        space = {k.name: k for k in self.space(wl, target)}
        given = dict(config or {})
        # a complete config needs no default (which may be derived, and cost a ranking)
        out = dict(self.complete(wl, target, given)) if set(space) - set(given) else {}
        for key, val in given.items():
            if key not in space:
                raise OpcError(f"unknown knob {key!r} for template {self.name}", arg="--config",
                               expected="; ".join(k.describe() for k in space.values()))
            if val not in space[key].values:
                raise OpcError(f"knob {key}={val!r} is out of range for template {self.name}", arg="--config",
                               expected="; ".join(k.describe() for k in space.values()))
            out[key] = val
        return out

    def iter_space(self, wl: Workload, target: Target) -> Iterator[Config]:
        """Every combination of the knobs' values."""
        knobs = list(self.space(wl, target))
        for combo in itertools.product(*(k.values for k in knobs)):
            yield dict(zip((k.name for k in knobs), combo))

    def space_size(self, wl: Workload, target: Target) -> int:
        n = 1
        for k in self.space(wl, target):
            n *= len(k.values)
        return n

    def random_config(self, wl: Workload, target: Target, rng: random.Random) -> Config:
        return {k.name: rng.choice(k.values) for k in self.space(wl, target)}


_TEMPLATES: dict[tuple[str, str], type[Template]] = {}


def register_template(cls: type[Template]) -> type[Template]:
    """Class decorator: register under every (op family, target family); twice raises."""
    for fam in cls.op_families:
        key = (fam, cls.target_family)
        if key in _TEMPLATES:
            raise OpcError(f"a template is already registered for {key}: {_TEMPLATES[key].name}")
        _TEMPLATES[key] = cls
    return cls


def fits(sizes: Sequence[tuple[str, int]], capacity: int) -> bool:
    return sum(s for _, s in sizes) <= capacity


def registered(op_family: str, target_family: str) -> type[Template] | None:
    """The template class registered for the pair, or None (loads nothing: see `opcompiler.template`)."""
    return _TEMPLATES.get((op_family, target_family))


def registered_pairs() -> list[tuple[str, str]]:
    return sorted(_TEMPLATES)


def all_registered() -> list[type[Template]]:
    return sorted(set(_TEMPLATES.values()), key=lambda c: c.name)
