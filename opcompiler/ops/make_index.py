"""`python -m opcompiler.ops.make_index`: regenerate the TVM-free op index (`index.py`, the part
between its markers) from the catalogue, with the SHA-256 of `catalogue/*.py` it was made from.
Run it after adding or changing an op; `tests/foundation/test_cli_fast.py` checks it is current."""
from __future__ import annotations

import re
from pathlib import Path

from . import list_ops
from .index import _C, _CONV, _EW, _F, _MM, catalogue_digest

HERE = Path(__file__).parent


def generate() -> str:
    short = {repr(_CONV): "_CONV", repr(_EW): "_EW", repr(_MM): "_MM", repr(_F): "_F", repr(_C): "_C"}
    sha = catalogue_digest()
    lines = [f"CATALOGUE_SHA256 = {sha!r}", "OPS: dict[str, OpInfo] = {"]
    for o in list_ops():
        d, dts = repr(dict(o.defaults)), repr(tuple(o.dtypes))
        lines.append(f"    {o.name!r}: OpInfo({o.family!r}, {o.summary!r},\n"
                     f"        {short.get(d, d)}, {o.preset_kind!r}, {short.get(dts, dts)}),")
    return "\n".join(lines + ["}"])


def main() -> None:
    path = HERE / "index.py"
    text = re.sub(r"(# BEGIN GENERATED\n).*?(# END GENERATED)", lambda m: m.group(1) + generate() + "\n" + m.group(2),
                  path.read_text(), flags=re.S)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
