"""Target files: loading, aliases, sources, and errors that name the file, the key and the problem."""
from __future__ import annotations

import pytest

from opcompiler import OpcError
from opcompiler.target import builtin_targets, load_target, parse_target


def test_builtin_targets_load_and_have_sources():
    ts = builtin_targets()
    assert "cpu" in ts
    assert load_target("llvm").name == "cpu"
    for t in ts.values():
        assert t.digest and len(t.digest) == 16
        if t.is_simulator:
            # every figure of a simulated machine says where it came from
            assert t.sources, t.name


def test_user_target_file(tmp_path):
    p = tmp_path / "my.toml"
    p.write_text('[target]\nname = "mine"\nfamily = "cpu"\ncores = { value = 4, source = "assumed" }\n'
                 '[[memory]]\nname = "DRAM"\nbandwidth_gbps = 10\n')
    t = load_target(str(p))
    assert t.name == "mine" and t.cores == 4 and t.sources["target.cores"] == "assumed"
    assert t.memory("DRAM").bandwidth_gbps == 10.0


@pytest.mark.parametrize("text,words", [
    ('[target]\nname = "x"\nfamily = "quantum"\n', "target.family"),
    ('[target]\nname = "x"\nfamily = "cpu"\ncores = "many"\n', "target.cores"),
    ('[target]\nname = "x"\nfamily = "cpu"\n[[memory]]\nname = "L1"\ncapacity_bytes = -5\n', "memory.L1.capacity_bytes"),
    ('[target]\nname = "x"\nfamily = "cpu"\n[[memory]]\nname = "L1"\nsize = 5\n', "memory.L1.size"),
    ('[target\nname = "x"\n', "not valid TOML"),
    ('[other]\n', "[target]"),
])
def test_malformed_target_names_file_key_problem(tmp_path, text, words):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(OpcError) as e:
        parse_target(p)
    assert str(p) in str(e.value) and words in str(e.value)


def test_digest_follows_values_not_sources(tmp_path):
    """Record keys hash the figures, not the words beside them: sourcing an assumed figure keeps
    every tuning record valid; changing the figure invalidates them."""
    from pathlib import Path
    import re
    text = Path(load_target("dsp-sim").path).read_text()
    base = parse_target(_write(tmp_path, "a.toml", text)).digest
    line = re.search(r'latency_cycles = \{ value = 200, source = "[^"]*" \}', text).group(0)
    resourced = text.replace(line, 'latency_cycles = { value = 200, source = "some paper, Table 3" }', 1)
    assert resourced != text
    assert parse_target(_write(tmp_path, "b.toml", resourced)).digest == base
    changed = text.replace(line, line.replace("value = 200", "value = 240"), 1)
    assert parse_target(_write(tmp_path, "c.toml", changed)).digest != base


def _write(d, name, text):
    p = d / name
    p.write_text(text)
    return p


def test_shipped_records_match_the_shipped_targets():
    """Every shipped record's key carries the digest of the target file shipped beside it."""
    import json
    from opcompiler.tune.records import shipped_dir
    for log in shipped_dir().rglob("*.jsonl"):
        digest = load_target(log.parent.name).digest
        keys = {json.loads(line)["key"]["target_digest"] for line in log.read_text().splitlines() if line.strip()}
        assert keys == {digest}, log
