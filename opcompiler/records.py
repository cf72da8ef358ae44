"""The tuning record store: JSON lines, one measurement per line, and where the best one is.

Two places hold records. The user's records (`OPC_LOG_DIR`, default
`~/.local/share/opcompiler/tuning_logs/<target>/<op>.jsonl`) are where `tune` writes. The
records shipped with the package (`opcompiler.tuning_logs`) are read-only data: `best`,
`--config best` and `logs` read both (the faster record wins, the user's on a tie) and say
which they read.

Each line carries a schema version and a key holding everything that changes the result
(op, shape params, dtype, layout, target name and description digest, template name and
version, opcompiler version). Appends are one `os.write` of a whole line under an exclusive
`fcntl.flock`, so concurrent tuners interleave nothing and a `kill -9` leaves whole lines.
Reading skips corrupt or foreign lines with one warning per file and never rewrites it.

The store sits in the core, below `opcompiler.config` (whose `--config best` reads it); what
only tuning needs (checking a log is writable) stays in `opcompiler.tune.records`.

    >>> log = RecordLog(default_log_path(target, "conv2d"))
    >>> log.append(Record(key=record_key(wl, target, tmpl.name, tmpl.version), config={...}, status="ok", ...))
    >>> find_best(wl, target)  # the best verified record and where it was found, or None
"""
from __future__ import annotations

import fcntl
import json
import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .errors import OpcError
from .target import Target
from .template import TemplatesNotLoaded, get_template
from .workload import Workload, catalogue

SCHEMA_VERSION = 1
# "ok": measured; "invalid": build rejected it (capacity, alignment); "crash" / "timeout": the
# worker died or hung; "wrong": it computed a wrong result. Only "ok" ones can be verified.
STATUSES = ("ok", "invalid", "crash", "timeout", "wrong")
_KEY_FIELDS = ("op", "params", "dtype", "layout", "target", "target_digest", "template", "template_version",
               "opc_version")


def record_key(wl: Workload, target: Target, template_name: str, template_version: int) -> dict[str, Any]:
    """The key of every record measured for `wl` on `target` with that template."""
    from .settings import __version__
    return {"op": wl.op, "params": dict(wl.params), "dtype": wl.dtype, "layout": wl.layout,
            "target": target.name, "target_digest": target.digest, "template": template_name,
            "template_version": int(template_version), "opc_version": __version__}


def config_id(config: Mapping[str, Any]) -> str:
    """Canonical text of a config: equal configs, equal ids (used for resume and dedup)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True)
class Record:
    """One measurement (or one verification) of one config."""

    key: Mapping[str, Any]
    config: Mapping[str, Any]
    status: str
    cycles: int | None = None
    seconds: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)  # percent_of_peak, bound, max_abs_err...
    verified: bool = False
    error: str = ""
    tuner: str = ""
    timestamp: float = 0.0

    @property
    def valid(self) -> bool:
        return self.status == "ok"

    @property
    def cost(self) -> float:
        """What the tuner minimizes: cycles on simulators, seconds elsewhere; inf when not valid."""
        if not self.valid:
            return float("inf")
        if self.cycles is not None:
            return float(self.cycles)
        return float(self.seconds) if self.seconds is not None else float("inf")

    def to_json(self) -> str:
        d = asdict(self)
        d["key"], d["config"], d["metrics"] = dict(self.key), dict(self.config), dict(self.metrics)
        return json.dumps({"v": SCHEMA_VERSION, **d}, sort_keys=False, default=jsonable)

    @staticmethod
    def from_obj(obj: Any) -> "Record":
        """Parse one decoded line; raises ValueError for anything not of our schema."""
        if not isinstance(obj, dict) or obj.get("v") != SCHEMA_VERSION:
            raise ValueError("not an opcompiler record of this schema version")
        key, config = obj.get("key"), obj.get("config")
        if not isinstance(key, dict) or set(_KEY_FIELDS) - set(key) or not isinstance(config, dict):
            raise ValueError("record without a complete key or a config")
        if obj.get("status") not in STATUSES:
            raise ValueError(f"unknown status {obj.get('status')!r}")
        cycles, seconds = obj.get("cycles"), obj.get("seconds")
        return Record(key=key, config=config, status=obj["status"],
                      cycles=int(cycles) if cycles is not None else None,
                      seconds=float(seconds) if seconds is not None else None,
                      metrics=obj.get("metrics") or {}, verified=bool(obj.get("verified", False)),
                      error=str(obj.get("error", "")), tuner=str(obj.get("tuner", "")),
                      timestamp=float(obj.get("timestamp", 0.0)))


def jsonable(o: Any) -> Any:
    """`json.dumps`'s `default` for numpy scalars and arrays (anything else as its text)."""
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def same_key(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(f) == b.get(f) for f in _KEY_FIELDS)


