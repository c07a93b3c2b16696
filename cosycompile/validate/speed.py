"""Timing helper shared by every check: warm up, then median and p90 of wall time."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


def timed(fn: Callable[[], Any], warmup: int = 1, runs: int = 3) -> tuple[float, float]:
    """(median, p90) wall seconds of ``fn()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.percentile(times, 90))
