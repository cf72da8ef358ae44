"""CUDA templates: fp16 on tensor cores (WMMA 16x16x16), fp32 on CUDA cores, fused epilogues."""
from . import templates  # noqa: F401
