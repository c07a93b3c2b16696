"""Compare the speed ratios of two `make bench` runs (issue 11: run twice, agree within 10 %).

`bench/run_all.py` keeps each run's result files under ``artifacts/bench/runs/<stamp>/``. This reads
two such folders, takes every ratio the scripts record (``speedup``, ``speedup_vs_fp32``,
``speedup_vs_eager_fp32``, ``second_over_first``: each a median of interleaved pairs measured in its
own run), and prints them side by side with their relative difference, counting the overall ratios
apart from those given per state of the machine (``by_state``).

Usage: python bench/compare_runs.py RUN_A RUN_B [--tolerance 0.10]
       python bench/compare_runs.py --last-two        (the two newest runs under artifacts/bench/runs)
Exit status 1 when a ratio present in both runs differs by more than the tolerance (ratios of pairs
that straddled a switch of the machine's state are shown but not judged). Runs made on different
machines (the CPU line each result file carries) are refused with exit status 2 unless
``--other-machine`` is given: a ratio is a property of the CPU, and two CPUs disagreeing says nothing
about whether the benchmark reproduces.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "artifacts" / "bench" / "runs"
RATIO_KEYS = ("speedup", "speedup_vs_fp32", "speedup_vs_eager_fp32", "second_over_first")


def ratios(node: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every ratio leaf of a result file's JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in RATIO_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield where, float(value)
            else:
                yield from ratios(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            # Rows that name themselves (llm_decode's format/batch rows) are matched by name, not position.
            label = "/".join(str(value[k]) for k in ("format", "loop", "batch") if isinstance(value, dict) and k in value)
            yield from ratios(value, f"{path}[{label or i}]")


def run_ratios(folder: Path) -> dict[str, float]:
    """Every ratio of every result file in one run's folder, keyed ``file: path``."""
    out: dict[str, float] = {}
    for f in sorted(folder.glob("*.json")):
        if f.name == "run_all.json":
            continue
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.update({f"{f.stem}: {p}": v for p, v in ratios(data)})
    return out


def timeline_line(folder: Path) -> str:
    """The share of time in each state of the VM and the median spell, from the run's
    ``machine_timeline.json`` (empty when the run has none): the overall ratios move with it."""
    try:
        summary = json.loads((folder / "machine_timeline.json").read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return ""
    states = [f"{state.replace('_', ' ')} {100 * s['share']:.0f} % of the time (median spell "
              f"{s['spell_s']['median']:.0f} s)" for state in ("threads_win", "threads_lose") if (s := summary.get(state))]
    return ", ".join(states + [f"{summary.get('switches', 0)} switches in {summary.get('seconds', 0):.0f} s"])


def run_machines(folder: Path) -> set[str]:
    """The machine lines (``bench/builtin_models.machine``) that the run's files carry (none for a
    hand-made folder without them)."""
    found = set()
    for f in folder.glob("*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("machine"), str):
            found.add(data["machine"])
    return found


def compare(a: dict[str, float], b: dict[str, float], tolerance: float) -> tuple[list[list[str]], list[str]]:
    """Table rows (name, A, B, difference, verdict) and the names over tolerance."""
    rows, over = [], []
    for name in sorted(set(a) & set(b)):
        diff = abs(b[name] - a[name]) / a[name] if a[name] else float("inf")
        bad = diff > tolerance
        if bad:
            over.append(name)
        rows.append([name, f"{a[name]:.2f}x", f"{b[name]:.2f}x", f"{100 * diff:.1f} %", "OVER" if bad else "ok"])
    return rows, over


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="two run folders (artifacts/bench/runs/<stamp>)")
    ap.add_argument("--last-two", action="store_true", help="compare the two newest runs under artifacts/bench/runs")
    ap.add_argument("--tolerance", type=float, default=0.10, help="largest relative difference that agrees (0.10)")
    ap.add_argument("--other-machine", action="store_true",
                    help="compare runs made on different CPUs anyway (the table is shown, the verdict means little)")
    args = ap.parse_args()
    if args.last_two:
        found = sorted(p for p in RUNS.glob("*") if p.is_dir()) if RUNS.is_dir() else []
        if len(found) < 2:
            print(f"compare_runs: fewer than two runs under {RUNS}; run `make bench` twice", file=sys.stderr)
            return 2
        first, second = found[-2:]
    elif len(args.runs) == 2:
        first, second = args.runs
    else:
        ap.error("give two run folders, or --last-two")
    for folder in (first, second):
        if not folder.is_dir():
            print(f"compare_runs: {folder} is not a folder", file=sys.stderr)
            return 2
    machines = {name: run_machines(folder) for name, folder in (("A", first), ("B", second))}
    # Scripts word their machine line differently (llm_decode names a GPU), so one machine can give a
    # run several lines; two machines share none.
    if machines["A"] and machines["B"] and not machines["A"] & machines["B"]:
        if not args.other_machine:
            print(f"compare_runs: the runs were made on different machines (A: {'; '.join(sorted(machines['A']))}; "
                  f"B: {'; '.join(sorted(machines['B']))}); give --other-machine to compare them anyway",
                  file=sys.stderr)
            return 2
        print("NOTE: the two runs were made on different machines; a difference below is not a failure to "
              "reproduce\n")
    a, b = run_ratios(first), run_ratios(second)
    rows, over = compare(a, b, args.tolerance)
    print(f"run A: {first}\nrun B: {second}\n")
    for name, folder in (("A", first), ("B", second)):
        line = timeline_line(folder)
        if line:
            print(f"run {name}'s machine: {line}")
    print("| ratio | run A | run B | difference | |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    only = sorted(set(a) ^ set(b))
    if only:
        print(f"\nin one run only ({len(only)}): " + ", ".join(only))
    print(f"\n{len(rows)} ratios in both runs, {len(over)} differ by more than {100 * args.tolerance:.0f} %")
    # A ratio given per state of the VM (validate/machine_state.py) sits under a ``by_state`` key;
    # the overall medians and the per-state ones answer different questions, so count them apart, and
    # the pairs that straddled a switch of state apart again (their share of each state is chance).
    kinds = (("overall", lambda n: "by_state" not in n),
             ("per machine state", lambda n: "by_state" in n and ".state_changed." not in n),
             ("pairs that straddled a switch", lambda n: ".state_changed." in n))
    for kind, pick in kinds:
        names = [r[0] for r in rows if pick(r[0])]
        if names and len(names) < len(rows):
            print(f"  {kind}: {len(names)} in both, {sum(pick(n) for n in over)} over")
    # A straddling pair's ratio depends on where in it the switch fell: shown, but no verdict.
    return 1 if any(".state_changed." not in n for n in over) else 0


if __name__ == "__main__":
    sys.exit(main())
