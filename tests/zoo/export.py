"""Export the zoo (tests/zoo/models.py) to ONNX and check each file against torch in onnxruntime.

    python tests/zoo/export.py --out DIR [--size ci|full] [--models a,b]

writes DIR/<name>.onnx, one line per model. Models are exported with the TorchScript exporter
(`dynamo=False`: the dynamo exporter needs onnxscript, which is not a dependency) at static
batch 1, each at its own realistic opset (OPSETS). `<name>_opset8` entries (DOWN) are exported at
DOWN_FROM and then converted down with onnx.version_converter, the way old model zoos shipped.
Every written file passes onnx.checker and matches the torch output in onnxruntime (rtol 1e-4).
"""
from __future__ import annotations

import argparse
import io
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

if __package__ in (None, ""):  # run as a script: make `zoo` importable from tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from zoo.models import build, example_input
else:
    from .models import build, example_input

# Each architecture's export opset (spread over 11..17 as models in the wild are).
OPSETS = {"resnet18": 13, "resnet50": 17, "mobilenet_v2": 12, "squeezenet1_1": 11, "vgg11": 14,
          "densenet121": 15, "googlenet": 13, "shufflenet_v2": 16, "efficientnet_b0": 17}
# Down-converted variants: name -> (architecture, opset exported at, opset converted down to).
# onnx's converter has no Gemm 11->10, MaxPool 10->9 or Relu 13->12 adapters, so these start from
# opset 9; they also list their weights as graph inputs, as exporters of that era did.
DOWN = {"squeezenet1_1_opset8": ("squeezenet1_1", 9, 8), "resnet18_opset8": ("resnet18", 9, 8)}
# torch.onnx folds eval-mode BatchNorm into the preceding Conv; these are exported the way users
# usually do (folded by torch). The rest keep their BatchNormalization nodes (TrainingMode.PRESERVE
# on an eval model), so opcompiler's own BN folding and BN-after-Concat / BN-before-ReLU are checked.
TORCH_FOLDS_BN = {"resnet18", "mobilenet_v2"}
NAMES = tuple(OPSETS) + tuple(DOWN)
RTOL, ATOL = 1e-4, 1e-4  # atol: 1e-4 of the output's largest magnitude (near-zero logits)


def _torch_export(model: torch.nn.Module, x: torch.Tensor, opset: int, keep_bn: bool = True,
                  weights_as_inputs: bool = False) -> onnx.ModelProto:
    buf = io.BytesIO()
    mode = torch.onnx.TrainingMode.PRESERVE if keep_bn else torch.onnx.TrainingMode.EVAL
    assert not model.training
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset, input_names=["input"],
                          output_names=["output"], do_constant_folding=True, training=mode,
                          keep_initializers_as_inputs=weights_as_inputs)
    return onnx.load_from_string(buf.getvalue())


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3  # weights-as-inputs (opset 8 style) warns once per initializer
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def opset_of(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def export_model(name: str, out_dir: str | Path, size: str = "ci", check: bool = True) -> dict:
    """Export zoo model `name` to out_dir/<name>.onnx; returns {name, path, opset, input_shape,
    nodes, ops, max_abs_err, seconds}. Raises AssertionError when onnxruntime disagrees with torch."""
    t0 = time.perf_counter()
    arch, opset, down = (DOWN[name] if name in DOWN else (name, OPSETS[name], None))
    model, shape = build(arch, size)
    x = example_input(shape)
    m = _torch_export(model, x, opset, keep_bn=arch not in TORCH_FOLDS_BN, weights_as_inputs=down is not None)
    m.graph.name = name
    if down is not None:
        m = onnx.version_converter.convert_version(m, down)
        m.graph.name = name
    onnx.checker.check_model(m, full_check=True)
    err = None
    if check:
        with torch.no_grad():
            ref = model(x).numpy()
        got = _ort(m, x.numpy())
        err = float(np.max(np.abs(got - ref)))
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(ref).max())),
                                   err_msg=f"{name}: onnxruntime disagrees with torch")
    path = Path(out_dir) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    ops = sorted({n.op_type for n in m.graph.node})
    return {"name": name, "path": str(path), "opset": opset_of(m), "input_shape": shape, "nodes": len(m.graph.node),
            "ops": ops, "max_abs_err": err, "seconds": time.perf_counter() - t0}


def export_zoo(out_dir: str | Path, size: str = "ci", models: list[str] | None = None,
               check: bool = True) -> list[dict]:
    return [export_model(n, out_dir, size, check) for n in (models or NAMES)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--size", choices=("ci", "full"), default="ci")
    ap.add_argument("--models", help=f"comma-separated subset of: {','.join(NAMES)}")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime-vs-torch check")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else list(NAMES)
    bad = [n for n in names if n not in NAMES]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)} (have: {', '.join(NAMES)})")
    for n in names:
        r = export_model(n, args.out, args.size, check=not args.no_check)
        err = "" if r["max_abs_err"] is None else f"  ort vs torch max abs err {r['max_abs_err']:.2e}"
        print(f"{r['path']}  opset {r['opset']}  input {'x'.join(map(str, r['input_shape']))}  "
              f"{r['nodes']} nodes ({', '.join(r['ops'])}){err}  {r['seconds']:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
