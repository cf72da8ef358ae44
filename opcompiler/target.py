"""Targets are data: `targets/*.toml` loaded into frozen dataclasses.

Every figure in a target file is either a bare value or `{ value = ..., source = "..." }`;
sources (or the word `assumed`) are kept beside the value so a user can see and correct
them. Simulators and templates read these fields; nothing hard-codes a chip.

File layout::

    [target]            name, family (cpu|cuda|ascend|dsp), description, aliases, clock_ghz, cores
    [peak]              flops per cycle per core, by dtype (e.g. float16 = 8192)
    [[memory]]          name, scope, capacity_bytes, alignment_bytes, bandwidth_gbps,
                        latency_cycles, shared (by all cores), per_core
    [units.<name>]      family-specific compute-unit figures (cube shape, vector width, FMACs)
    [extra]             anything else a backend reads (documented in the file)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from . import device
from .capabilities import FAMILIES, capabilities
from .errors import OpcError


@dataclass(frozen=True, kw_only=True)
class MemoryLevel:
    """One level of the memory hierarchy (per core unless `shared`)."""

    name: str
    scope: str = ""  # TVM storage scope the templates place buffers in, e.g. "local.L1"
    capacity_bytes: int = 0  # 0 = unbounded (host DRAM)
    alignment_bytes: int = 1
    bandwidth_gbps: float = 0.0  # GB/s into/out of this level (0 = not modeled)
    latency_cycles: int = 0
    shared: bool = False  # shared by all cores (HBM, L2, DDR, GSM)


@dataclass(frozen=True, kw_only=True)
class Target:
    """A machine description. `digest` hashes the file's content for record keys."""

    name: str
    family: str
    description: str
    aliases: tuple[str, ...] = ()
    clock_ghz: float = 0.0
    cores: int = 1
    peak_flops_per_cycle: Mapping[str, float] = field(default_factory=dict)  # per core, by dtype
    memories: tuple[MemoryLevel, ...] = ()
    units: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    path: str = ""
    digest: str = ""

    def memory(self, name: str) -> MemoryLevel:
        for m in self.memories:
            if m.name == name:
                return m
        raise OpcError(f"target {self.name} has no memory level {name!r}",
                       expected=", ".join(m.name for m in self.memories))

    def unit(self, name: str) -> Mapping[str, Any]:
        try:
            return self.units[name]
        except KeyError:
            raise OpcError(f"target {self.name} has no compute unit {name!r}",
                           expected=", ".join(self.units)) from None

    def peak_flops(self, dtype: str, cores: int | None = None) -> float:
        """Peak FLOP/s over `cores` (all by default) for `dtype`; 0 when unknown."""
        per_cycle = self.peak_flops_per_cycle.get(dtype, 0.0)
        return per_cycle * self.clock_ghz * 1e9 * (cores if cores is not None else self.cores)

    @property
    def is_simulator(self) -> bool:
        """Whether the family's backend is a simulator (a capability its backend declares)."""
        return capabilities(self.family).simulator


def _targets_dir() -> Path:
    return Path(str(resources.files("opcompiler.targets")))


class _FileCtx:
    def __init__(self, path: Path):
        self.path = path

    def err(self, key: str, problem: str) -> OpcError:
        return OpcError(f"target file {self.path}: key {key!r}: {problem}")


def _split(raw: Any, key: str, sources: dict[str, str], ctx: _FileCtx) -> Any:
    """Unwrap `{value=..., source=...}` into the value, remembering the source."""
    if isinstance(raw, dict) and "value" in raw:
        if set(raw) - {"value", "source"}:
            raise ctx.err(key, f"figure table may only hold 'value' and 'source', got {sorted(raw)}")
        if "source" in raw:
            sources[key] = str(raw["source"])
        return raw["value"]
    return raw


def _num(raw: Any, key: str, sources: dict[str, str], ctx: _FileCtx, kind: type = float, minimum: float = 0) -> Any:
    v = _split(raw, key, sources, ctx)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ctx.err(key, f"expected a number, got {v!r}")
    if v < minimum:
        raise ctx.err(key, f"must be >= {minimum}, got {v}")
    if kind is int:
        if int(v) != v:
            raise ctx.err(key, f"expected an integer, got {v}")
        return int(v)
    return float(v)


def _deep_unwrap(obj: Any, prefix: str, sources: dict[str, str], ctx: _FileCtx) -> Any:
    obj = _split(obj, prefix, sources, ctx)
    if isinstance(obj, dict):
        return MappingProxyType({k: _deep_unwrap(v, f"{prefix}.{k}", sources, ctx) for k, v in obj.items()})
    if isinstance(obj, list):
        return tuple(_deep_unwrap(v, f"{prefix}[{i}]", sources, ctx) for i, v in enumerate(obj))
    return obj


