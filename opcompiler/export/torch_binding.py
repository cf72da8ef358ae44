"""The PyTorch binding of an export folder (copied into it as `opc_torch.py`).

Importing the folder registers `torch.ops.opcompiler.<name>` through `torch.library.custom_op`
with a fake implementation for shape inference; tensors go to the TVM kernel by DLPack
without copies (the output is allocated by torch and written in place by the kernel).
`OpcConvBnReLU` is a drop-in for `nn.Conv2d` + `nn.BatchNorm2d` (eval) + `nn.ReLU`; `OpcModule`
wraps any exported op as an `nn.Module`. Inference only: no autograd formula is registered.
"""
from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

import numpy as np
import torch
from torch import nn

try:  # inside an export folder
    from .opc_runtime import (ALIGN, ExportedKernel, KernelInputError, check_arg, check_count, device_kind,
                              layout_error, load)
except ImportError:  # as opcompiler.export.torch_binding
    from .runtime import (ALIGN, ExportedKernel, KernelInputError, check_arg, check_count, device_kind,
                          layout_error, load)

# TVM's pool workers spin ~300k iterations after each kernel, starving torch's OpenMP threads on
# the same cores (seen: a 0.8 MB torch clone after a conv took 48 ms instead of 0.02 ms). Read
# once, when TVM's pool first starts; set TVM_THREAD_POOL_SPIN_COUNT yourself to override.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8, "int32": torch.int32}
# One registry per process, shared by every copy of this module (each folder carries its own copy).
_REG_NAME = "_opcompiler_torch_ops"
_REGISTRY: dict[str, tuple[str, Any]] = sys.modules.setdefault(
    _REG_NAME, types.ModuleType(_REG_NAME)).__dict__.setdefault("ops", {})


def _identity(kernel: ExportedKernel) -> str:
    m = kernel.manifest
    return json.dumps([m["record_key"], m["config"]], sort_keys=True)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _check(kernel: ExportedKernel, args: tuple[torch.Tensor, ...], strides: bool) -> None:
    check_count(len(args), kernel.inputs, kernel.name)
    for spec, t in zip(kernel.inputs, args):
        check_arg(spec["name"], spec, tuple(t.shape), _dtype_name(t), kernel.name)
        if strides and not t.is_contiguous():
            got = ("a channels_last (NHWC-strided) tensor" if t.dim() == 4 and
                   t.is_contiguous(memory_format=torch.channels_last) else f"a strided tensor (strides {t.stride()})")
            raise layout_error(spec["name"], spec, kernel.name, got)
        if strides and t.device.type != _device(kernel):
            raise KernelInputError(f"{kernel.name}: input {spec['name']!r}: expected a {_device(kernel)} tensor, "
                                   f"got {t.device}")


def _device(kernel: ExportedKernel) -> str:
    """Where the kernel's tensors live: cpu for simulator exports, else the device the exporting
    backend declared (`Capabilities.rpc_device`: cpu, cuda), which torch names alike."""
    return "cpu" if kernel._sim is not None else device_kind(kernel.manifest)


def _to_tvm(t: torch.Tensor):
    """Zero-copy DLPack view; a contiguous view at an unaligned offset is copied once (TVM needs 64 B)."""
    import tvm
    if t.data_ptr() % ALIGN:
        t = t.clone()
    return tvm.runtime.from_dlpack(t.detach())


