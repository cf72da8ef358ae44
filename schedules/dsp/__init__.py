"""Templates for the FT-M7032 DSP simulator (dsp-sim): direct convolution, fully connected
layers and element-wise ops (fused BN+ReLU), after seed 004. Every module is imported here."""
from . import conv2d, elemwise, matmul  # noqa: F401
