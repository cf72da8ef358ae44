"""The torch binding: a custom op registered by importing the folder, used in a fresh process
inside a small model, compared with torch's own conv2d + batch_norm (eval) + relu."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

# Runs in a fresh interpreter: nothing of the exporting process (kernels, registrations) leaks in.
_CHILD = textwrap.dedent("""
    import importlib, json, sys
    from pathlib import Path
    sys.modules["opcompiler"] = None  # the folder must work without opcompiler: numpy, TVM runtime, torch
    import torch
    from torch import nn

    folder = Path(sys.argv[1])
    sys.path.insert(0, str(folder.parent))
    pkg = importlib.import_module(folder.name)  # a plain import registers torch.ops.opcompiler.<name>
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block
            self.head = nn.Conv2d(16, 4, 1)
        def forward(self, x):
            return self.head(self.block(x)).mean(dim=(2, 3))

    conv = nn.Conv2d(8, 16, 3, padding=1, bias=True)
    bn = nn.BatchNorm2d(16)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1); bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5); bn.bias.uniform_(-1, 1)
    ref = Net(nn.Sequential(conv, bn, nn.ReLU())).eval()
    ours = Net(pkg.OpcConvBnReLU.from_modules(pkg.kernel, conv, bn)).eval()
    ours.head.load_state_dict(ref.head.state_dict())
    x = torch.randn(2, 8, 10, 10)
    with torch.no_grad():
        y_ref, y = ref(x), ours(x)
        block_ref = nn.functional.relu(nn.functional.batch_norm(
            nn.functional.conv2d(x, conv.weight, conv.bias, padding=1), bn.running_mean, bn.running_var,
            bn.weight, bn.bias, training=False, eps=bn.eps))
        block = ours.block(x)
        scale, shift = ours.block.folded()
        direct = torch.ops.opcompiler.conv2d_bn_relu(x, conv.weight, scale, shift)
    print(json.dumps({
        "op": str(torch.ops.opcompiler.conv2d_bn_relu),
        "block_err": (block - block_ref).abs().max().item(),
        "block_scale": block_ref.abs().max().item(),
        "clipped": (block_ref == 0).float().mean().item(),
        "net_err": (y - y_ref).abs().max().item(),
        "direct_equal": bool(torch.equal(direct, block)),
        "type": type(ours.block).__name__,
        "error_base": pkg.KernelInputError.__mro__[1].__name__,
        "opcompiler_loaded": any(m.startswith("opcompiler.") for m in sys.modules),
    }))
