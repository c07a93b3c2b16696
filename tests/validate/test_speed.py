"""The project's one ratio method: interleaved pairs, median of per-pair ratios."""

from __future__ import annotations

import time

from cosycompile.validate.speed import paired_ratio


def _recorder(calls: list[str], name: str, seconds: float):
    def run() -> None:
        calls.append(name)
        time.sleep(seconds)
    return run


def test_pairs_interleave_and_alternate_their_order() -> None:
    calls: list[str] = []
    r = paired_ratio(_recorder(calls, "ref", 0.0), _recorder(calls, "cand", 0.0), pairs=4, warmup=1)
    assert r.pairs == 4 and len(r.ratios) == 4
    # warm-up pair, then ABBAABBA: neither side always runs second, on the warmer cache
    assert calls == ["ref", "cand", "ref", "cand", "cand", "ref", "ref", "cand", "cand", "ref"]


def test_min_seconds_spreads_pairs_over_a_window() -> None:
    calls: list[str] = []
    t0 = time.perf_counter()
    r = paired_ratio(_recorder(calls, "ref", 0.01), _recorder(calls, "cand", 0.005), pairs=2, warmup=0,
                     min_seconds=0.3)
    assert time.perf_counter() - t0 >= 0.3
    assert r.pairs > 2 and calls.count("ref") == calls.count("cand") == r.pairs
    assert r.ratio > 1  # the reference sleeps twice as long


def test_max_pairs_caps_the_window() -> None:
    r = paired_ratio(lambda: None, lambda: None, pairs=1, warmup=0, min_seconds=60, max_pairs=7)
    assert r.pairs == 7


def test_a_probe_runs_around_each_timed_run_and_outside_the_timing() -> None:
    calls: list[str] = []
    seen: list[int] = []

    def probe() -> int:
        calls.append("probe")
        time.sleep(0.02)  # would swamp both sides' times if it were inside them
        seen.append(len(seen))
        return seen[-1]

    r = paired_ratio(_recorder(calls, "ref", 0.002), _recorder(calls, "cand", 0.001), pairs=3, warmup=1, probe=probe)
    assert r.probes == [0, 1, 2, 3, 4, 5, 6]
    assert calls == ["ref", "cand", "probe", "ref", "probe", "cand", "probe", "cand", "probe", "ref",
                     "probe", "ref", "probe", "cand", "probe"]
    assert r.reference_s < 0.02 and r.candidate_s < 0.02
    assert [a / b for a, b in zip(r.reference_times, r.candidate_times)] == r.ratios
    assert paired_ratio(lambda: None, lambda: None, pairs=2, warmup=0).probes == []
