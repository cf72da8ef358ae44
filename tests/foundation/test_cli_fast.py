"""Issue 29: what a new user meets first. Bad names are answered before TVM is imported (checked
by importing nothing, not by timing), with a suggestion; one default target for every command,
said in a note; a partial --shape says what filled it; shapes print in the op's key order."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcompiler.cli import main

# main() in a fresh interpreter, then whether anything imported TVM (stderr's last line)
_PROBE = ("import sys\nfrom opcompiler.cli import main\nrc = main(sys.argv[1:])\n"
          "print('TVM-IMPORTED' if 'tvm' in sys.modules else 'NO-TVM', file=sys.stderr)\nsys.exit(rc)")


def probe(*argv: str) -> tuple[int, str, list[str], bool]:
    r = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    return r.returncode, r.stdout, lines[:-1], lines[-1] == "TVM-IMPORTED"


@pytest.mark.parametrize("argv, words", [
    (("run", "conv2dd"), "op='conv2dd': unknown op; did you mean 'conv2d'?"),
    (("run", "conv2d", "--target", "ascnd-sim"), "--target='ascnd-sim': unknown target; did you mean 'ascend-sim'?"),
    (("tune", "matmull", "--target", "dsp-sim"), "op='matmull': unknown op; did you mean 'matmul'?"),
    (("export", "relu", "--target", "cpuu", "--out", "x"), "did you mean 'cpu'?"),
    (("run", "conv2d", "--shape", "n=1,cc=3"), "conv2d has no shape parameter 'cc'; did you mean 'c'?"),
    (("run", "conv2d", "--preset", "resnet50.res2_3x4"), "unknown preset; did you mean 'resnet50.res2_3x3'?"),
    (("run", "matmul", "--preset", "resnet50.res2_3x3"), "is a conv shape but matmul takes a matmul shape"),
    (("run", "conv2d", "--dtype", "bfloat16"), "conv2d does not support this dtype"),
    (("run", "conv2d", "--config", "papr"), "--config='papr': neither a config name nor a JSON object; did you mean "
                                             "'paper'?"),
    (("best", "conv2d", "--batch", "0"), "--batch=0: must be a positive integer"),
    (("compare", "m.onnx", "--target", "dspsim"), "did you mean 'dsp-sim'?"),
    (("logs", "--target", "ascend-simm"), "did you mean 'ascend-sim'?"),
])
def test_bad_names_answered_before_tvm_is_imported(argv, words):
    rc, out, err, tvm = probe(*argv)
    assert rc == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("opcompiler: error: ") and words in err[0], err
    assert not tvm, "the argument checks imported TVM"


def test_ops_lists_shape_keys_and_defaults_without_tvm():
    rc, out, err, tvm = probe("ops")
    assert rc == 0 and err == [] and not tvm
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("conv2d "))
    assert lines[i + 1].split() == ["--shape", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,dilation=1,groups=1,"
                                               "layout=NCHW"]
    i = next(i for i, line in enumerate(lines) if line.startswith("matmul "))
    assert lines[i + 1].split() == ["--shape", "m=16,k=256,n=1024,trans_a=0,trans_b=0"]


def test_index_matches_the_catalogue():
    """ops/index.py is generated from catalogue.py (`python -m opcompiler.ops.make_index`): current,
    and equal to the catalogue op by op (names, families, summaries, defaults in order, kinds, dtypes)."""
    from opcompiler.ops import list_ops
    from opcompiler.ops.index import OPS, current
    assert current(), "catalogue.py changed since ops/index.py was generated: run python -m opcompiler.ops.make_index"
    assert sorted(OPS) == [o.name for o in list_ops()]
    for o in list_ops():
        i = OPS[o.name]
        assert (i.family, i.summary, list(i.defaults.items()), i.preset_kind, i.dtypes) == \
            (o.family, o.summary, list(o.defaults.items()), o.preset_kind, tuple(o.dtypes)), o.name


def test_a_stale_index_falls_back_to_the_catalogue(monkeypatch):
    from opcompiler.ops import check_args, index, op_info
    monkeypatch.setattr(index, "CATALOGUE_SHA256", "0" * 64)
    index.current.cache_clear()
    try:
        assert not index.current()
        monkeypatch.setattr(index, "OPS", {})  # an index that lists nothing
        assert op_info("conv2d").keys[:3] == ("n", "c", "h")  # from the catalogue
        with pytest.raises(Exception, match="unknown op; did you mean 'relu'"):
            check_args("reluu")
    finally:
        monkeypatch.undo()
        index.current.cache_clear()


def test_one_default_target_with_a_note(capsys):
    """run, build, export, best, tune, compare and graph take ascend-sim when --target is not given."""
    from opcompiler.cli import make_parser
    from opcompiler.cli.common import DEFAULT_TARGET, check_args
    assert DEFAULT_TARGET == "ascend-sim"
    parser = make_parser()
    for argv in (["run", "relu"], ["build", "relu"], ["export", "relu", "--out", "x"], ["best", "conv2d"],
                 ["tune", "conv2d"], ["compare", "m.onnx"], ["graph", "run", "m.onnx"], ["graph", "plan", "m.onnx"]):
        args = parser.parse_args(argv)
        assert args.target is None
        check_args(args)
        assert args.target == "ascend-sim", argv
    # a real run: the note on stderr, the report on ascend910-sim in float16
    assert main(["run", "relu", "--shape", "n=1,c=16,h=4,w=4", "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["target"] == "ascend910-sim" and rep["dtype"] == "float16" and rep["correct"] is True
    assert cap.err.splitlines()[0] == ("opcompiler: note: no --target given: using ascend-sim (ascend910-sim); "
                                       "pass --target cpu, dsp-sim, ... for another")
    # given: no note
    assert main(["run", "relu", "--target", "cpu", "--shape", "n=1,c=16,h=4,w=4,layout=NCHW", "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_partial_shape_says_what_filled_it(capsys):
    assert main(["run", "conv2d", "--target", "cpu", "--shape", "n=1,c=16,h=14,w=14,k=32,r=1,s=1"]) == 0
    cap = capsys.readouterr()
    assert cap.err.splitlines() == ["opcompiler: note: --shape gave n,c,h,w,k,r,s; filled in from conv2d's defaults: "
                                    "stride=1,pad=1,dilation=1,groups=1,layout=NCHW"]
    # the op's key order, not alphabetical
    assert cap.out.splitlines()[0] == ("conv2d on cpu  float32  "
                                       "n=1,c=16,h=14,w=14,k=32,r=1,s=1,stride=1,pad=1,dilation=1,groups=1,layout=NCHW")
    assert "correct: yes" in cap.out


def test_preset_named_and_what_changed_it(capsys):
    assert main(["run", "conv2d", "--target", "dsp-sim", "--preset", "minigo.conv3_res", "--batch", "2",
                 "--shape", "k=32", "--timing-only"]) == 0
    cap = capsys.readouterr()
    assert cap.err.splitlines() == ["opcompiler: note: --shape gave k; filled in from preset minigo.conv3_res: "
                                    "c=64,h=19,w=19,r=3,s=3,stride=1,pad=1,dilation=1,groups=1,layout=NHWC"]
    assert cap.out.splitlines()[0] == (
        "conv2d on ft-m7032-dsp-sim  float32  minigo.conv3_res with --batch 2 --shape k=32 "
        "(n=2,c=64,h=19,w=19,k=32,r=3,s=3,stride=1,pad=1,dilation=1,groups=1,layout=NHWC)")
    assert main(["run", "matmul", "--target", "dsp-sim", "--preset", "minigo.fc3", "--timing-only", "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["preset"] == "minigo.fc3" and list(rep["shape"]) == ["m", "k", "n", "trans_a", "trans_b"]
    assert cap.err == ""  # a whole preset: nothing to say


def test_config_paper_in_run_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "paper (the published schedule" in " ".join(capsys.readouterr().out.split())


def test_export_folder_names(tmp_path, capsys):
    """A folder name `import` cannot take is warned about (one line, with the name to use);
    tune suggests importable names."""
    from types import SimpleNamespace

    from opcompiler.cli.tune import export_command
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    res = SimpleNamespace(workload=workload("conv2d", preset="resnet50.res2_3x3", dtype="float16"),
                          target=load_target("ascend-sim"))
    assert export_command(res).endswith("--out exported/conv2d_ascend910_sim")
    out = tmp_path / "relu-cpu"
    assert main(["export", "relu", "--target", "cpu", "--shape", "n=1,c=4,h=4,w=8,layout=NCHW", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"opcompiler: warning: --out folder name 'relu-cpu' is not a Python identifier, so `import relu-cpu` "
                   f"will fail (opcompiler.export.import_folder({str(out)!r}) still loads it); use --out "
                   f"{tmp_path / 'relu_cpu'} to import it by name"]
    # the name it suggests imports as README says
    good = tmp_path / "relu_cpu"
    assert main(["export", "relu", "--target", "cpu", "--shape", "n=1,c=4,h=4,w=8,layout=NCHW", "--out", str(good)]) == 0
    assert capsys.readouterr().err == ""
    sys.path.insert(0, str(tmp_path))
    try:
        import numpy as np
        pkg = __import__("relu_cpu")
        x = np.linspace(-1, 1, 128, dtype="float32").reshape(1, 4, 4, 8)
        np.testing.assert_array_equal(pkg.kernel(x), np.maximum(x, 0))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("relu_cpu", None)


def test_graph_models_small_is_small(tmp_path, capsys):
    assert main(["graph", "models", str(tmp_path), "--small"]) == 0
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("*.onnx")}
    assert set(sizes) == {"resnet_block.onnx", "resnet50_stage.onnx", "minigo.onnx", "resnet18.onnx", "op_zoo.onnx"}
    assert max(sizes.values()) < 3_000_000 and sizes["resnet18.onnx"] < 1_000_000, sizes


def test_graph_plan_show_plan_says_more(tmp_path, capsys):
    from opcompiler.graph.models import write
    m = write("resnet_block", tmp_path / "rb.onnx", c=8, hw=8)
    assert main(["graph", "plan", str(m), "--batch", "1", "--target", "dsp-sim"]) == 0
    plain = capsys.readouterr().out
    assert main(["graph", "plan", str(m), "--batch", "1", "--target", "dsp-sim", "--show-plan"]) == 0
    shown = capsys.readouterr().out
    assert len(shown.splitlines()) > len(plain.splitlines())
    assert "kernels of the fused plan (--config best):" in shown and "kernels of the unfused plan" in shown
    assert ("conv2d_bn_relu float32 n=1,c=8,h=8,w=8,k=8,r=3,s=3,stride=1,pad=1,dilation=1,groups=1,layout=NCHW"
            in shown)
    assert "compulsory; config: template default (no verified record for this key)" in shown
