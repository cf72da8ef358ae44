"""Wall-clock timing shared by the benchmark scripts."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def bench(fn: Callable[[], object], repeat: int = 7, min_time: float = 0.05) -> float:
    """Median seconds per call: warm up, then repeat batches long enough to time reliably."""
    fn()
    t = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t, 1e-6)
    number = max(1, int(min_time / once))
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs)
