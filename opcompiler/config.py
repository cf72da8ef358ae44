"""Config resolution in one place: what the user asked for -> the knobs a kernel is built with.

A config *spec* is what a user or a caller gives: `None` / `"default"` (the template's
default), `"paper"` (the schedule a seed paper published, where the template has one),
`"best"` (the best verified tuning record, the default when there is none), `"measured"`
(the derived default's best-predicted candidates timed by the backend), a mapping of knobs, or
(from the CLI) JSON text or a `.json` file. `best` reads the record store (`opcompiler.records`),
below this module; what it asks of a workload's op comes through `workload.catalogue()`, so
nothing here imports upwards.

`resolve` is the one resolver: a spec -> a `Choice` holding the template, the full checked config
and where it came from (a record, the anchor's record inherited, the template's derived default,
given knobs, the paper's schedule, measured). It ALWAYS runs the template's `check` (a record is
checked where the store finds it), so a config that cannot fit fails the same one-line way on
every target. Every backend's `build` resolves through `Backend.resolve`, which calls it once
and passes a resolved `Choice` through as it is: a caller that wants to report where a config
came from resolves first and builds with the `Choice`. `choose` only looks a spec up (no
template, no check): for plans and manifests that name a config's source without building.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import OpcError
from .records import Found, Record, first_best
from .target import Target
from .template import TemplatesNotLoaded, get_template
from .template_base import Config, Knob, Template
from .workload import Workload, catalogue

ConfigSpec = Mapping[str, Any] | str | None
NAMES = ("default", "paper", "best", "measured")
_EXPECTED = "default, paper, best, measured or a JSON object of knobs"


class InvalidConfig(OpcError):
    """A config inside the template's space that its `check` rejects (capacity, alignment)."""

    def __init__(self, template: Template, wl: Workload, target: Target, config: Config, why: str):
        super().__init__(f"config cannot run on {target.name} ({template.name}): {why}", arg="--config",
                         value=config, expected="; ".join(k.describe() for k in template.space(wl, target)))
        self.template, self.config, self.why = template, config, why


@dataclass(frozen=True, kw_only=True)
class Choice:
    """A spec with `best` looked up: what to build with and where it came from; once `resolve`d,
    also the template and the full checked config (`resolved`), which `Backend.build` takes as is."""

    spec: ConfigSpec  # None (template default), a name the template knows ("paper") or knobs
    source: str  # for reports and manifests: "template default", "best verified record (...)", "given"
    record: Record | None = None  # the tuning record when the knobs came from one
    inherited_from: str = ""  # a fused op's anchor op ("conv2d") when the record is the anchor's
    template: Template | None = None  # set by `resolve`
    config: Config | None = None  # set by `resolve`: the full config, checked

    @property
    def resolved(self) -> bool:
        return self.config is not None and self.template is not None

    @property
    def kind(self) -> str:
        """One word for tables: "record", "inherited" (the anchor's record) or "default"."""
        if self.inherited_from:
            return "inherited"
        return "record" if self.record is not None else ("default" if self.spec is None else "given")


def parse_config(text: ConfigSpec) -> ConfigSpec:
    """`default` / None -> None; `best` / `paper` stay names; JSON text or a .json file -> dict."""
    if text is None or text == "default":
        return None
    if isinstance(text, Mapping):
        return dict(text)
    if text in NAMES:
        return text
    src = text
    if text.endswith(".json") and Path(text).is_file():
        src = Path(text).read_text()
    try:
        cfg = json.loads(src)
    except json.JSONDecodeError as e:
        raise OpcError(f"not valid JSON ({e.msg} at column {e.colno})", arg="--config", value=text,
                       expected='default, best, or a JSON object such as \'{"m_tile": 64}\'') from None
    if not isinstance(cfg, dict):
        raise OpcError("must be a JSON object", arg="--config", value=text, expected='e.g. {"m_tile": 64}')
    return cfg


def choose(wl: Workload, target: Target, spec: ConfigSpec) -> Choice:
    """Look `best` up (the user's records, then the shipped ones); name where any spec came from.
    No template is asked and nothing is checked: `resolve` does both."""
    return best(wl, target) if spec == "best" else _named(spec)


def _named(spec: ConfigSpec) -> Choice:
    """Where a spec that is no record lookup comes from."""
    if spec is None or spec == "default":
        return Choice(spec=None, source="template default")
    if isinstance(spec, Mapping):
        return Choice(spec=dict(spec), source="given")
    if spec == "measured":
        return Choice(spec=spec, source=_MEASURED)
    return Choice(spec=spec, source=str(spec))


