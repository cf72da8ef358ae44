"""Whole ONNX graphs: import, partition into fusion patterns, compile, run, compare.

    >>> from opcompiler import graph
    >>> g = graph.load("resnet_block.onnx", batch=1)          # onnx -> graph IR, constants folded
    >>> p = graph.plan(g, "ascend-sim")                      # fused plan (fused=False: op by op)
    >>> print(graph.format_plan(p))                          # which nodes went into which kernel
    >>> r = graph.run(p)                                     # compile (best record or default), run, check
    >>> r.correct, r.totals()["cycles"]
    >>> c = graph.compare(g, "ascend-sim")                   # fused vs unfused side by side
    >>> print(graph.format_compare(c)); graph.plot_compare(c, "resnet_block.png")
"""
from __future__ import annotations

from .compare import Comparison, compare, format_compare
from .executor import GRAPH_TOLERANCE, GraphRun, KernelReport, run_plan
from .importer import Graph, load
from .plan import Plan, format_plan, make_plan
from .plot import plot_compare

plan = make_plan
run = run_plan

__all__ = ["load", "plan", "make_plan", "run", "run_plan", "compare", "format_plan", "format_compare",
           "plot_compare", "Graph", "Plan", "GraphRun", "KernelReport", "Comparison", "GRAPH_TOLERANCE"]
