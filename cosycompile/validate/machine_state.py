"""Which of a small VM's two states a timing pair ran in, and a ratio given per state.

On a 2-vCPU VM the host moves between a state where two intra-op threads beat one and a state
where handing work between the vCPUs costs more than the work
(docs/bench-log/2026-11-26-zen5-machine-states.md). Sync-bound engines (the flow's thousands of
small ops) slow down in the second state and bandwidth-bound ones (an FP32 LLM step) speed up, so
a ratio with one side of each kind moves with the share of pairs that fell in each state, while
each state's own ratio reproduces.
A probe around each timed run, cheap enough to sit beside every one, tells the states apart
without a threshold picked by hand: do ``threads`` threads lose to one on a small op? The host
switches state within seconds (bench/machine_timeline.py), so a pair counts for a state only
when the probes before, between and after its two runs agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

STATES = ("threads_win", "threads_lose")
# A pair whose probes disagree: it ran partly in each state, and its ratio belongs to neither.
CHANGED = "state_changed"


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


def _windows(probes: int, pairs: int) -> list[slice]:
    """The probes around each pair: ``probes`` is ``k * pairs + 1`` (``k`` before each pair's runs and
    one after the last), so pair i sits between probes k*i and k*i + k."""
    if pairs < 1 or (probes - 1) % pairs or probes < pairs + 1:
        raise ValueError(f"{probes} probes do not bracket {pairs} pairs (want k * pairs + 1)")
    k = (probes - 1) // pairs
    return [slice(k * i, k * i + k + 1) for i in range(pairs)]


def pair_states(lose: Sequence[Any], pairs: int) -> list[str]:
    """Each pair's state from ``threads_lose`` of the probes around it (``_windows``). A pair whose
    probes all agree gets that state; one whose probes disagree straddled a switch and gets
    ``CHANGED`` (the VM's spells last seconds, so a long pair often does)."""
    out = []
    for w in _windows(len(lose), pairs):
        seen = {bool(x) for x in lose[w]}
        out.append(CHANGED if len(seen) > 1 else STATES[int(seen.pop())])
    return out


def by_state(reference_s: Any, candidate_s: Any, lose: Sequence[Any]) -> dict[str, Any]:
    """Per state that occurred (and ``CHANGED`` for pairs that straddled a switch): pairs, median
    reference and candidate seconds, and the median of per-pair ratios (reference / candidate).
    ``lose``: ``threads_lose`` of the probes around the pairs (``pair_states``)."""
    ref, cand = np.asarray(reference_s, float), np.asarray(candidate_s, float)
    states = np.asarray(pair_states(lose, len(ref)))
    out: dict[str, Any] = {}
    for state in (*STATES, CHANGED):
        mask = states == state
        if mask.any():
            out[state] = {"pairs": int(mask.sum()), "reference_s": float(np.median(ref[mask])),
                          "built_s": float(np.median(cand[mask])),
                          "speedup": float(np.median(ref[mask] / cand[mask]))}
    return out


def ratio_by_state(r: Any) -> dict[str, Any]:
    """``by_state`` of a ``paired_ratio`` result whose probe returned ``probe``'s keys, with the
    median copy throughput of the probes around each state's pairs."""
    lose = [p["threads_lose"] for p in r.probes]
    rows = by_state(r.reference_times, r.candidate_times, lose)
    around = list(zip(pair_states(lose, r.pairs), _windows(len(lose), r.pairs)))
    for name, row in rows.items():
        copy = [p["copy_gb_per_s"] for state, w in around if state == name for p in r.probes[w]]
        row["copy_gb_per_s"] = float(np.median(copy))
    return rows