_READ_CACHE: dict[str, tuple[tuple[int, int], tuple["Record", ...], int]] = {}


class RecordLog:
    """One JSON-lines file of records: locked atomic appends, tolerant reads."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def append(self, records: Record | Iterable[Record]) -> None:
        """Append whole lines under an exclusive lock, one `os.write` per call."""
        recs = [records] if isinstance(records, Record) else list(records)
        if not recs:
            return
        payload = "".join(r.to_json() + "\n" for r in recs).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # A line left without its newline (not by us) must not swallow ours.
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    payload = b"\n" + payload
                written = os.write(fd, payload)
                if written != len(payload):  # a short write would split a line; say so loudly
                    raise OSError(f"short write to {self.path}: {written} of {len(payload)} bytes")
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def read(self, warn: bool = True) -> list[Record]:
        """Every parseable record; corrupt or foreign lines are skipped with one warning. A file
        unchanged since the last read (same size and mtime) is not parsed again."""
        try:
            st = self.path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return []
        stamp = (str(self.path.absolute()), st.st_mtime_ns, st.st_size)
        hit = _READ_CACHE.get(stamp[0])
        if hit is not None and hit[0] == stamp[1:] and not (warn and hit[2]):
            return list(hit[1])
        recs, bad = self._parse(warn)
        _READ_CACHE[stamp[0]] = (stamp[1:], tuple(recs), bad)
        return recs

    def _parse(self, warn: bool) -> tuple[list[Record], int]:
        with open(self.path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # a writer's line is either all there or absent
            try:
                data = f.read()
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        out: list[Record] = []
        bad, first_bad = 0, 0
        for lineno, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                out.append(Record.from_obj(json.loads(raw)))
            except (ValueError, TypeError, UnicodeDecodeError):
                bad += 1
                first_bad = first_bad or lineno
        if bad and warn:
            warnings.warn(f"tuning log {self.path}: skipped {bad} corrupt or foreign line(s) (first at line "
                          f"{first_bad}); the file is left as it is", RuntimeWarning, stacklevel=3)
        return out, bad

    def for_key(self, key: Mapping[str, Any], warn: bool = True) -> list[Record]:
        return [r for r in self.read(warn) if same_key(r.key, key)]


@dataclass(frozen=True, kw_only=True)
class ConfigState:
    """What the records say about one config: its measurement and whether it verified."""

    record: Record  # the measurement (the first valid one, else the first failure)
    verified: bool
    wrong: bool


def fold(records: Iterable[Record]) -> dict[str, ConfigState]:
    """Per config id: its measurement, verified when a verification line says so, wrong when one failed."""
    meas: dict[str, Record] = {}
    verified: set[str] = set()
    wrong: set[str] = set()
    for r in records:
        cid = config_id(r.config)
        if r.status == "wrong":
            wrong.add(cid)
        if r.verified and r.valid:
            verified.add(cid)
        prev = meas.get(cid)
        if prev is None or (not prev.valid and r.valid):
            meas[cid] = r
    out = {}
    for cid, rec in meas.items():
        ok = cid in verified and cid not in wrong
        out[cid] = ConfigState(record=replace(rec, verified=ok), verified=ok, wrong=cid in wrong)
    return out


def user_dir() -> Path:
    """The user's record directory: `OPC_LOG_DIR`, else `~/.local/share/opcompiler/tuning_logs`."""
    from .settings import user_log_dir
    return user_log_dir()[0]


