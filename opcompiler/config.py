"""Config resolution in one place: what the user asked for -> the knobs a kernel is built with.

A config *spec* is what a user or a caller gives: `None` / `"default"` (the template's
default), `"paper"` (the schedule a seed paper published, where the template has one),
`"best"` (the best verified tuning record, the default when there is none), a mapping of
knobs, or (from the CLI) JSON text or a `.json` file. Every backend's `build` calls
`resolve_config`, which returns the full config and ALWAYS runs the template's `check`, so a
config that cannot fit fails the same one-line way on every target. The CLI, the Python API,
graphs and export call `choose` first when they want to report where a config came from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import OpcError
from .target import Target
from .template_base import Config, Template
from .workload import Workload

ConfigSpec = Mapping[str, Any] | str | None
NAMES = ("default", "paper", "best")
_EXPECTED = "default, paper, best or a JSON object of knobs"


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
    record: Any = None  # the tuning record (`tune.records.Record`) when the knobs came from one


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
        from .tune.records import find_best
        found = find_best(wl, target)
        if found is None:
            return Choice(spec=None, source="template default (no verified record for this key)")
        return Choice(spec=dict(found.record.config), source=f"best verified record ({found.describe()})",
                      record=found.record)
    if isinstance(spec, Mapping):
        return Choice(spec=dict(spec), source="given")
    return Choice(spec=spec, source=str(spec))


def resolve_config(template: Template, wl: Workload, target: Target, spec: ConfigSpec) -> Config:
    """The full config `spec` means for `template`, checked: unknown or out-of-range knobs, an
    unknown name, a template without a paper schedule, and a config its `check` rejects each
    raise an `OpcError` (the last an `InvalidConfig`) naming the argument and what would work."""
    if isinstance(spec, str) and spec not in NAMES:
        spec = parse_config(spec) if spec.lstrip().startswith("{") or spec.endswith(".json") else spec
    if spec == "best":
        spec = choose(wl, target, spec).spec
    if spec is None or spec == "default":
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


__all__ = ["Choice", "ConfigSpec", "InvalidConfig", "choose", "parse_config", "resolve_config"]
