"""The package's import graph has no cycle (issue 12, item 8) and runs one way (issue 24).

Every module under `opcompiler/` and `schedules/` is parsed with `ast`; an edge is any import
the module can execute: `import` and `from ... import` at module level AND inside functions
(the run-time imports static tools miss), `import_module("...")` with a literal name, and
registry strings of the form `"opcompiler.pkg.mod:attr"` (a plugin named by a string is
imported when it is looked up). Imports under `if TYPE_CHECKING:` never run and are skipped.
`schedules` and `opcompiler.schedules` are one package (the latter is a symlink).

An edge goes to the module named, never implicitly to its parent packages: importing
`a.b.c` runs `a/b/__init__.py` first, but a package that imports its own submodules is the
normal way to build a namespace, not a dependency between concepts.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Edges that close a cycle and remain on purpose, each with why: a debt, not a design. The
# graph is checked without them, and each must still close a cycle (a debt paid leaves the list).
KNOWN: dict[tuple[str, str], str] = {}


def _module_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base, pkg in ((ROOT / "opcompiler", "opcompiler"), (ROOT / "schedules", "opcompiler.schedules")):
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(base).with_suffix("")
            if base.name == "opcompiler" and rel.parts[0] in ("schedules", "targets", "tuning_logs"):
                continue  # symlinks to top-level folders, walked under their own name
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _canonical(name: str) -> str:
    return f"opcompiler.{name}" if name == "schedules" or name.startswith("schedules.") else name


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _imports(name: str, path: Path, modules: set[str]) -> dict[str, int]:
    """Modules of the project `name` imports, each with the first line that does."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = _type_checking_nodes(tree)
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        target = _canonical(target)
        while target and target not in modules:  # `import a.b.Name` -> the module that defines it
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = _canonical(node.module or "")
            for a in node.names:
                sub = f"{base}.{a.name}"
                add(sub if sub in modules else base, node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            add(str(node.args[0].value), node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
            mod, _, attr = node.value.partition(":")
            if attr.isidentifier() and _canonical(mod) in modules:
                add(mod, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    files = _module_files()
    names = set(files)
    return {n: _imports(n, p, names) for n, p in files.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan, iterative enough for a package of a few hundred modules
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        start = min(comp)
        prev: dict[str, str] = {}
        frontier, seen = [start], {start}
        while frontier and start not in prev:  # breadth-first back to `start` inside the component
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in comp and w == start and start not in prev:
                        prev[start] = v
                    elif w in comp and w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        out.append([start, *reversed(path[1:]), start] if len(path) > 1 else [start, start])
    return out


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_graph_sees_runtime_imports():
    """The edges static tools miss are in the graph: function-level imports and registry strings."""
    g = import_graph()
    assert "opcompiler.ops.catalogue" in g["opcompiler.ops"]  # `_load()` imports it on first lookup
    assert "opcompiler.backend.cpu" in g["opcompiler.backend"]  # "opcompiler.backend.cpu:CpuBackend"
    assert "opcompiler.schedules.cpu" in g["opcompiler.schedules"]


def test_a_cycle_is_found_and_named():
    g = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 7}, "d": {"a": 1}}
    assert cycles(g) == [["a", "b", "c", "a"]]
    assert _describe(["a", "b", "c", "a"], g) == "a (line 1) -> b (line 3) -> c (line 7) -> a"


def _without_known(g: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {a: {b: line for b, line in out.items() if (a, b) not in KNOWN} for a, out in g.items()}


def test_no_import_cycles():
    g = _without_known(import_graph())
    found = cycles(g)
    assert not found, "import cycles (one per tangle):\n" + "\n".join(_describe(c, g) for c in found)


def _reaches(g: dict[str, dict[str, int]], src: str, dst: str) -> bool:
    seen, todo = {src}, [src]
    while todo:
        for w in g.get(todo.pop(), ()):
            if w == dst:
                return True
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return False


@pytest.mark.parametrize("edge", sorted(KNOWN), ids="->".join)
def test_known_cycles_still_exist(edge):
    """A debt paid off must leave the list (so the list never hides a new cycle)."""
    g = import_graph()
    a, b = edge
    assert b in g[a] and _reaches(_without_known(g), b, a), f"{a} -> {b} no longer closes a cycle: remove it"


def test_loading_the_templates_runs_no_backend():
    """The run-time half of the old cycle: templates import backend internals (machines, builders),
    never a backend class's module, so the template lookup a backend makes cannot re-enter it."""
    import subprocess
    import sys
    code = ("import sys, opcompiler.schedules, opcompiler.template as t; t.templates(); "
            "print(sorted(m for m in sys.modules if m in BACKENDS))")
    backends = ["opcompiler.backend.cpu", "opcompiler.backend.cuda", "opcompiler.backend.ascend.backend",
                "opcompiler.backend.dsp.backend"]
    out = subprocess.run([sys.executable, "-c", f"BACKENDS = {backends!r}; {code}"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ layers (issue 24)

# The house's parts, each on a floor: a part imports only parts on its own floor or below it (a
# larger number). Lower number = higher layer. Every module of the package stands on one part.
PARTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "cli": (0, ("opcompiler.cli", "opcompiler.__main__")),
    "graph": (1, ("opcompiler.graph",)),
    "export": (1, ("opcompiler.export",)),
    # the entry points beside the tuner: the Python API and the RPC server, which load the templates
    "tune": (2, ("opcompiler.tune", "opcompiler.api", "opcompiler.rpc")),
    "schedules": (3, ("opcompiler.schedules",)),
    "backend": (4, ("opcompiler.backend",)),
    "sim": (5, ("opcompiler.sim",)),
    # the derived-default model reads ops and is read by templates and `--config measured` builds
    "ops": (5, ("opcompiler.ops", "opcompiler.dsl", "opcompiler.prior")),
    "core": (6, tuple(f"opcompiler.{m}" for m in (
        "target", "config", "template", "template_base", "capabilities", "workload", "errors", "settings",
        "device", "records", "verify", "rpc_spec", "calibration"))),
    # the package itself (`opcompiler/__init__.py`, matched by name in `part_of`) stands above every
    # part: it installs the loader of the shipped templates that the core's registry calls
    "package": (-1, ()),
}
# Arrows drawn on purpose although they run up, each with why.
UP_ALLOWED: dict[tuple[str, str], str] = {
    ("tune", "graph"): "whole-model tuning plans the model",
}
# Arrows that must never exist, even between parts on the same floor.
NEVER: dict[tuple[str, str], str] = {
    ("core", "backend"): "targets and configs know no backend",
    ("core", "tune"): "configs read a record store below them",
    ("sim", "backend"): "the shell knows no machine",
    ("sim", "schedules"): "the shell knows no template",
    ("ops", "schedules"): "an operator knows no template",
    ("backend", "graph"): "a backend runs kernels, not models",
}


@functools.cache
def _graph() -> dict[str, dict[str, int]]:
    return import_graph()  # read once for the layer tests below (they do not change it)


def part_of(module: str) -> str | None:
    if module == "opcompiler":
        return "package"
    best, length = None, -1
    for name, (_, prefixes) in PARTS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = name, len(p)
    return best


def _arrows(g: dict[str, dict[str, int]]):
    """(part of a, part of b, a, line, b) for every import between two parts."""
    for a, out in sorted(g.items()):
        for b, line in sorted(out.items()):
            pa, pb = part_of(a), part_of(b)
            if pa and pb and pa != pb:
                yield pa, pb, a, line, b


def test_every_module_stands_on_a_part():
    assert [m for m in sorted(_graph()) if part_of(m) is None] == []


def test_the_parts_table_sees_the_old_up_arrows():
    """The check itself: a core module importing a backend, or ops importing a template, is caught."""
    g = {"opcompiler.target": {"opcompiler.backend.cuda": 235}, "opcompiler.ops": {"opcompiler.schedules": 1}}
    found = {(pa, pb) for pa, pb, *_ in _arrows(g)}
    assert found == {("core", "backend"), ("ops", "schedules")}
    assert PARTS["core"][0] > PARTS["backend"][0] and PARTS["ops"][0] > PARTS["schedules"][0]


def test_no_import_runs_back_up():
    """0 arrows from a part to a part on a higher floor (run-time imports included), but the drawn ones."""
    up = [f"{pa} -> {pb}: {a} (line {line}) imports {b}" for pa, pb, a, line, b in _arrows(_graph())
          if PARTS[pb][0] < PARTS[pa][0] and (pa, pb) not in UP_ALLOWED]
    assert not up, "imports that run back up:\n" + "\n".join(up)


@pytest.mark.parametrize("pair", sorted(NEVER), ids="->".join)
def test_never_rows(pair):
    found = [f"{a} (line {line}) imports {b}" for pa, pb, a, line, b in _arrows(_graph()) if (pa, pb) == pair]
    assert not found, f"{pair[0]} -> {pair[1]} must not exist ({NEVER[pair]}):\n" + "\n".join(found)


# What `schedules/<family>/` may import from the backend: the family's intrinsics and scopes, in
# one module (as TVM's own `tir.tensor_intrin` modules are): no lowerers, builders or programs.
INTRINSICS = {
    "ascend": "opcompiler.backend.ascend.intrin",
    "dsp": "opcompiler.backend.dsp.intrin",
    "cpu": "opcompiler.backend.cpu_intrin",
    "cuda": None,  # TVM's own CUDA intrinsics (schedules/cuda/intrin.py registers them): nothing of ours
}


@pytest.mark.parametrize("family", [
    "ascend", "cpu", "cuda", "dsp",
])
def test_schedules_import_only_their_family_intrinsics(family):
    g = _graph()
    prefix = f"opcompiler.schedules.{family}"
    bad = [f"{a} (line {line}) imports {b}" for a, out in sorted(g.items())
           if a == prefix or a.startswith(prefix + ".")
           for b, line in sorted(out.items())
           if part_of(b) == "backend" and b != INTRINSICS[family]]
    assert not bad, f"schedules/{family} may import only {INTRINSICS[family]} of the backend:\n" + "\n".join(bad)
