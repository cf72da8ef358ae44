"""The README's Quick start, run as written (issue 29): every `opcompiler ...` line of its shell
block through the CLI's `main`, in order, from an empty log directory (conftest's OPC_LOG_DIR)
and an empty working directory, then its Python block. Each command must exit 0, and what it
reports is checked."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from opcompiler.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> tuple[list[list[str]], list[str]]:
    """(the shell block's opcompiler commands as argv lists, the Python blocks' sources)."""
    text = README.read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    shell = [b for lang, b in blocks if lang == "bash"]
    assert len(shell) == 1
    cmds = [shlex.split(line, comments=True) for line in shell[0].splitlines() if line.strip()]
    assert all(c[0] == "opcompiler" for c in cmds), cmds
    return [c[1:] for c in cmds], [b for lang, b in blocks if lang == "python"]


def test_readme_quick_start_runs_as_written(tmp_path, monkeypatch, capsys):
    import os
    monkeypatch.chdir(tmp_path)
    logs = Path(os.environ["OPC_LOG_DIR"])
    assert not logs.exists() or not any(logs.iterdir())
    cmds, python = quick_start()
    assert len(cmds) >= 8
    seen: dict[str, str] = {}
    for argv in cmds:
        rc = main(argv)
        cap = capsys.readouterr()
        assert rc == 0, (argv, cap.err)
        assert "Traceback" not in cap.err
        seen[" ".join(argv)] = cap.out
        if argv[0] == "run":
            if "--json" in argv:
                rep = json.loads(cap.out)
                assert rep["correct"] is True and rep["seconds"] > 0, argv
            else:
                assert "  correct: yes" in cap.out, (argv, cap.out)
            if "--target" not in argv:  # the default target, and a note that says so
                assert " on ascend910-sim  float16  " in cap.out
                assert "opcompiler: note: no --target given: using ascend-sim" in cap.err
        elif argv[0] == "tune":
            assert "best config (verified)" in cap.out and "ascend910-sim / ascend.conv2d" in cap.out
            assert (logs / "ascend910-sim" / "conv2d.jsonl").is_file()
        elif argv[0] == "export":
            out = Path(argv[argv.index("--out") + 1])
            assert out.name.isidentifier() and (out / "manifest.json").is_file()
            assert json.loads((out / "manifest.json").read_text())["verification"]["correct"] is True
            sys.path.insert(0, str(out.parent))  # importable by its name, as the export section says
            try:
                pkg = __import__(out.name)
                assert pkg.kernel is not None
            finally:
                sys.path.remove(str(out.parent))
                sys.modules.pop(out.name, None)
        elif argv[0] == "logs":
            rows = [line.split() for line in cap.out.splitlines() if line.startswith("user ")]
            assert [r[1:3] for r in rows] == [["ascend910-sim", "conv2d"]]
            assert "--shipped lists them" in cap.out
    assert "conv2d_bn_relu" in seen["ops"] and "minigo.conv3_res" in seen["ops"]
    assert "ascend910-sim" in seen["targets"] and "ft-m7032-dsp-sim" in seen["targets"]
    for src in python:
        exec(compile(src, "README Quick start", "exec"), {})  # noqa: S102  (the README's own example)
    assert "True" in capsys.readouterr().out


def test_partial_shape_line_of_quick_start_notes_its_defaults(capsys):
    cmds, _ = quick_start()
    argv = next(c for c in cmds if c[0] == "run" and "--shape" in c)
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["opcompiler: note: --shape gave c,h,w,k; filled in from conv2d's defaults: "
                   "n=1,r=3,s=3,stride=1,pad=1,dilation=1,groups=1,layout=NCHW"]