def _values_only(obj: Any) -> Any:
    """The document with every `{value, source}` pair reduced to its value: what the digest (and so
    every tuning record's key) depends on. Sourcing a figure, or rewording why it is assumed,
    leaves the records valid; changing a figure does not."""
    if isinstance(obj, dict):
        if "value" in obj and set(obj) <= {"value", "source"}:
            return _values_only(obj["value"])
        return {k: _values_only(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_values_only(v) for v in obj]
    return obj


def parse_target(path: Path) -> Target:
    """Parse and validate one target file; errors name the file, the key and the problem."""
    ctx = _FileCtx(path)
    try:
        text = path.read_bytes()
        doc = tomllib.loads(text.decode("utf-8"))
    except FileNotFoundError:
        raise OpcError(f"target file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise OpcError(f"target file {path}: not valid TOML: {e}") from None
    sources: dict[str, str] = {}
    t = doc.get("target")
    if not isinstance(t, dict):
        raise ctx.err("target", "missing [target] table")
    for key in ("name", "family"):
        if not isinstance(t.get(key), str) or not t[key]:
            raise ctx.err(f"target.{key}", "missing or not a string")
    if t["family"] not in FAMILIES:
        raise ctx.err("target.family", f"unknown family {t['family']!r}; use one of {', '.join(FAMILIES)}")
    known = {"name", "family", "description", "aliases", "clock_ghz", "cores"}
    if unknown := set(t) - known:
        raise ctx.err(f"target.{sorted(unknown)[0]}", f"unknown key; known keys are {', '.join(sorted(known))}")
    peak = {}
    for dt, v in (doc.get("peak") or {}).items():
        peak[dt] = _num(v, f"peak.{dt}", sources, ctx)
    mems = []
    mem_known = {"name", "scope", "capacity_bytes", "alignment_bytes", "bandwidth_gbps", "latency_cycles", "shared"}
    for i, m in enumerate(doc.get("memory") or []):
        key = f"memory[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise ctx.err(f"{key}.name", "each [[memory]] needs a name")
        key = f"memory.{m['name']}"
        if unknown := set(m) - mem_known:
            raise ctx.err(f"{key}.{sorted(unknown)[0]}", f"unknown key; known keys are {', '.join(sorted(mem_known))}")
        mems.append(MemoryLevel(
            name=m["name"],
            scope=str(m.get("scope", "")),
            capacity_bytes=_num(m.get("capacity_bytes", 0), f"{key}.capacity_bytes", sources, ctx, int),
            alignment_bytes=_num(m.get("alignment_bytes", 1), f"{key}.alignment_bytes", sources, ctx, int, 1),
            bandwidth_gbps=_num(m.get("bandwidth_gbps", 0.0), f"{key}.bandwidth_gbps", sources, ctx),
            latency_cycles=_num(m.get("latency_cycles", 0), f"{key}.latency_cycles", sources, ctx, int),
            shared=bool(_split(m.get("shared", False), f"{key}.shared", sources, ctx)),
        ))
    names = [m.name for m in mems]
    if len(set(names)) != len(names):
        raise ctx.err("memory", f"duplicate memory level names in {names}")
    units = _deep_unwrap(doc.get("units") or {}, "units", sources, ctx)
    extra = _deep_unwrap(doc.get("extra") or {}, "extra", sources, ctx)
    aliases = _split(t.get("aliases", []), "target.aliases", sources, ctx)
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ctx.err("target.aliases", "expected a list of strings")
    canonical = json.dumps(_values_only(doc), sort_keys=True, default=str).encode()
    return Target(
        name=t["name"], family=t["family"], description=str(t.get("description", "")),
        aliases=tuple(aliases),
        clock_ghz=_num(t.get("clock_ghz", 0.0), "target.clock_ghz", sources, ctx),
        cores=_num(t.get("cores", 1), "target.cores", sources, ctx, int, 1),
        peak_flops_per_cycle=MappingProxyType(peak), memories=tuple(mems),
        units=units, extra=extra, sources=MappingProxyType(sources), path=str(path),
        digest=hashlib.sha256(canonical).hexdigest()[:16],
    )


@cache
def builtin_targets() -> Mapping[str, Target]:
    """All shipped targets by name."""
    out = {}
    for p in sorted(_targets_dir().glob("*.toml")):
        t = parse_target(p)
        out[t.name] = t
    return MappingProxyType(out)


AUTO_CUDA = "cuda"  # the GPU in this machine (`resolve_auto_target`)
DEFAULT_CUDA = "cuda-sm80"  # what `--target cuda` builds for on a machine without a GPU


def _cuda_targets() -> dict[int, Target]:
    """The shipped targets `--target cuda` chooses among, by architecture number (sm_80 -> 80)."""
    out = {}
    for t in builtin_targets().values():
        if capabilities(t).auto_target == AUTO_CUDA and "arch" in t.extra:
            n = device.arch_digits(t.extra["arch"])
            if n is None:
                raise OpcError(f"target file {t.path}: extra.arch {t.extra['arch']!r} is not a CUDA architecture",
                               expected="sm_80, sm_90, ...")
            out[n] = t
    return out


@cache
def resolve_auto_target() -> Target:
    """`--target cuda`: the shipped target for this machine's GPU (`opcompiler.device`); `cuda-sm80`
    without a GPU. A GPU newer than every target file gets the newest older one (its PTX is
    JIT-compiled there; a one-line note says so); a GPU older than all of them cannot be served (OpcError)."""
    dev = device.device_arch()
    if dev is None:
        return builtin_targets()[DEFAULT_CUDA]
    targets, n = _cuda_targets(), device.arch_digits(dev)
    if n in targets:
        return targets[n]
    older = [a for a in targets if a <= n]
    if not older:
        have = ", ".join(f"{t.name} (sm_{a})" for a, t in sorted(targets.items()))
        raise OpcError(f"this machine's GPU is {dev}, older than every cuda target ({have}); write a target file "
                       f"for it (copy targets/{DEFAULT_CUDA}.toml, set arch = \"{dev}\" and its figures)",
                       arg="--target", value="cuda", expected="--target path/to/cuda-" + dev.replace("_", "") + ".toml")
    t = targets[max(older)]
    print(f"opcompiler: note: no target file for this machine's {dev} GPU; building for {t.name} "
          f"({t.extra['arch']} + PTX, which the driver JIT-compiles for {dev}); figures are {t.name}'s",
          file=sys.stderr)
    return t


def load_target(name_or_path: str) -> Target:
    """A shipped target by name or alias, or a user's `.toml` file. `cuda` is the target file for
    this machine's GPU (its compute capability), `cuda-sm80` when there is none."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        return parse_target(Path(name_or_path))
    if name_or_path == AUTO_CUDA:
        return resolve_auto_target()
    targets = builtin_targets()
    if name_or_path in targets:
        return targets[name_or_path]
    for t in targets.values():
        if name_or_path in t.aliases:
            return t
    names = sorted(list(targets) + [a for t in targets.values() for a in t.aliases])
    import difflib
    close = difflib.get_close_matches(str(name_or_path), names, n=1, cutoff=0.6)
    raise OpcError("unknown target" + (f"; did you mean {close[0]!r}?" if close else ""), arg="--target",
                   value=name_or_path,
                   expected=f"one of {', '.join(names)} or a path to a .toml file")


def get_figure(target: Target, key: str) -> Any:
    """One figure by its dotted key: `memory.<level>.<field>`, `target.<field>`,
    `units.<unit>.<field>` or `extra.<path...>` (e.g. `extra.paths.GM_L1.bytes_per_cycle`)."""
    kind, *rest = key.split(".")
    if kind == "memory":
        return getattr(target.memory(rest[0]), rest[1])
    if kind == "target":
        return getattr(target, rest[0])
    node: Any = target.units if kind == "units" else target.extra if kind == "extra" else None
    if node is None:
        raise KeyError(key)
    for part in rest:
        node = node[part]
    return node


def _replace_in(mapping: Any, path: list[str], value: Any) -> MappingProxyType:
    d = dict(mapping)
    d[path[0]] = value if len(path) == 1 else _replace_in(mapping[path[0]], path[1:], value)
    return MappingProxyType(d)


def with_figures(target: Target, figures: Mapping[str, Any], tag: str) -> Target:
    """`target` with each figure (dotted keys as in `get_figure`) set to its value, under a digest
    of its own (`<digest>-<tag>`), so caches keyed by the digest build a new machine and no
    tuning record of the file's figures matches it."""
    for key, value in figures.items():
        kind, *rest = key.split(".")
        if kind == "memory":
            mems = tuple(dataclasses.replace(m, **{rest[1]: value}) if m.name == rest[0] else m
                         for m in target.memories)
            target = dataclasses.replace(target, memories=mems)
        elif kind == "target":
            target = dataclasses.replace(target, **{rest[0]: value})
        elif kind == "units":
            target = dataclasses.replace(target, units=_replace_in(target.units, rest, value))
        elif kind == "extra":
            target = dataclasses.replace(target, extra=_replace_in(target.extra, rest, value))
        else:
            raise KeyError(key)
    return dataclasses.replace(target, digest=f"{target.digest}-{tag}")
