"""A ratio per state of the VM: the probe that tells the states apart, and the split of the pairs."""

from __future__ import annotations

import time

import numpy as np
import torch

import pytest

from cosycompile.validate.machine_state import by_state, pair_states, probe, ratio_by_state, small_op_us
from cosycompile.validate.speed import paired_ratio


def test_probe_measures_this_machine_and_puts_the_thread_count_back() -> None:
    was = torch.get_num_threads()
    p = probe(2)
    assert torch.get_num_threads() == was
    assert set(p) == {"copy_gb_per_s", "small_op_1_thread_us", "small_op_2_threads_us", "threads_lose"}
    assert p["copy_gb_per_s"] > 0.1 and 0 < p["small_op_1_thread_us"] < 10_000
    assert p["threads_lose"] == float(p["small_op_2_threads_us"] > p["small_op_1_thread_us"])
    # One thread hands nothing over, so it is never the losing state (not a coin toss of noise).
    assert probe(1)["threads_lose"] == 0.0


def test_small_op_cost_grows_with_the_work() -> None:
    assert small_op_us(1, ops=400) > 0
    t0 = time.perf_counter()
    small_op_us(1, ops=400)
    short = time.perf_counter() - t0
    t0 = time.perf_counter()
    small_op_us(1, ops=4000)
    assert time.perf_counter() - t0 > short  # three tries of 4000 adds take longer than of 400


def test_by_state_splits_pairs_and_takes_medians_per_state() -> None:
    ref = [2.0, 4.0, 3.0, 9.0, 6.0, 5.0]
    cand = [1.0, 1.0, 1.0, 3.0, 3.0, 1.0]
    # One probe before each pair and one after the last: pairs 0-1 in the win state, 3-4 in the lose
    # state, pairs 2 and 5 straddle a switch.
    lose = [0, 0, 0, 1, 1, 1, 0]
    out = by_state(ref, cand, lose)
    assert out["threads_win"] == {"pairs": 2, "reference_s": 3.0, "built_s": 1.0, "speedup": 3.0}
    assert out["threads_lose"] == {"pairs": 2, "reference_s": 7.5, "built_s": 3.0, "speedup": 2.5}
    assert out["state_changed"]["pairs"] == 2
    only = by_state(ref, cand, [0] * 7)
    assert set(only) == {"threads_win"} and only["threads_win"]["speedup"] == float(np.median(np.divide(ref, cand)))


def test_a_pair_counts_for_a_state_only_when_every_probe_around_it_agrees() -> None:
    # Two probes a pair (before each run) and one after the last, as paired_ratio takes them.
    assert pair_states([0, 0, 0, 1, 1], 2) == ["threads_win", "state_changed"]
    assert pair_states([1, 1, 1, 1, 1], 2) == ["threads_lose", "threads_lose"]
    # The switch between a pair's two runs is caught by the probe between them.
    assert pair_states([0, 1, 0], 1) == ["state_changed"]
    with pytest.raises(ValueError, match="do not bracket"):
        pair_states([0, 0], 2)  # the probe after the last pair is missing


def test_ratio_by_state_from_paired_ratio() -> None:
    # A probe that flips between the states every second pair, with a candidate that is slower in
    # the lose state: two probes a pair, so flipping every fourth probe leaves whole pairs in each
    # state and the pairs that straddle a flip apart.
    state = {"n": -1}

    def flipping() -> dict[str, float]:
        state["n"] += 1
        lose = (state["n"] // 4) % 2 == 1
        return {"copy_gb_per_s": 10.0 if lose else 20.0, "threads_lose": float(lose)}

    # Sleeps long against a loaded CI machine's wake-up delay (a few ms under parallel workers, which
    # took 1 ms against 4 ms down to 1.2x): 40 ms against 4 ms stays above 2x with 10 ms late each.
    def candidate() -> None:
        time.sleep(0.04 if (state["n"] // 4) % 2 == 1 else 0.004)

    r = paired_ratio(lambda: time.sleep(0.04), candidate, pairs=8, warmup=0, probe=flipping)
    assert len(r.probes) == 17
    rows = ratio_by_state(r)
    assert {s: rows[s]["pairs"] for s in rows} == {"threads_win": 2, "threads_lose": 2, "state_changed": 4}
    assert rows["threads_win"]["copy_gb_per_s"] == 20.0 and rows["threads_lose"]["copy_gb_per_s"] == 10.0
    assert rows["threads_win"]["speedup"] > 2 > rows["threads_lose"]["speedup"]
