"""A ratio per state of the VM: the probe that tells the states apart, and the split of the pairs."""

from __future__ import annotations

import time

import numpy as np
import torch

from cosycompile.validate.machine_state import by_state, probe, ratio_by_state, small_op_us
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
    ref = [2.0, 4.0, 3.0, 9.0, 6.0]
    cand = [1.0, 1.0, 1.0, 3.0, 3.0]
    lose = [0, 0, 0, 1, 1]
    out = by_state(ref, cand, lose)
    assert out["threads_win"] == {"pairs": 3, "reference_s": 3.0, "built_s": 1.0, "speedup": 3.0}
    assert out["threads_lose"] == {"pairs": 2, "reference_s": 7.5, "built_s": 3.0, "speedup": 2.5}
    only = by_state(ref, cand, [0] * 5)
    assert set(only) == {"threads_win"} and only["threads_win"]["speedup"] == float(np.median(np.divide(ref, cand)))


def test_ratio_by_state_from_paired_ratio() -> None:
    # A probe that says "lose" every other pair, with a candidate that is slower in that state.
    state = {"n": 0}

    def alternate() -> dict[str, float]:
        state["n"] += 1
        return {"copy_gb_per_s": 10.0 * (state["n"] % 2 + 1), "threads_lose": float(state["n"] % 2 == 0)}

    def candidate() -> None:
        time.sleep(0.004 if state["n"] % 2 == 0 else 0.001)

    r = paired_ratio(lambda: time.sleep(0.004), candidate, pairs=6, warmup=0, probe=alternate)
    rows = ratio_by_state(r)
    assert rows["threads_win"]["pairs"] == rows["threads_lose"]["pairs"] == 3
    assert rows["threads_win"]["copy_gb_per_s"] == 20.0 and rows["threads_lose"]["copy_gb_per_s"] == 10.0
    assert rows["threads_win"]["speedup"] > 2 > rows["threads_lose"]["speedup"]
    assert min(rows["threads_win"]["speedup"], rows["threads_lose"]["speedup"]) <= r.ratio
