"""Which of a small VM's two states a timing pair ran in, and a ratio given per state.

On a 2-vCPU VM the host moves between a state where two intra-op threads beat one and a state
where handing work between the vCPUs costs more than the work (docs/BENCHMARKS.md, "What moves
the first chunk"). Sync-bound engines (the flow's thousands of small ops) slow down in the second
state and bandwidth-bound ones (an FP32 LLM step) speed up, so a ratio with one side of each kind
moves with the share of pairs that fell in each state, while each state's own ratio reproduces.
A probe before each pair, cheap enough to sit beside every timed pair, tells the states apart
without a threshold picked by hand: do ``threads`` threads lose to one on a small op?
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

STATES = ("threads_win", "threads_lose")


def best_of(fn: Callable[[], Any], tries: int = 3) -> float:
    """Fewest wall seconds of ``tries`` calls of ``fn`` (a probe wants the machine's capacity, not its noise)."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_gb_per_s(mib: int = 64, tries: int = 3) -> float:
    """Read + write GB/s of the best of ``tries`` copies of a ``mib`` MiB FP32 buffer (memory)."""
    import torch

    x = torch.ones(mib << 18, dtype=torch.float32)
    y = torch.empty_like(x)
    y.copy_(x)  # the first touch of y's pages is not the copy's cost
    return 2 * x.numel() * 4 / best_of(lambda: y.copy_(x), tries) / 1e9


def small_op_us(threads: int, ops: int = 1000) -> float:
    """Microseconds per in-place add on 64 Ki floats (large enough for torch to split across
    ``threads``): mostly the threads' hand-over, not arithmetic. The thread count is put back."""
    import torch

    small = torch.ones(1 << 16)

    def run() -> None:
        for _ in range(ops):
            small.add_(1.0)

    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return 1e6 * best_of(run) / ops
    finally:
        torch.set_num_threads(was)


def probe(threads: int, copy_mib: int = 64) -> dict[str, float]:
    """The machine's state now (about 0.1 s): copy throughput, the small op on one thread and on
    ``threads``, and ``threads_lose`` (1.0 where ``threads`` were slower than one)."""
    out = {"copy_gb_per_s": copy_gb_per_s(copy_mib), "small_op_1_thread_us": small_op_us(1)}
    out[f"small_op_{threads}_threads_us"] = small_op_us(threads)
    # One thread hands nothing over: every pair then counts as the win state.
    out["threads_lose"] = float(threads > 1 and out[f"small_op_{threads}_threads_us"] > out["small_op_1_thread_us"])
    return out


def by_state(reference_s: Any, candidate_s: Any, lose: Any) -> dict[str, Any]:
    """Per state that occurred: pairs, median reference and candidate seconds, and the median of
    per-pair ratios (reference / candidate). ``lose``: each pair's ``threads_lose``."""
    ref, cand, lost = np.asarray(reference_s, float), np.asarray(candidate_s, float), np.asarray(lose, bool)
    out: dict[str, Any] = {}
    for state, mask in zip(STATES, (~lost, lost)):
        if mask.any():
            out[state] = {"pairs": int(mask.sum()), "reference_s": float(np.median(ref[mask])),
                          "built_s": float(np.median(cand[mask])),
                          "speedup": float(np.median(ref[mask] / cand[mask]))}
    return out


def ratio_by_state(r: Any) -> dict[str, Any]:
    """``by_state`` of a ``paired_ratio`` result whose probe returned ``probe``'s keys, with the
    median copy throughput of each state's pairs."""
    rows = by_state(r.reference_times, r.candidate_times, [p["threads_lose"] for p in r.probes])
    for name, row in rows.items():
        lost = name == "threads_lose"
        row["copy_gb_per_s"] = float(np.median([p["copy_gb_per_s"] for p in r.probes if bool(p["threads_lose"]) == lost]))
    return rows
