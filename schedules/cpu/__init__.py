"""CPU templates: tiled, vectorized for the host's SIMD width, parallel over the cores."""
from . import conv2d, elemwise, matmul  # noqa: F401
from . import softmax  # noqa: F401  (graph import: ONNX Softmax)
from . import attention  # noqa: F401