_MEASURED = "measured: the derived default's best-predicted candidates timed, the fastest kept"
_NO_RECORD = "template default (no verified record for this key)"


def best(wl: Workload, target: Target, template: Template | None = None) -> Choice:
    """`best`, and which it is: the best verified record of `wl` ("record"), else its anchor's,
    inherited ("inherited"), else the template's derived default ("default"). A record's and an
    inherited record's full config come checked (`Choice.config`). `template`: the one `wl` is
    built with (an anchor has the same), when the caller has it."""
    tmpl = template or _template_of(wl, target)
    return _NO_RECORD_CHOICE if tmpl is None else _best(tmpl, wl, target)


_NO_RECORD_CHOICE = Choice(spec=None, source=_NO_RECORD)


def _best(tmpl: Template, wl: Workload, target: Target) -> Choice:
    base = anchor(wl)
    hit = first_best(tmpl, target, [wl] if base is None else [wl, base])
    if hit is None:
        return Choice(spec=None, source=_NO_RECORD)
    got, found = hit
    if got is wl:
        return Choice(spec=dict(found.record.config), source=f"best verified record ({found.describe()})",
                      record=found.record, config=found.config)
    return _adapted(tmpl, wl, target, got, found) or Choice(spec=None, source=_NO_RECORD)


def _template_of(wl: Workload, target: Target) -> Template | None:
    """The template `wl` is built with on `target`; None when there is none (nothing to look up)."""
    try:
        return get_template(catalogue().get_op(wl.op).family, target.family)
    except TemplatesNotLoaded:
        raise
    except Exception:
        return None


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PB"


@functools.cache
def _host_memory() -> int:
    """This host's RAM in bytes (0 when psutil cannot tell), read once: every build asks."""
    try:
        import psutil
        return int(psutil.virtual_memory().total)
    except (ImportError, OSError):
        return 0


def beyond_machine(wl: Workload, target: Target) -> None:
    """Refuse, in one line and before anything is scheduled, a workload whose inputs and output do
    not fit the target's off-chip memory (its largest bounded level shared by every core: the 910's
    32 GB HBM; the host's RAM for a target whose memory the model leaves unbounded)."""
    shape_bytes = catalogue().get_op(wl.op).bytes(wl)
    offchip = [m for m in target.memories if m.shared]
    cap = max((m.capacity_bytes for m in offchip), default=0)
    where = max(offchip, key=lambda m: m.capacity_bytes).name if cap else "host memory"
    if cap == 0 or any(m.capacity_bytes == 0 for m in offchip):
        cap = _host_memory()
        if not cap:
            return
        where = "this host's memory (the model's off-chip memory is unbounded, but the values live here)"
    if shape_bytes > cap:
        shape = ",".join(f"{k}={v}" for k, v in wl.params if not isinstance(v, str))
        raise OpcError(f"{wl.op}'s inputs and output need {_size(shape_bytes)}, more than the {_size(cap)} of "
                       f"{where} on {target.name}", arg="--shape", value=shape,
                       expected=f"a shape whose tensors fit in {_size(cap)}")


def anchor(wl: Workload) -> Workload | None:
    """The workload a fused op is built around: its first unfused step when that op has the same
    template family (conv2d_bn_relu -> conv2d, matmul_bias_relu -> matmul), else None."""
    ops = catalogue()
    op = ops.get_op(wl.op)
    if op.unfused_fn is None:
        return None
    first = op.unfused(wl)[0]
    if first.op == wl.op or ops.get_op(first.op).family != op.family:
        return None
    return ops.workload(first.op, dict(first.params), dtype=wl.dtype)


def inherited(wl: Workload, target: Target, template: Template | None = None) -> Choice | None:
    """A fused op with no record of its own starts from its anchor's best verified record for the
    same shape, re-checked with the fused op's own buffers (the epilogue's parameters in UB, say);
    None when there is no anchor, no record, or the record does not fit the fused kernel. The
    Choice's `config` is the full config, checked."""
    base = anchor(wl)
    tmpl = None if base is None else (template or _template_of(wl, target))
    hit = None if tmpl is None else first_best(tmpl, target, [base])
    return None if hit is None else _adapted(tmpl, wl, target, base, hit[1])