def register(kernel: ExportedKernel | str):
    """Register `torch.ops.opcompiler.<name>` for an export folder (or loaded kernel); returns the op.

    Registering the same export twice returns the first op; a different export under a name
    already taken raises (export it again with `--name`)."""
    if not isinstance(kernel, ExportedKernel):
        kernel = load(kernel)
    name, ident = kernel.name, _identity(kernel)
    if name in _REGISTRY:
        prev_ident, prev_op = _REGISTRY[name]
        if prev_ident != ident:
            raise KernelInputError(f"torch.ops.opcompiler.{name} is already registered by another export "
                                   f"(different shape, target or config); export this one with --name NEW_NAME")
        return prev_op
    out_shape = tuple(kernel.output["shape"])
    out_dtype = _TORCH_DTYPES[kernel.output["dtype"]]
    schema = "(" + ", ".join(f"Tensor {s['name']}" for s in kernel.inputs) + ") -> Tensor"

    want = [(torch.Size(s["shape"]), _TORCH_DTYPES[s["dtype"]]) for s in kernel.inputs]
    dev = _device(kernel)

    def impl(*args: torch.Tensor) -> torch.Tensor:
        if not all(a.shape == shp and a.dtype == dt and a.device.type == dev and a.is_contiguous()
                   for a, (shp, dt) in zip(args, want)):
            _check(kernel, args, strides=True)  # the slow path names what is wrong
        if kernel._fn is None:  # simulator program: runs on numpy through the simulator backend
            return torch.from_numpy(np.ascontiguousarray(kernel(*[a.detach().numpy() for a in args])))
        out = torch.empty(out_shape, dtype=out_dtype, device=args[0].device)
        kernel._fn(*[_to_tvm(a) for a in args], _to_tvm(out))
        return out

    def fake(*args: torch.Tensor) -> torch.Tensor:
        _check(kernel, args, strides=False)  # shape inference fails with the same message as a real call
        return args[0].new_empty(out_shape, dtype=out_dtype)

    op = torch.library.custom_op(f"opcompiler::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    _register_onnx(kernel, out_shape, out_dtype)
    _REGISTRY[name] = (ident, op)
    return op


def _register_onnx(kernel: ExportedKernel, out_shape: tuple[int, ...], out_dtype: torch.dtype) -> None:
    """`torch.onnx.export(..., dynamo=False, custom_opsets={"opcompiler": 1})` of a model using the op
    emits the same `opcompiler::<op>` node as the folder's model.onnx (run it with opc_onnx.Runner)."""
    register = getattr(torch.onnx, "register_custom_op_symbolic", None)
    if register is None:  # a torch without the TorchScript exporter
        return
    m = kernel.manifest

    def symbolic(g, *args):
        out = g.op(f"opcompiler::{m['op']}", *args, kernel_s=kernel.name, target_s=m["target"]["name"])
        out.setType(args[0].type().with_dtype(out_dtype).with_sizes(list(out_shape)))
        return out

    register(f"opcompiler::{kernel.name}", symbolic, 1)


class OpcModule(nn.Module):
    """Any exported op as an nn.Module: forward(*inputs) calls torch.ops.opcompiler.<name>."""

    def __init__(self, folder_or_kernel: ExportedKernel | str):
        super().__init__()
        kernel = folder_or_kernel if isinstance(folder_or_kernel, ExportedKernel) else load(folder_or_kernel)
        self.kernel_name = kernel.name
        self._op = register(kernel)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self._op(*inputs)


class OpcConvBnReLU(nn.Module):
    """Drop-in for `nn.Conv2d(c, k, (r, s), stride, padding, dilation, groups, bias)` followed by
    `nn.BatchNorm2d(k, eps)` in eval mode and `nn.ReLU`, running one fused exported kernel.
    Takes NCHW tensors like nn.Conv2d; for an NHWC export, in channels_last memory format.

    Holds the same parameters under `conv` and `bn` (so `from_modules` or a state dict moves
    weights over); BN (and a conv bias) fold into the kernel's per-channel scale and shift."""

    def __init__(self, folder_or_kernel: ExportedKernel | str, bias: bool = False, eps: float = 1e-5):
        super().__init__()
        kernel = folder_or_kernel if isinstance(folder_or_kernel, ExportedKernel) else load(folder_or_kernel)
        m = kernel.manifest
        if m["op"] != "conv2d_bn_relu":
            raise KernelInputError(f"OpcConvBnReLU: expected an export of op conv2d_bn_relu, got {m['op']}")
        p = m["params"]
        # NHWC kernels take channels_last tensors: the NHWC view of those is free (no copy)
        self.channels_last = p["layout"] == "NHWC"
        self.kernel_name = kernel.name
        self.input_shape = tuple(m["inputs"][0]["shape"])
        self._op = register(kernel)
        dt = _TORCH_DTYPES[m["dtype"]]
        self.conv = nn.Conv2d(p["c"], p["k"], (p["r"], p["s"]), stride=p["stride"], padding=p["pad"],
                              dilation=p["dilation"], groups=p["groups"], bias=bias, dtype=dt)
        self.bn = nn.BatchNorm2d(p["k"], eps=eps, dtype=dt)
        self.relu = nn.ReLU()
        self.eval()

    @classmethod
    def from_modules(cls, folder_or_kernel: ExportedKernel | str, conv: nn.Conv2d, bn: nn.BatchNorm2d
                     ) -> OpcConvBnReLU:
        """Replace trained `conv` + `bn` (+ ReLU): checks their hyperparameters against the kernel."""
        mod = cls(folder_or_kernel, bias=conv.bias is not None, eps=bn.eps)
        for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"):
            want, got = getattr(mod.conv, attr), getattr(conv, attr)
            if want != got:
                raise KernelInputError(f"{mod.kernel_name}: conv.{attr}: expected {want}, got {got}")
        if bn.num_features != mod.bn.num_features:
            raise KernelInputError(f"{mod.kernel_name}: bn.num_features: expected {mod.bn.num_features}, "
                                   f"got {bn.num_features}")
        mod.conv.load_state_dict(conv.state_dict())
        mod.bn.load_state_dict(bn.state_dict())
        return mod

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """BN running statistics (and the conv bias) as the kernel's (scale, shift)."""
        bn = self.bn
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        shift = bn.bias - bn.running_mean * scale
        if self.conv.bias is not None:
            shift = shift + self.conv.bias * scale
        return scale.detach().contiguous(), shift.detach().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError(f"{self.kernel_name}: the fused kernel implements inference batch norm; "
                               "call .eval() (training-mode BN uses batch statistics)")
        scale, shift = self.folded()
        if not self.channels_last:
            return self._op(x, self.conv.weight.detach(), scale, shift)
        if x.dim() == 4 and x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last):
            raise KernelInputError(f"{self.kernel_name}: input x: expected a channels_last tensor (the kernel "
                                   f"is NHWC), got a contiguous NCHW one; use x.to(memory_format=torch.channels_last)")
        w = self.conv.weight.detach().permute(2, 3, 1, 0).contiguous()  # OIHW -> HWIO (small; copied per call)
        y = self._op(x.permute(0, 2, 3, 1), w, scale, shift)
        return y.permute(0, 3, 1, 2)  # logical NCHW in channels_last memory, as torch returns for such input
