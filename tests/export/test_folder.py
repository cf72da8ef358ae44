"""The export folder: manifest, plain-Python loader, verification, CLI, refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opcompiler import __version__
from opcompiler.cli import main
from opcompiler.errors import OpcError
from opcompiler.export import aligned_empty, export, load, parse_bindings
from opcompiler.ops import fold_bn, get_op, workload
from opcompiler.target import load_target
from opcompiler.tune.records import record_key
from opcompiler.verify import TOLERANCE

CONV_SHAPE = "n=2,c=8,h=10,w=10,k=16,r=3,s=3,pad=1"  # as conftest.py


def _conv_bn_relu_numpy(x, w, gamma, beta, mean, var, pad=1):
    """Direct NCHW convolution in float64 (independent of the catalogue's reference), then BN, ReLU."""
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, k, h, wd))
    for i in range(r):
        for j in range(s):
            y += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
    y = (y - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None]
    return np.maximum(y + beta[None, :, None, None], 0)


def test_manifest_describes_kernel(cpu_conv_folder):
    m = json.loads((cpu_conv_folder / "manifest.json").read_text())
    cpu = load_target("cpu")
    wl = workload("conv2d_bn_relu", CONV_SHAPE)
    assert m["op"] == "conv2d_bn_relu" and m["dtype"] == "float32" and m["layout"] == "NCHW"
    assert [(i["name"], i["shape"], i["layout"]) for i in m["inputs"]] == [
        ("data", [2, 8, 10, 10], "NCHW"), ("weight", [16, 8, 3, 3], "OIHW"), ("scale", [16], "C"),
        ("shift", [16], "C")]
    assert m["output"] == {"name": "out", "shape": [2, 16, 10, 10], "dtype": "float32", "layout": "NCHW"}
    assert m["target"]["name"] == "cpu" and m["target"]["digest"] == cpu.digest
    assert m["config_source"] == "template default"
    assert m["record_key"] == record_key(wl, cpu, m["template"], m["template_version"])
    assert m["versions"]["opcompiler"] == __version__ and m["versions"]["tvm"]
    assert m["artifact"]["kind"] == "tvm-library" and (cpu_conv_folder / m["artifact"]["file"]).is_file()
    assert "T.prim_func" in (cpu_conv_folder / "kernel.tir.py").read_text()
    assert m["verification"]["correct"] and m["verification"]["max_abs_err"] < 1e-4
    assert [s["op"] for s in m["unfused"]] == ["conv2d", "batch_norm", "relu"]


def test_lib_loader_matches_independent_reference(cpu_conv_folder):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 10, 10)).astype("float32")
    w = rng.standard_normal((16, 8, 3, 3)).astype("float32")
    gamma, beta = rng.uniform(0.5, 1.5, 16), rng.uniform(-1, 1, 16)
    mean, var = rng.uniform(-1, 1, 16), rng.uniform(0.5, 2, 16)
    scale, shift = fold_bn(gamma.astype("float32"), beta.astype("float32"), mean.astype("float32"),
                           var.astype("float32"))
    k = load(cpu_conv_folder)
    y = k(x, w, scale, shift)
    ref = _conv_bn_relu_numpy(x, w, gamma, beta, mean, var)
    rtol, atol = TOLERANCE["float32"]
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol * np.abs(ref).max())
    assert (y == 0).any() and (y > 0).any()  # ReLU really clipped something and let something through


def test_lib_writes_into_given_output_buffer(cpu_conv_folder):
    k = load(cpu_conv_folder)
    ins = get_op("conv2d_bn_relu").make_inputs(workload("conv2d_bn_relu", CONV_SHAPE), seed=3)
    out = aligned_empty((2, 16, 10, 10), "float32")
    out[...] = np.nan
    assert k(*ins, out=out) is out
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, k(*ins), rtol=0, atol=0)