def _adapted(tmpl: Template, wl: Workload, target: Target, base: Workload, found: Found) -> Choice | None:
    """The anchor `base`'s record `found` as `wl`'s config: checked with the fused op's own
    buffers, shrunk to fit when it does not (`_shrink`); None when nothing fits."""
    try:
        cfg = tmpl.config(wl, target, found.record.config)
    except OpcError:
        return None
    how = "inherited by"
    if tmpl.check(wl, target, cfg) is not None:
        fitted = _shrink(tmpl, wl, target, cfg)
        if fitted is None:
            return None
        changed = ", ".join(f"{k} {cfg[k]}->{fitted[k]}" for k in cfg if fitted[k] != cfg[k])
        cfg, how = fitted, f"adapted to fit ({changed}) by"
    return Choice(spec=cfg, source=f"{base.op}'s best verified record, {how} {wl.op} "
                  f"({found.describe()})", record=found.record, inherited_from=base.op, config=dict(cfg))


def _shrink(tmpl: Template, wl: Workload, target: Target, cfg: Config, budget: int = 256) -> Config | None:
    """The nearest config that fits, stepping numeric knobs down one value at a time (fewest steps
    first): what an anchor's record becomes when the fused op's epilogue needs more room
    (registers, UB). None when nothing within `budget` checks fits."""
    knobs: list[Knob] = [k for k in tmpl.space(wl, target)
                         if all(isinstance(v, int) and not isinstance(v, bool) for v in k.values)]
    frontier, seen = [dict(cfg)], {json.dumps(cfg, sort_keys=True)}
    while frontier and budget > 0:
        nxt = []
        for c in frontier:
            for k in knobs:
                vals = sorted(k.values)
                if c.get(k.name) not in vals or vals.index(c[k.name]) == 0:
                    continue
                d = {**c, k.name: vals[vals.index(c[k.name]) - 1]}
                sig = json.dumps(d, sort_keys=True)
                if sig in seen:
                    continue
                seen.add(sig)
                budget -= 1
                if tmpl.check(wl, target, d) is None:
                    return d
                nxt.append(d)
        frontier = nxt
    return None


def resolve(template: Template, wl: Workload, target: Target, spec: ConfigSpec | Choice,
            measured: Callable[[], Config | None] | None = None) -> Choice:
    """The one resolution of a build: `spec` -> a `Choice` with `template`, the full checked config
    and where it came from. Unknown or out-of-range knobs, an unknown name, a template without a
    paper schedule, and a config its `check` rejects each raise an `OpcError` (the last an
    `InvalidConfig`) naming the argument and what would work. `measured` gives the knobs of
    `"measured"` (the backend times them; None: the derived default). A resolved `Choice` passes
    through; the off-chip check is the backend's (`Backend.check_offchip`), before this."""
    if isinstance(spec, Choice):
        if spec.resolved:
            return spec
        spec = spec.spec
    if isinstance(spec, str) and spec not in NAMES:
        spec = parse_config(spec) if spec.lstrip().startswith("{") or spec.endswith(".json") else spec
    knobs = spec
    if spec == "best":
        chosen = _best(template, wl, target)
        if chosen.config is not None:  # a record (or the anchor's), checked where it was found
            return replace(chosen, template=template)
        knobs = chosen.spec
    elif spec == "measured":
        chosen = _named(spec)
        knobs = measured() if measured is not None else None
    else:
        chosen = _named(spec)
    return replace(chosen, template=template, config=_checked(template, wl, target, knobs))


def _checked(template: Template, wl: Workload, target: Target, spec: ConfigSpec) -> Config:
    """The full config of a spec that is no record: the template's `config` (knobs validated,
    defaults filled) or its paper schedule, then its `check`."""
    if spec is None or spec in ("default", "measured"):
        cfg = template.config(wl, target, None)
    elif spec == "paper":
        paper = getattr(template, "paper", None)
        if paper is None:
            raise OpcError(f"template {template.name} has no paper schedule", arg="--config", value=spec,
                           expected="default, best or a JSON object of knobs")
        cfg = dict(paper(wl, target))
    elif isinstance(spec, str):
        raise OpcError("unknown config name", arg="--config", value=spec, expected=_EXPECTED)
    elif isinstance(spec, Mapping):
        cfg = template.config(wl, target, spec)
    else:
        raise OpcError(f"a config is a name or a mapping of knobs, not {type(spec).__name__}", arg="--config",
                       value=spec, expected=_EXPECTED)
    why = template.check(wl, target, cfg)
    if why is not None:
        raise InvalidConfig(template, wl, target, cfg, why)
    return cfg


def resolve_config(template: Template, wl: Workload, target: Target, spec: ConfigSpec) -> Config:
    """The full checked config `spec` means for `template` (`resolve`'s `config`)."""
    return resolve(template, wl, target, spec).config


__all__ = ["Choice", "ConfigSpec", "InvalidConfig", "anchor", "best", "beyond_machine", "choose", "inherited",
           "parse_config", "resolve", "resolve_config"]
