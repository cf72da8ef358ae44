"""Ascend (DaVinci AI Core) schedule templates: cube templates in 16-aligned fractals and
vector templates tiled through UB. Each module is imported here explicitly."""
from . import conv2d, elemwise, matmul, pool, reduce  # noqa: F401
from . import batch_matmul  # noqa: F401
from . import attention  # noqa: F401
from . import norm  # noqa: F401  (layer_norm, add_layer_norm)
from . import gather  # noqa: F401  (embedding lookup: indirect row DMAs)
from . import recurrent  # noqa: F401  (lstm: the fused persistent cell)
from . import fm  # noqa: F401  (fm_interaction: DeepFM's pairwise term)