def default_log_path(target: Target, op: str) -> Path:
    """`<user dir>/<target>/<op>.jsonl`: where `tune` writes unless given `--log`."""
    return user_dir() / target.name / f"{op}.jsonl"


def shipped_dir() -> Path:
    """The records shipped with the package (`opcompiler.tuning_logs`): read-only for users."""
    from importlib import resources
    return Path(str(resources.files("opcompiler.tuning_logs")))


def is_shipped(path: str | os.PathLike) -> bool:
    """Is `path` inside the package's shipped records (through any symlink)?"""
    try:
        Path(path).absolute().resolve().relative_to(shipped_dir().resolve())
        return True
    except ValueError:
        return False


def search_paths(target: Target, op: str) -> list[tuple[Path, str]]:
    """Where `best` looks, in order: the user's log ("user"), then the package's ("shipped")."""
    paths = [(default_log_path(target, op), "user")]
    shipped = shipped_dir() / target.name / f"{op}.jsonl"
    if shipped.resolve() != paths[0][0].resolve():
        paths.append((shipped, "shipped"))
    return paths


def best_of(records: Iterable[Record], verified_only: bool = True) -> Record | None:
    states = fold(records)
    cands = [s.record for s in states.values()
             if s.record.valid and not s.wrong and (s.verified or not verified_only)]
    return min(cands, key=lambda r: r.cost, default=None)


@dataclass(frozen=True)
class Found:
    """A best record and where it came from: its log file and "user", "shipped" or "given"."""

    record: Record
    path: Path
    source: str
    passed_over: "Found | None" = None  # the other place's best, slower (or equal and shipped)
    config: Mapping[str, Any] | None = field(default=None, compare=False)  # the record's full config, checked

    def describe(self) -> str:
        """Where the record came from, and the record it beat: "records shipped with opcompiler:
        PATH; shipped 4,133 cycles beats yours 5,293 from PATH"."""
        text = f"{_WHAT.get(self.source, self.source)}: {self.path}"
        other = self.passed_over
        if other is not None:
            text += (f"; {_WHO[self.source]} {_cost_text(self.record)} beats {_WHO[other.source]} "
                     f"{_cost_text(other.record)} from {other.path}")
        return text


_WHAT = {"user": "your records", "shipped": "records shipped with opcompiler", "given": "--log"}
_WHO = {"user": "yours", "shipped": "shipped", "given": "--log's"}


def _cost_text(r: Record) -> str:
    return f"{r.cycles:,} cycles" if r.cycles is not None else f"{(r.seconds or 0) * 1e6:,.1f} us"


def find_best(wl: Workload, target: Target, log: str | os.PathLike | None = None) -> Found | None:
    """The best VERIFIED record for `wl` on `target` (any template of the current version) and
    where it was found, or None; its `config` is the record's full config, checked. Looks in `log`
    when given; else in the user's log and in the shipped records, and returns the fastest of both
    (the user's on a tie)."""
    ops = catalogue()
    try:
        tmpl = get_template(ops.get_op(wl.op).family, target.family)
    except TemplatesNotLoaded:
        raise
    except Exception:  # no template for this target: nothing can be tuned, so nothing is best
        return None
    return best_found(tmpl, wl, target, log)


def first_best(template: Any, target: Target, wls: Sequence[Workload]) -> tuple[Workload, Found] | None:
    """The first of `wls` (all built with `template`: a fused op, then its anchor) that has a best
    verified record in the user's or the shipped records, with it; None when none has."""
    for wl in wls:
        found = best_found(template, wl, target)
        if found is not None:
            return wl, found
    return None


