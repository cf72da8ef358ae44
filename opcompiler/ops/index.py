"""The built-in ops' names, families, summaries, shape defaults (in the op's own key order),
preset kinds and dtypes, without importing TVM. The CLI checks an op name, `--shape` keys,
`--preset` and `--dtype` against this before it loads the catalogue (whose computes import TVM:
seconds), so a typo is answered at once, and `opcompiler ops` lists it.

It is generated from the catalogue (`python -m opcompiler.ops.make_index` rewrites the part between
the markers) and carries the SHA-256 of the catalogue's files (`catalogue/*.py`) it was made from:
when one has changed since (`current()` is False), every user of the index falls back to the catalogue
itself, so a stale index only ever costs time, never an answer. `tests/foundation/test_cli_fast.py`
checks that it is current."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple


class OpInfo(NamedTuple):
    family: str
    summary: str
    defaults: dict[str, Any]
    preset_kind: str
    dtypes: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.defaults)


_CONV = {"n": 1, "c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3, "stride": 1, "pad": 1, "dilation": 1,
         "groups": 1, "layout": "NCHW"}
_EW = {"n": 1, "c": 64, "h": 56, "w": 56, "layout": "NCHW"}
_MM = {"m": 16, "k": 256, "n": 1024, "trans_a": 0, "trans_b": 0}
_F = ("float32", "float16")
_C = ("float32", "float16", "int8")

# BEGIN GENERATED
CATALOGUE_SHA256 = 'b7a24b714b84f49debb6eb32175cc24f893249530b32bf5619c1e21771e3c342'
OPS: dict[str, OpInfo] = {
    'add': OpInfo('elemwise', 'element-wise add (vadd)',
        _EW, '', _F),
    'add_layer_norm': OpInfo('norm', 'residual add then layer normalisation, y = LN(x + r), one kernel (onnxruntime SkipLayerNormalization)',
        {'rows': 128, 'cols': 768, 'eps': '1e-5'}, '', _F),
    'add_relu': OpInfo('elemwise', "fused add + ReLU with broadcasting (seed 002's fuse_add_relu)",
        {'n': 1, 'c': 64, 'h': 56, 'w': 56, 'layout': 'NCHW', 'bcast': 0}, '', _F),
    'attention': OpInfo('attention', 'softmax(Q K^T * scale + mask) V in one kernel (b, h, sq, skv, d, causal, mask)',
        {'b': 1, 'h': 8, 'sq': 512, 'skv': 512, 'd': 64, 'causal': 0, 'mask': 0, 'scale': 'auto', 'layout': 'bhsd'}, '', ('float16', 'float32')),
    'batch_matmul': OpInfo('batch_matmul', 'C[b] = A[b] @ B[b] over a batch (transpose flags; bcast_b: one B for every batch)',
        {'b': 16, 'm': 128, 'k': 64, 'n': 128, 'trans_a': 0, 'trans_b': 0, 'bcast_b': 0}, 'matmul', _C),
    'batch_norm': OpInfo('elemwise', 'inference batch norm: x * scale[c] + shift[c]',
        _EW, '', _F),
    'bias_add': OpInfo('elemwise', 'add a per-channel bias',
        _EW, '', _F),
    'bn_relu': OpInfo('elemwise', 'fused batch norm + ReLU (one kernel)',
        _EW, '', _F),
    'concat': OpInfo('elemwise', 'concatenate two NCHW tensors along channels (c then c1)',
        {'n': 1, 'c': 32, 'c1': 32, 'h': 28, 'w': 28, 'layout': 'NCHW'}, '', _F),
    'conv2d': OpInfo('conv2d', '2-D convolution (NCHW/OIHW or NHWC/HWIO; stride, pad, dilation, groups)',
        _CONV, 'conv', _C),
    'conv2d_bias': OpInfo('conv2d', 'fused conv2d + bias, no activation (one kernel)',
        _CONV, 'conv', _C),
    'conv2d_bias_add': OpInfo('conv2d', 'fused conv2d + bias + residual add (one kernel; the residual read in the epilogue)',
        _CONV, 'conv', _F),
    'conv2d_bias_add_relu': OpInfo('conv2d', 'fused conv2d + bias + residual add + ReLU (one kernel; the residual read in the epilogue)',
        _CONV, 'conv', _F),
    'conv2d_bias_hardswish': OpInfo('conv2d', 'fused conv2d + bias + HardSwish (one kernel; MobileNetV3)',
        _CONV, 'conv', _F),
    'conv2d_bias_relu': OpInfo('conv2d', 'fused conv2d + bias + ReLU (one kernel)',
        _CONV, 'conv', _C),
    'conv2d_bn': OpInfo('conv2d', 'fused conv2d + batch norm (inference), no activation (one kernel)',
        _CONV, 'conv', _F),
    'conv2d_bn_add_relu': OpInfo('conv2d', 'fused conv2d + batch norm + residual add + ReLU (one kernel; the residual read in the epilogue)',
        _CONV, 'conv', _F),
    'conv2d_bn_relu': OpInfo('conv2d', 'fused conv2d + batch norm (inference) + ReLU (one kernel)',
        _CONV, 'conv', _F),
    'ew_chain': OpInfo('elemwise', "element-wise chain in one kernel: chain='bn;relu', 'sigmoid', 'mul;clip:0:6', ...",
        {'n': 1, 'c': 64, 'h': 56, 'w': 56, 'layout': 'NCHW', 'chain': 'sigmoid'}, '', _F),
    'fm_interaction': OpInfo('fm', "factorization machine's pairwise term over the field axis of e (b, f, k): (sum_f e)^2 - sum_f e^2 -> (b, k), one fused reduction chain (DeepFM)",
        {'b': 256, 'f': 26, 'k': 16}, '', _F),
    'gather': OpInfo('gather', 'embedding lookup: rows of a table (rows, cols) by runtime int indices (n,) (+ per-field offsets; summed in bags of `bag` rows: EmbeddingBag)',
        {'rows': 1000, 'cols': 64, 'n': 128, 'idx': 'int64', 'fields': 0, 'bag': 1}, '', _F),
    'gru': OpInfo('recurrent', 'one GRU layer, ONNX semantics, one direction (t, b, i, h, reverse, lbr): Y = every h_t',
        {'t': 100, 'b': 64, 'i': 512, 'h': 512, 'reverse': 0, 'lbr': 1}, '', ('float16', 'float32')),
    'hardswish': OpInfo('elemwise', 'HardSwish: x * relu6(x + 3) / 6 (MobileNetV3), one kernel',
        _EW, '', _F),
    'layer_norm': OpInfo('norm', 'layer normalisation over the last axis of a (rows, cols) tensor, statistics in fp32',
        {'rows': 128, 'cols': 768, 'eps': '1e-5'}, '', _F),
    'lstm': OpInfo('recurrent', 'one LSTM layer, ONNX semantics, one direction (t, b, i, h, reverse): Y = every h_t',
        {'t': 100, 'b': 64, 'i': 512, 'h': 512, 'reverse': 0}, '', ('float16', 'float32')),
    'matmul': OpInfo('matmul', 'C = A @ B (transpose flags; fully connected)',
        _MM, 'matmul', _C),
    'matmul_bias': OpInfo('matmul', 'fused matmul + bias, no activation (fully connected layer)',
        _MM, 'matmul', _C),
    'matmul_bias_relu': OpInfo('matmul', 'fused matmul + bias + ReLU (fully connected layer)',
        _MM, 'matmul', _C),
    'pad': OpInfo('elemwise', 'explicit spatial padding (pt, pl, pb, pr; fill zero|lowest)',
        {'n': 1, 'c': 64, 'h': 56, 'w': 56, 'pt': 0, 'pl': 0, 'pb': 1, 'pr': 1, 'fill': 'zero', 'layout': 'NCHW'}, '', _F),
    'pool2d': OpInfo('pool', 'max or average pooling (mode=max|avg)',
        {'n': 1, 'c': 64, 'h': 112, 'w': 112, 'kernel': 3, 'stride': 2, 'pad': 1, 'mode': 'max', 'layout': 'NCHW'}, '', _F),
    'reduce_max': OpInfo('reduce', 'max over the last axis of an (m, n) tensor',
        {'m': 1024, 'n': 1024}, '', _F),
    'reduce_mean': OpInfo('reduce', 'mean over the last axis of an (m, n) tensor (global average pooling as a row reduction: the sum, then one multiply by 1/n)',
        {'m': 1024, 'n': 1024}, '', _F),
    'reduce_sum': OpInfo('reduce', 'sum over the last axis of an (m, n) tensor',
        {'m': 1024, 'n': 1024}, '', _F),
    'relu': OpInfo('elemwise', 'ReLU (vrelu)',
        _EW, '', _F),
    'slice': OpInfo('elemwise', 'a contiguous range along one axis (dims=AxBxC..., axis, start, end): a data movement',
        {'dims': '1x8x4x4', 'axis': 1, 'start': 0, 'end': 4}, '', _F),
    'softmax': OpInfo('softmax', 'softmax over the last axis of an (m, n) tensor',
        {'m': 16, 'n': 1000}, '', _F),
    'transpose': OpInfo('elemwise', 'permute the axes of a tensor (dims=AxBxC..., perm=digits): a data movement',
        {'dims': '1x2x4x8x8', 'perm': '02134'}, '', _F),
}
# END GENERATED


def catalogue_digest() -> str:
    """The SHA-256 of the catalogue's source files (`catalogue/*.py`, by name, with their names)."""
    h = hashlib.sha256()
    for p in sorted((Path(__file__).parent / "catalogue").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def current() -> bool:
    """Whether the index was generated from the catalogue as it is now."""
    try:
        return catalogue_digest() == CATALOGUE_SHA256
    except OSError:
        return False
