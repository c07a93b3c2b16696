"""How long the VM stays in one state: probe it back to back for a while and print its spells.

``cosycompile.validate.machine_state`` sorts each timed pair by the state the probe saw. That
only means something for pairs shorter than the state's spells: a pair that straddles a switch
mixes both. This script runs ``builtin_models.machine_probes`` (small op on one thread and on
``--threads``, 256 MiB copy, 1024^2 matmul on one thread and on ``--threads``) every
``--interval`` seconds for ``--minutes`` and reports each state's share of the time, the lengths
of its spells (a spell: consecutive probes in one state), and per state the spread of the copy
throughput and of the matmul's thread scaling (does a third state hide inside one of the two?).

Usage: python bench/machine_timeline.py [--minutes 10] [--interval 0.5] [--threads 2]
Writes artifacts/bench/machine_timeline.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from builtin_models import machine, machine_probes

REPO = Path(__file__).resolve().parents[1]


def spells(t: list[float], lose: list[float]) -> dict[str, list[float]]:
    """Seconds of each run of consecutive probes in one state, per state. A spell lasts from its
    first probe to the first probe of the next spell (the last one: to its own last probe)."""
    out: dict[str, list[float]] = {"threads_win": [], "threads_lose": []}
    start = 0
    for i in range(1, len(lose) + 1):
        if i == len(lose) or lose[i] != lose[start]:
            end = t[i] if i < len(lose) else t[i - 1]
            out["threads_lose" if lose[start] else "threads_win"].append(end - t[start])
            start = i
    return out


def summarize(samples: list[dict[str, float]], threads: int) -> dict[str, Any]:
    """Share of probes, spell lengths (median, quartiles, longest) and probe spreads per state."""
    t = [s["t"] for s in samples]
    lose = [s["threads_lose"] for s in samples]
    out: dict[str, Any] = {"probes": len(samples), "seconds": t[-1] - t[0] if t else 0.0,
                           "switches": int(sum(a != b for a, b in zip(lose, lose[1:])))}
    for state, lengths in spells(t, lose).items():
        mine = [s for s in samples if bool(s["threads_lose"]) == (state == "threads_lose")]
        if not mine:
            continue
        scaling = [s[f"matmul_{threads}_threads_ms"] / s["matmul_1_thread_ms"] for s in mine]
        copy = [s["copy_gb_per_s"] for s in mine]
        out[state] = {"share": len(mine) / len(samples), "spells": len(lengths),
                      "spell_s": {"median": float(np.median(lengths)), "p25": float(np.percentile(lengths, 25)),
                                  "p75": float(np.percentile(lengths, 75)), "longest": float(max(lengths))},
                      "copy_gb_per_s": {"median": float(np.median(copy)), "min": float(min(copy)), "max": float(max(copy))},
                      "matmul_threads_over_1": {"median": float(np.median(scaling)), "min": float(min(scaling)),
                                                "max": float(max(scaling))}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to probe (10)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds from one probe's start to the next (0.5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", type=Path, default=REPO / "artifacts" / "bench")
    args = ap.parse_args()
    if args.minutes <= 0 or args.interval < 0 or args.threads < 1:
        ap.error("--minutes must be > 0, --interval >= 0 and --threads >= 1")
    import torch

    a = torch.randn(1024, 1024)
    samples: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60 * args.minutes:
        tick = time.perf_counter()
        samples.append({"t": tick - t0, **machine_probes(torch, args.threads, a)})
        time.sleep(max(0.0, args.interval - (time.perf_counter() - tick)))
    summary = summarize(samples, args.threads)
    args.results.mkdir(parents=True, exist_ok=True)
    out = {"machine": machine(), "threads": args.threads, "interval_s": args.interval, "summary": summary,
           "samples": samples}
    (args.results / "machine_timeline.json").write_text(json.dumps(out, indent=1))
    print(f"{summary['probes']} probes over {summary['seconds']:.0f} s, {summary['switches']} switches of state")
    print("| state | share | spells | spell s: median (p25-p75), longest | copy GB/s | matmul, threads / 1 thread |")
    print("|---|---|---|---|---|---|")
    for state in ("threads_win", "threads_lose"):
        s = summary.get(state)
        if s:
            sp, c, m = s["spell_s"], s["copy_gb_per_s"], s["matmul_threads_over_1"]
            print(f"| {state} | {100 * s['share']:.0f} % | {s['spells']} | {sp['median']:.1f} ({sp['p25']:.1f}-"
                  f"{sp['p75']:.1f}), {sp['longest']:.0f} | {c['median']:.0f} ({c['min']:.0f}-{c['max']:.0f}) | "
                  f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
