"""Timing helpers shared by every check: interleaved pairs for ratios, median/p90 for latencies.

On a shared machine the load drifts between two sequential medians; timing reference and
candidate alternately (ABAB...) and taking the median of per-pair ratios cancels most of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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


@dataclass
class PairedRatio:
    """reference time / candidate time over interleaved pairs."""

    ratio: float  # median of per-pair ratios (> 1: the candidate is faster)
    spread: tuple[float, float]  # min and max per-pair ratio
    pairs: int
    reference_s: float  # median reference time
    candidate_s: float  # median candidate time
    ratios: list[float]
    # What ``probe`` said before each timed run and after the last: pair i's two runs sit between
    # probes[2i], probes[2i+1] and probes[2i+2] (2 * pairs + 1 of them; none without a probe).
    probes: list[Any] = field(default_factory=list)
    reference_times: list[float] = field(default_factory=list)  # each pair's, in order
    candidate_times: list[float] = field(default_factory=list)


def paired_ratio(reference: Callable[[], Any], candidate: Callable[[], Any], pairs: int = 5,
                 warmup: int = 1, min_seconds: float = 0.0, max_pairs: int = 100,
                 probe: Callable[[], Any] | None = None) -> PairedRatio:
    """Time ``reference`` and ``candidate`` alternately, ``pairs`` times each after ``warmup`` of each;
    the order inside a pair alternates too, so neither always runs on a warmer cache.

    With ``min_seconds``, pairs go on (up to ``max_pairs``) until that much time has passed: on a
    shared machine a slow spell slows a memory-bound side more than a compute-bound one, and three pairs
    inside one spell set the median. A window outvotes spells shorter than itself; spells of minutes
    (the FP32 ONNX Runtime LLM step, docs/bench-log/2026-11-25-zen5-whole-make-bench-windows.md) still
    move the ratio.

    ``probe``, called untimed before each timed run and once after the last, records the machine's
    state around each run (a benchmark can then give the ratio per state: a 2-vCPU VM switches between
    states that move some ratios, within seconds, so a long pair may straddle a switch and only the
    probes on both sides of each of its runs tell).
    """
    for _ in range(warmup):
        reference()
        candidate()
    ref_t: list[float] = []
    cand_t: list[float] = []
    probes: list[Any] = []
    start = time.perf_counter()
    i = 0
    while i < max(pairs, 1) or (time.perf_counter() - start < min_seconds and i < max_pairs):
        order = ((reference, ref_t), (candidate, cand_t)) if i % 2 == 0 else ((candidate, cand_t), (reference, ref_t))
        for fn, sink in order:
            if probe is not None:
                probes.append(probe())
            t0 = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - t0)
        i += 1
    if probe is not None:
        probes.append(probe())
    ratios = [r / c if c > 0 else float("inf") for r, c in zip(ref_t, cand_t)]
    return PairedRatio(float(np.median(ratios)), (float(min(ratios)), float(max(ratios))), len(ratios),
                       float(np.median(ref_t)), float(np.median(cand_t)), ratios, probes, ref_t, cand_t)
