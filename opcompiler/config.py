"""Config resolution in one place: what the user asked for -> the knobs a kernel is built with.

A config *spec* is what a user or a caller gives: `None` / `"default"` (the template's
default), `"paper"` (the schedule a seed paper published, where the template has one),
`"best"` (the best verified tuning record, the default when there is none), `"measured"`
(the derived default's best-predicted candidates timed by the backend), a mapping of knobs, or
(from the CLI) JSON text or a `.json` file. `best` reads the record store (`opcompiler.records`),
below this module; what it asks of a workload's op comes through `workload.catalogue()`, so
nothing here imports upwards. Every backend's `build` calls
`resolve_config`, which returns the full config and ALWAYS runs the template's `check`, so a
config that cannot fit fails the same one-line way on every target. The CLI, the Python API,
graphs and export call `choose` first when they want to report where a config came from.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import OpcError
from .records import Record, find_best
from .target import Target
from .template import get_template
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
    """A spec with `best` looked up: what to build with and where it came from."""

    spec: ConfigSpec  # None (template default), a name the template knows ("paper") or knobs
    source: str  # for reports and manifests: "template default", "best verified record (...)", "given"
    record: Record | None = None  # the tuning record when the knobs came from one
    inherited_from: str = ""  # a fused op's anchor op ("conv2d") when the record is the anchor's

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
    """Look `best` up (the user's records, then the shipped ones); name where any spec came from."""
    if spec is None or spec == "default":
        return Choice(spec=None, source="template default")
    if spec == "best":
        found = find_best(wl, target)
        if found is None:
            return inherited(wl, target) or Choice(spec=None,
                                                   source="template default (no verified record for this key)")
        return Choice(spec=dict(found.record.config), source=f"best verified record ({found.describe()})",
                      record=found.record)
    if isinstance(spec, Mapping):
        return Choice(spec=dict(spec), source="given")
    if spec == "measured":
        return Choice(spec=spec, source="measured: the derived default's best-predicted candidates timed, the "
                      "fastest kept")
    return Choice(spec=spec, source=str(spec))


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


def inherited(wl: Workload, target: Target) -> Choice | None:
    """A fused op with no record of its own starts from its anchor's best verified record for the
    same shape, re-checked with the fused op's own buffers (the epilogue's parameters in UB, say);
    None when there is no anchor, no record, or the record does not fit the fused kernel."""
    base = anchor(wl)
    if base is None:
        return None
    found = find_best(base, target)
    if found is None:
        return None
    try:
        tmpl = get_template(catalogue().get_op(wl.op).family, target.family)
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
                  f"({found.describe()})", record=found.record, inherited_from=base.op)


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


def resolve_config(template: Template, wl: Workload, target: Target, spec: ConfigSpec) -> Config:
    """The full config `spec` means for `template`, checked: unknown or out-of-range knobs, an
    unknown name, a template without a paper schedule, and a config its `check` rejects each
    raise an `OpcError` (the last an `InvalidConfig`) naming the argument and what would work."""
    beyond_machine(wl, target)
    if isinstance(spec, str) and spec not in NAMES:
        spec = parse_config(spec) if spec.lstrip().startswith("{") or spec.endswith(".json") else spec
    if spec == "best":
        spec = choose(wl, target, spec).spec
    if spec is None or spec in ("default", "measured"):  # measured: resolved by the backend, which times
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


__all__ = ["Choice", "ConfigSpec", "InvalidConfig", "anchor", "choose", "inherited", "parse_config", "resolve_config"]
