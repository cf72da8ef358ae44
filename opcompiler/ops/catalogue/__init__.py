"""The built-in ops, one module per family; importing this package registers them all (once).

    common.py       dtype sets, placeholders, the element-wise shape, per-channel broadcasts
    conv.py         conv2d and its fusions                     conv_out_hw, conv_out_shape
    matmul.py       matmul and its fusions
    elementwise.py  the step chains: relu, add, bias_add, batch_norm, bn_relu, add_relu,
                    ew_chain, hardswish (their steps: `opcompiler.ops.steps`)
    movement.py     concat, pad, transpose, slice              transpose_dims, slice_geometry
    pool.py         pool2d                                     pool_out_hw
    reduce.py       reduce_sum / max / mean, softmax
    norm.py         layer_norm, add_layer_norm (SkipLayerNorm)
    batched.py      batch_matmul
    attention.py    attention (softmax(Q K^T * scale + mask) V)
    recurrent.py    lstm (one ONNX LSTM layer, a fused persistent cell on ascend-sim)
    gather.py       gather (embedding lookup: rows of a table by runtime int indices; EmbeddingBag's sums)
    fm.py           fm_interaction (DeepFM's pairwise term: one fused reduction chain over the fields)

The geometry helpers in the right-hand column are public: schedules import them from here.
After adding or changing an op, run `python -m opcompiler.ops.make_index` (the TVM-free index
the CLI answers from; it hashes this folder). See docs/adding_an_operator.md.
"""
from __future__ import annotations

from . import conv, matmul, elementwise, movement, pool, reduce  # noqa: F401  (registration order: fusions' order)
from . import batched  # noqa: F401  (batch_matmul)
from . import attention  # noqa: F401
from . import norm  # noqa: F401  (layer_norm, add_layer_norm)
from . import recurrent  # noqa: F401  (lstm)
from . import gather  # noqa: F401  (gather: embedding lookup)
from . import fm  # noqa: F401  (fm_interaction)
from .conv import CONV_DEFAULTS, conv_out_hw, conv_out_shape
from .elementwise import chain_op
from .movement import slice_geometry, transpose_dims
from .pool import pool_out_hw

__all__ = ["CONV_DEFAULTS", "chain_op", "conv_out_hw", "conv_out_shape", "pool_out_hw", "slice_geometry",
           "transpose_dims"]
