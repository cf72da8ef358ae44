"""CPU templates: tiled, vectorized for the host's SIMD width, parallel over the cores."""
from . import conv2d, elemwise, matmul  # noqa: F401
from . import softmax  # noqa: F401  (graph import: ONNX Softmax)
from . import batch_matmul  # noqa: F401
from . import attention  # noqa: F401
from . import norm  # noqa: F401  (layer_norm, add_layer_norm)
from . import gather  # noqa: F401  (embedding lookup)
from . import recurrent  # noqa: F401  (lstm)
from . import fm  # noqa: F401  (fm_interaction)
