"""Templates for the FT-M7032 DSP simulator (dsp-sim): direct convolution, fully connected
layers and element-wise ops (fused BN+ReLU), after seed 004; pooling, grouped / depthwise
convolution, element-wise chains, concat, softmax and reductions as vector instruction streams
(`stream.py`). Every module is imported here."""
from . import conv2d, elemwise, matmul, pool, reduce  # noqa: F401
from . import batch_matmul  # noqa: F401
from . import norm  # noqa: F401  (layer_norm, add_layer_norm)
from . import attention  # noqa: F401  (flash attention)
from . import gather  # noqa: F401  (embedding lookup: a row DMA per index)
from . import recurrent  # noqa: F401  (lstm, gru: the fused persistent cell)
from . import fm  # noqa: F401  (fm_interaction: DeepFM's pairwise term)