def best_found(template: Any, wl: Workload, target: Target, log: str | os.PathLike | None = None) -> Found | None:
    """`find_best` with the template `wl` is built with in hand."""
    key = record_key(wl, target, template.name, template.version)
    paths = [(Path(log), "given")] if log is not None else search_paths(target, wl.op)
    found: list[Found] = []
    for p, source in paths:
        states = fold(RecordLog(p).for_key(key))
        ranked = sorted((s for s in states.values() if s.verified), key=lambda s: s.record.cost)
        for st in ranked:
            full = _still_valid(template, wl, target, st.record.config)
            if full is not None:
                found.append(Found(record=st.record, path=p, source=source, config=full))
                break
    best = min(found, key=lambda f: f.record.cost, default=None)  # min keeps the first (the user's) on ties
    others = [f for f in found if f is not best]
    return replace(best, passed_over=others[0]) if best is not None and others else best


def best_record(wl: Workload, target: Target, log: str | os.PathLike | None = None) -> Record | None:
    """The best VERIFIED record for `wl` on `target`, or None (see `find_best` for where it looks)."""
    found = find_best(wl, target, log)
    return found.record if found is not None else None


def _still_valid(tmpl: Any, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record's full config when the template still accepts it, else None (a template edited
    without a version bump may have dropped a knob value: such records are skipped)."""
    try:
        full = tmpl.config(wl, target, config)
    except OpcError:
        return None
    return full if tmpl.check(wl, target, full) is None else None


def iter_logs(root: str | os.PathLike) -> Iterator[Path]:
    root = Path(root)
    if root.is_file():
        yield root
    elif root.is_dir():
        yield from sorted(root.rglob("*.jsonl"))


def by_key(path: str | os.PathLike, keep: Any = None, warn: bool = True) -> dict[str, list[Record]]:
    """One log's records grouped by key (canonical JSON text), those `keep(record)` accepts."""
    groups: dict[str, list[Record]] = {}
    for r in RecordLog(path).read(warn):
        if keep is None or keep(r):
            groups.setdefault(json.dumps(r.key, sort_keys=True), []).append(r)
    return groups


def verified_bests(root: str | os.PathLike, target: Target) -> list[tuple[dict[str, Any], Record]]:
    """(key, best verified record) of every key measured for `target` (its current description,
    by digest) in the logs under `root`: the shipped records' workloads, say."""
    out = []
    for path in iter_logs(root):
        for k, recs in by_key(path, lambda r: r.key.get("target_digest") == target.digest, warn=False).items():
            best = best_of(recs, verified_only=True)
            if best is not None:
                out.append((json.loads(k), best))
    return out


def summarize(root: str | os.PathLike, target: str | None = None, source: str = "") -> list[dict[str, Any]]:
    """One row per (log file, workload key): trials, invalid, verified, best cost; `source` labels
    where the records come from ("user", "shipped", "given")."""
    rows = []
    for path in iter_logs(root):
        groups = by_key(path, None if target is None else (lambda r: r.key.get("target") == target))
        for k, recs in groups.items():
            key = json.loads(k)
            states = fold(recs)
            best = best_of(recs, verified_only=False)
            vbest = best_of(recs, verified_only=True)
            rows.append({
                "source": source, "log": str(path), "op": key["op"], "target": key["target"], "dtype": key["dtype"],
                "shape": ",".join(f"{a}={b}" for a, b in sorted(key["params"].items())),
                "template": f"{key['template']} v{key['template_version']}", "opc_version": key["opc_version"],
                "trials": len(states), "invalid": sum(1 for s in states.values() if not s.record.valid or s.wrong),
                "verified": sum(1 for s in states.values() if s.verified),
                "best_cost": best.cost if best else None, "best_verified_cost": vbest.cost if vbest else None,
                "unit": "cycles" if (best and best.cycles is not None) else "seconds",
                "stale": key["opc_version"] != _version(),
            })
    return rows


def _version() -> str:
    from .settings import __version__
    return __version__