def test_cli_export_json_and_reexport(tmp_path, capsys):
    out = tmp_path / "relu"
    assert main(["export", "relu", "--target", "cpu", "--shape", "n=1,c=4,h=4,w=8", "--to", "lib", "--out", str(out),
                 "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["op"] == "relu" and m["bindings"] == ["lib"] and m["out"] == str(out)
    x = np.linspace(-1, 1, 128, dtype="float32").reshape(1, 4, 4, 8)
    np.testing.assert_array_equal(load(out)(x), np.maximum(x, 0))
    # an earlier export may be overwritten; a stale onnx file from it is removed
    (out / "model.onnx").write_text("stale")
    assert main(["export", "relu", "--target", "cpu", "--shape", "n=1,c=4,h=4,w=4", "--to", "lib", "--out", str(out)]) == 0
    assert not (out / "model.onnx").exists() and load(out).inputs[0]["shape"] == [1, 4, 4, 4]


@pytest.mark.parametrize("argv, needle", [
    (["--to", "tflite"], "--to='tflite': unknown binding (expected torch, onnx or lib"),
    (["--to", "onnx", "--op", "reduce_sum"], "has no ONNX decomposition"),
    (["--config", "{bad"], "--config='{bad'"),
    (["--name", "1abc"], "--name='1abc': must be a Python identifier"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, argv, needle):
    op = "relu"
    if "--op" in argv:
        i = argv.index("--op")
        op, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    assert main(["export", op, "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_refuses_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OpcError, match="not an opcompiler export"):
        export(workload("relu", "n=1,c=4,h=4,w=4"), load_target("cpu"), to="lib", out=tmp_path, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_parse_bindings_always_includes_lib():
    assert parse_bindings("onnx") == ("lib", "onnx")
    assert parse_bindings(["torch", "onnx"]) == ("lib", "torch", "onnx")


def test_best_config_comes_from_verified_record(tmp_path, monkeypatch):
    """--config best takes the best VERIFIED record of the tuner's log and says so in the manifest."""
    from opcompiler.settings import settings
    from opcompiler.template import get_template
    from opcompiler.tune.records import Record, RecordLog, default_log_path
    monkeypatch.setenv("OPC_LOG_DIR", str(tmp_path / "logs"))
    settings.cache_clear()
    try:
        cpu, wl = load_target("cpu"), workload("conv2d_bn_relu", "n=1,c=4,h=6,w=6,k=8,r=3,s=3,pad=1")
        tmpl = get_template("conv2d", "cpu")
        key = record_key(wl, cpu, tmpl.name, tmpl.version)
        default = tmpl.config(wl, cpu, None)
        fast = {**default, "tile_vec": 4, "tile_reg": 2}
        faster_unverified = {**default, "tile_vec": 2, "tile_reg": 1}
        log = RecordLog(default_log_path(cpu, wl.op))
        log.append([Record(key=key, config=fast, status="ok", seconds=1e-5, verified=True),
                    Record(key=key, config=faster_unverified, status="ok", seconds=1e-6)])
        m = export(wl, cpu, "best", to="lib", out=tmp_path / "best", progress=False)
        assert m["config_source"].startswith("best verified record (your records") and m["config"] == fast
        assert m["record"]["seconds"] == 1e-5 and m["record"]["verified"]
        other = workload("conv2d_bn_relu", "n=1,c=4,h=6,w=6,k=8,r=1,s=1,pad=0")
        m2 = export(other, cpu, "best", to="lib", out=tmp_path / "none", progress=False)
        assert m2["config_source"].startswith("template default") and m2["record"] is None
    finally:
        settings.cache_clear()


def test_failed_build_leaves_earlier_export_intact(tmp_path):
    wl, cpu = workload("relu", "n=1,c=4,h=4,w=4"), load_target("cpu")
    export(wl, cpu, to="lib", out=tmp_path, progress=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OpcError):
        export(wl, cpu, {"no_such_knob": 1}, to="lib", out=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert load(tmp_path)(np.ones((1, 4, 4, 4), "float32")).sum() == 64


def test_wrong_kernel_is_recorded_and_refused(tmp_path, monkeypatch):
    """A kernel that disagrees with the reference is written for inspection but never loads."""
    import opcompiler.export.folder as folder
    from opcompiler.errors import OpcFailure
    monkeypatch.setattr(folder, "compare", lambda got, ref: (False, 0.5))
    with pytest.raises(OpcFailure, match="computed a wrong result"):
        export(workload("relu", "n=1,c=4,h=4,w=4"), load_target("cpu"), to="lib", out=tmp_path, progress=False)
    assert json.loads((tmp_path / "manifest.json").read_text())["verification"]["correct"] is False
    with pytest.raises(OpcError, match="failed verification at export"):
        load(tmp_path)
