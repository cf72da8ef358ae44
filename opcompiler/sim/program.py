"""The one program container both simulated machines' programs are, and its listing.

A machine's program (Ascend's `backend/ascend/program.Program`: one core's instruction stream;
the DSP's `backend/dsp/program.Program`: per-core op lists of the whole cluster) subclasses
`SimProgram` and says where its instruction lists are (`streams`: a title and a list per core,
or per core group), the bytes in use per on-chip level (`high_water`; Ascend's program also
lists its buffers, `bufs`) and which cycles the machine declares for an instruction on its
own (`declared_cycles`: a figure that does not depend on the run, e.g. a vector instruction's
repeats; None where the cost depends on contention, e.g. a transfer over a shared channel). `info` is the dict of build
facts both carry.

`listing()` prints a program for reading: one line per instruction with its unit (pipe), kind,
operands (buffers read -> written, bytes, path), declared cycles; a `Repeat` block (the same
instructions issued `count` times in a row: timing programs only) shows its body once with its
count. `expand` unrolls repeat blocks. `deal` shares work items of unequal size among cores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SimProgram", "Repeat", "expand", "instruction_line", "deal"]


def deal(loads: list[int], parts: int) -> list[list[int]]:
    """Items of the given loads shared among `parts` cores longest first, each to the least loaded
    core (LPT); each core's items in their own order, the cores numbered heaviest first (core 0,
    the one a timing replay of one core times, finishes last)."""
    bins: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for i in sorted(range(len(loads)), key=lambda j: (-loads[j], j)):
        c = min(range(parts), key=lambda k: (totals[k], k))
        bins[c].append(i)
        totals[c] += loads[i]
    return [sorted(bins[c]) for c in sorted(range(parts), key=lambda k: (-totals[k], k))]


@dataclass(frozen=True)
class Repeat:
    """`body` issued `count` times in a row (timing programs only: identical stages)."""

    body: tuple
    count: int


def expand(ops: list) -> list:
    """`ops` with every `Repeat` block unrolled."""
    out: list = []
    for op in ops:
        if isinstance(op, Repeat):
            out.extend(list(op.body) * op.count)
        else:
            out.append(op)
    return out


def _operand(b: Any) -> str:
    """A buffer (name@level) or a buffer tag, as the listing names it."""
    if isinstance(b, str):
        return b
    name = getattr(b, "name", None)
    if name is None:
        return str(b)
    level = getattr(b, "level", None)
    return f"{name}@{level}" if level else str(name)


def _kind(ins: Any) -> str:
    kind = getattr(ins, "kind", None) or type(ins).__name__.lower()
    for attr in ("op", "transform", "what"):  # a vector op, a layout transform, scalar work's purpose
        v = getattr(ins, attr, None)
        if isinstance(v, str) and v:
            kind += f".{v}"
    return kind


def instruction_line(ins: Any, cycles: int | None = None) -> str:
    """One instruction: unit, kind, operands (reads -> writes), bytes, path, repeats, cycles, label."""
    parts = [f"{getattr(ins, 'pipe', '?'):<5}", f"{_kind(ins):<14}"]
    reads, writes = getattr(ins, "reads", ()) or (), getattr(ins, "writes", ()) or ()
    if reads or writes:
        parts.append(f"{', '.join(map(_operand, reads)) or '-'} -> {', '.join(map(_operand, writes)) or '-'}")
    path = getattr(ins, "path", None)
    if path:
        parts.append("path=" + ("->".join(path) if isinstance(path, tuple) else str(path)))
    for attr in ("nbytes", "repeat", "mask"):
        v = getattr(ins, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v:
            parts.append(f"{attr}={v}")
    if cycles is not None:
        parts.append(f"cycles={cycles}")
    label = getattr(ins, "label", None)
    if label:
        parts.append(f"# {label}")
    return " ".join(parts).rstrip()


class SimProgram:
    """Base of both machines' programs (see the module docstring). Subclasses are dataclasses
    with their own fields; this base adds no fields, only the common view of them."""

    # fields every subclass has (annotations only here: a dataclass subclass declares them itself)
    info: dict[str, Any]  # build facts
    high_water: dict[str, int]  # bytes in use per on-chip level (empty where the machine keeps none)

    def streams(self) -> list[tuple[str, list]]:  # pragma: no cover - every machine overrides
        """(title, instruction list) per core or core group, core 0 first; lists may hold `Repeat`s."""
        raise NotImplementedError

    def instructions(self, core: int = 0) -> list:
        """Core `core`'s (or core group's) instruction list, `Repeat` blocks kept."""
        return self.streams()[core][1]

    def declared_cycles(self, ins: Any) -> int | None:
        """Cycles the machine declares for `ins` on its own (None: they depend on the run)."""
        return None

    def listing(self, limit: int | None = None, core: int = 0) -> str:
        """Core `core`'s program for reading, at most `limit` instruction lines (all: None)."""
        title, ops = self.streams()[core]
        lines = [f"# {title}: {len(expand(ops))} instructions"]
        hw = {k: v for k, v in (getattr(self, "high_water", None) or {}).items() if v}
        if hw:
            lines.append("# high water: " + "  ".join(f"{k} {v} B" for k, v in hw.items()))
        body: list[str] = []
        index = 0
        for op in ops:
            if isinstance(op, Repeat):
                body.append(f"{'':6} repeat x{op.count} {{")
                body += [f"{index + i:6d}   " + instruction_line(ins, self.declared_cycles(ins))
                         for i, ins in enumerate(op.body)]
                body.append(f"{'':6} }}")
                index += len(op.body) * op.count
            else:
                body.append(f"{index:6d} " + instruction_line(op, self.declared_cycles(op)))
                index += 1
            if limit is not None and len(body) > limit:
                break
        if limit is not None and len(body) > limit:
            body = body[:limit] + [f"# ... (the first {limit} lines)"]
        lines += body
        return "\n".join(lines) + "\n"