""")


def test_torch_model_in_fresh_process(cpu_conv_folder):
    r = subprocess.run([sys.executable, "-c", _CHILD, str(cpu_conv_folder)], capture_output=True, text=True, check=False,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["op"] == "opcompiler.conv2d_bn_relu" and res["type"] == "OpcConvBnReLU"
    # fp32, K = 8*3*3 = 72 products: a few ulps of the output's magnitude
    assert res["block_err"] <= 1e-5 * max(res["block_scale"], 1.0)
    assert 0.05 < res["clipped"] < 0.95  # the ReLU clipped some, not all
    assert res["net_err"] <= 1e-5 and res["direct_equal"]
    assert res["error_base"] == "ValueError" and not res["opcompiler_loaded"]  # really standalone


@pytest.fixture(scope="module")
def pkg(cpu_conv_folder):
    from opcompiler.export import import_folder
    return import_folder(cpu_conv_folder)


def _inputs(pkg):
    return [torch.randn(s["shape"]) for s in pkg.kernel.inputs]


def test_dlpack_passes_tensors_without_copies(pkg):
    from opcompiler.export.torch_binding import _to_tvm
    x = torch.randn(2, 8, 10, 10)
    assert _to_tvm(x).data_ptr() == x.data_ptr()
    off = torch.randn(2 * 8 * 10 * 10 + 1)[1:].view(2, 8, 10, 10)  # contiguous, 4 bytes off alignment
    assert _to_tvm(off).data_ptr() != off.data_ptr()  # TVM needs 64-byte alignment: one copy, same values
    ins = [off] + _inputs(pkg)[1:]
    torch.testing.assert_close(pkg.op(*ins), pkg.op(off.clone(), *ins[1:]), rtol=0, atol=0)


def test_fake_impl_infers_shape_without_running(pkg):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        args = [torch.empty(s["shape"]) for s in pkg.kernel.inputs]
        y = torch.ops.opcompiler.conv2d_bn_relu(*args)
        assert tuple(y.shape) == (2, 16, 10, 10) and y.dtype == torch.float32
        with pytest.raises(ValueError, match=r"expected float32\[2, 8, 10, 10\], got float32\[2, 8, 12, 12\]"):
            torch.ops.opcompiler.conv2d_bn_relu(torch.empty(2, 8, 12, 12), *args[1:])


@pytest.mark.parametrize("change, needle", [
    (lambda a: [a[0][:1]] + a[1:], r"input 'data' \(NCHW\): expected float32\[2, 8, 10, 10\], got float32\[1, 8, 10, 10\]"),
    (lambda a: [a[0].double()] + a[1:], r"expected float32\[2, 8, 10, 10\], got float64\[2, 8, 10, 10\]"),
    (lambda a: [a[0].to(memory_format=torch.channels_last)] + a[1:],
     r"expected a dense row-major NCHW float32\[2, 8, 10, 10\] tensor, got a channels_last"),
    (lambda a: a[:1] + [a[1].permute(1, 0, 2, 3).contiguous()] + a[2:],
     r"input 'weight' \(OIHW\): expected float32\[16, 8, 3, 3\], got float32\[8, 16, 3, 3\]"),
])
def test_mismatched_tensors_name_expected_and_got(pkg, change, needle):
    from opcompiler.export import KernelInputError
    with pytest.raises(KernelInputError, match=needle):
        pkg.op(*change(_inputs(pkg)))


def test_missing_argument_is_caught_by_the_schema(pkg):
    with pytest.raises(RuntimeError, match=r"missing value for argument 'shift'.*Tensor shift\) -> Tensor"):
        pkg.op(*_inputs(pkg)[:3])


def test_drop_in_module_checks_layers_it_replaces(pkg):
    from opcompiler.export import KernelInputError
    with pytest.raises(KernelInputError, match=r"conv.stride: expected \(1, 1\), got \(2, 2\)"):
        pkg.OpcConvBnReLU.from_modules(pkg.kernel, torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                       torch.nn.BatchNorm2d(16))
    m = pkg.OpcConvBnReLU(pkg.kernel)
    m.train()
    with pytest.raises(RuntimeError, match="call .eval()"):
        m(torch.randn(2, 8, 10, 10))


def test_compiles_as_one_graph(pkg):
    """torch.compile traces through the fake implementation: no graph break at the custom op."""
    m = pkg.OpcConvBnReLU(pkg.kernel)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        x = torch.randn(2, 8, 10, 10)
        compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), m(x), rtol=0, atol=0)


def test_nhwc_export_takes_channels_last_tensors(tmp_path):
    """An NHWC kernel behind the drop-in: channels_last input is viewed as NHWC without a copy."""
    from opcompiler.export import KernelInputError, export, import_folder
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    wl = workload("conv2d_bn_relu", "n=2,c=4,h=7,w=7,k=8,r=3,s=3,pad=1,stride=2,layout=NHWC")
    out = tmp_path / "nhwc"
    export(wl, load_target("cpu"), to="torch", out=out, name="conv_bn_relu_nhwc", progress=False)
    pkg = import_folder(out)
    conv, bn = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        ref = torch.nn.Sequential(conv, bn, torch.nn.ReLU()).eval()
        block = pkg.OpcConvBnReLU.from_modules(pkg.kernel, conv, bn)
        x = torch.randn(2, 4, 7, 7).to(memory_format=torch.channels_last)
        y = block(x)
        assert y.shape == (2, 8, 4, 4) and y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, ref(x), rtol=1e-4, atol=1e-5)
        with pytest.raises(KernelInputError, match="expected a channels_last tensor"):
            block(x.contiguous())


def test_torch_onnx_export_emits_opcompiler_node(pkg, cpu_conv_folder):
    """A torch model using the op exports to ONNX with the fused node in the opcompiler domain, and
    our runner executes that graph with the exported kernel (the rest on onnx.reference)."""
    import io
    import warnings

    import onnx

    from opcompiler.export.onnx_runner import Runner
    net = torch.nn.Sequential(pkg.OpcConvBnReLU(pkg.kernel), torch.nn.Conv2d(16, 4, 1)).eval()
    with torch.no_grad():
        net[0].bn.running_mean.uniform_(-1, 1)
    x = torch.randn(2, 8, 10, 10)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"], output_names=["y"],
                          custom_opsets={"opcompiler": 1}, opset_version=17)
    model = onnx.load_from_string(f.getvalue())
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("opcompiler", "conv2d_bn_relu"), ("", "Conv")]
    y = Runner(model, [cpu_conv_folder]).run({"x": x.numpy()})[0]
    with torch.no_grad():
        np_ref = net(x).numpy()
    assert abs(y - np_ref).max() <= 1e-5 * max(abs(np_ref).max(), 1.0)
