"""Benchmark: the streaming first chunk of a CPU recipe taken apart, against the PyTorch FP32
reference, to tell which part of it moves between runs.

The build's report times the first chunk (25 + 3 tokens through LLM, flow and HiFT) as a whole, in a
few pairs of seconds each; between two whole runs that ratio moved past tolerance for the INT8
recipes while the reference side held (docs/bench-log/2026-11-26-zen5-whole-make-bench-after-ir-change.md).
This script times its parts on the first eval item, on both pipelines, in
rounds, each round running every part once on each side (the side that goes first alternates):

- ``prefill``: the LLM's prefill and one decode step (``max_tokens=1``);
- ``llm``: prefill and the 28 tokens of the chunk;
- ``flow``: the 10-step CFM on those 28 tokens;
- ``hift``: the vocoder on the chunk's first 50 mel frames (25 tokens x 2);
- and, on the built side only, the flow on one thread (an ONNX Runtime session of its own);

and, once per round, ``builtin_models.machine_probes``: memory copy throughput, a fixed FP32 matmul
on one thread and on ``--threads`` (a core's speed), and a small parallel op on one thread and on
``--threads`` (the threads' hand-over; where the threads lose to one thread, the round is in the
"threads lose" state). It prints, per part: the built side's median and its spread over the rounds,
the median of per-round ratios, the part's share of the chunk (llm + flow + hift), the share of the
chunk's round-to-round variance that the part carries, and the correlation of each part's time to
each probe; then each part's medians in either state. Run it twice and compare the parts' medians
to see which one moved.

The engines are the ones ``bench/end_to_end.py`` builds (same recipe body, same artifacts dir), so
after ``make bench`` nothing is rebuilt.

Usage: python bench/studies/first_chunk.py [--recipe recipes/cpu-int8.yaml] [--min-seconds 120] [--rounds 5]
Writes artifacts/bench/first_chunk-<recipe>.json (``--results``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for builtin_models
from builtin_models import BENCH_CALIBRATION, build_steps, machine, machine_probes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
STAGES = ("llm", "flow", "hift")
PARTS = ("prefill", "llm", "flow", "hift")


def chunk_parts(pipe: Any, text_ids: np.ndarray, prompt: Any, tokens: np.ndarray, mel: np.ndarray,
                chunk_tokens: int) -> dict[str, Callable[[], Any]]:
    """The first chunk's parts on ``pipe``; ``tokens`` and ``mel`` are the built side's chunk, so both
    sides run flow and HiFT on the same input (their time does not depend on the values)."""
    from cosycompile.runtime.pipeline import Sampling

    one, chunk = Sampling(mode="greedy", max_tokens=1), Sampling(mode="greedy", max_tokens=chunk_tokens)
    return {
        "prefill": lambda: pipe.llm.generate(text_ids, prompt, one),
        "llm": lambda: pipe.llm.generate(text_ids, prompt, chunk),
        "flow": lambda: pipe.flow.mel(tokens, prompt),
        "hift": lambda: pipe.hift.wav(mel[:, : 2 * 25], 0),
    }


def run_rounds(sides: dict[str, dict[str, Callable[[], Any]]], rounds: int, min_seconds: float, threads: int,
               extras: dict[str, Callable[[], Any]] | None = None,
               max_rounds: int = 200) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """Seconds of every part of every side, one entry per round, and the machine probes of each round
    (with ``extras``, each timed once a round, in ms, as ``<name>_ms``), and under
    ``threads_lose_around_sides`` the state before each side and after the last round. Rounds go on
    past ``rounds`` until ``min_seconds`` have passed (as ``paired_ratio``'s window: a spell shorter
    than the window is outvoted)."""
    import torch

    from cosycompile.validate.machine_state import probe

    names = list(sides)
    times: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PARTS} for s in names}
    probes: dict[str, list[float]] = {}
    # The state before each side's parts and after the last round (machine_state.pair_states): a
    # round lasts seconds, about as long as the VM's spells, so the probe at its start alone misfiles.
    around: list[float] = []
    a = torch.randn(1024, 1024)
    extras = extras or {}
    for fn in [f for side in names for f in sides[side].values()] + list(extras.values()):
        fn()  # warm-up: first calls allocate, and the static decoder sizes its cache
    start, i = time.perf_counter(), 0
    while i < max(rounds, 1) or (time.perf_counter() - start < min_seconds and i < max_rounds):
        for k, v in machine_probes(torch, threads, a).items():
            probes.setdefault(k, []).append(v)
        for name, fn in extras.items():
            t0 = time.perf_counter()
            fn()
            probes.setdefault(f"{name}_ms", []).append(1000 * (time.perf_counter() - t0))
        for side in (names if i % 2 == 0 else names[::-1]):
            around.append(probe(threads)["threads_lose"])
            for part, fn in sides[side].items():
                t0 = time.perf_counter()
                fn()
                times[side][part].append(time.perf_counter() - t0)
        i += 1
    around.append(probe(threads)["threads_lose"])
    probes["threads_lose_around_sides"] = around
    return times, probes


def summarize(times: dict[str, dict[str, list[float]]], probes: dict[str, list[float]]) -> dict[str, Any]:
    """Per part: both sides' medians, the built side's spread, the median of per-round ratios, the
    part's share of the built chunk, its share of the chunk's variance and the correlation of its time
    to each machine probe."""
    from cosycompile.validate.machine_state import by_state

    ref, built = times["reference"], times["built"]
    chunk = np.sum([built[p] for p in STAGES], axis=0)
    ref_chunk = np.sum([ref[p] for p in STAGES], axis=0)
    var = float(np.var(chunk))
    per_round = {k: v for k, v in probes.items() if not k.startswith("threads_lose")}

    def corr(x: np.ndarray, y: list[float]) -> float | None:
        return float(np.corrcoef(x, y)[0, 1]) if len(x) > 2 and np.std(x) > 0 and np.std(y) > 0 else None

    rows: dict[str, Any] = {}
    for part, b_list in list(built.items()) + [("chunk", list(chunk))]:
        b = np.asarray(b_list)
        r = np.asarray(ref[part] if part != "chunk" else ref_chunk)
        ratios = r / b
        rows[part] = {
            "reference_s": float(np.median(r)), "built_s": float(np.median(b)),
            "built_min_s": float(b.min()), "built_max_s": float(b.max()),
            "speedup": float(np.median(ratios)), "spread": [float(ratios.min()), float(ratios.max())],
            "share_of_chunk": float(np.median(b) / np.median(chunk)) if part != "prefill" else None,
            # cov(part, chunk) / var(chunk): the parts' shares add up to 1 (prefill is inside llm).
            "share_of_chunk_variance": (float(np.cov(b, chunk, bias=True)[0, 1] / var)
                                        if var > 0 and part != "prefill" else None),
            "corr_built": {k: corr(b, v) for k, v in per_round.items()},
            "corr_reference": {k: corr(r, v) for k, v in per_round.items()},
            "by_state": by_state(r, b, probes["threads_lose_around_sides"]),
        }
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-int8.yaml"))
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--artifacts", default=str(REPO / "artifacts" / "bench" / "end-to-end"),
                    help="where end_to_end.py keeps its engines (reused, not rebuilt)")
    ap.add_argument("--rounds", type=int, default=5, help="at least this many rounds")
    ap.add_argument("--min-seconds", type=float, default=120.0,
                    help="and rounds for at least this long (0: just --rounds)")
    ap.add_argument("--chunk-tokens", type=int, default=25 + 3, help="CosyVoice2's first hop plus look-ahead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=str(REPO / "artifacts" / "bench"), help="where the JSON goes")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (a spread and a correlation need them)")
    art = Path(args.artifacts)
    recipe = Path(args.recipe).resolve()
    if not recipe.is_file():
        ap.error(f"--recipe: no such file: {args.recipe}")

    from cosycompile.reference.runners import load_reference, reference_pipeline
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Pipeline, Sampling
    from cosycompile.validate.machine_state import CHANGED, STATES

    t0 = time.perf_counter()
    body = {"extends": str(recipe), "model": args.model, "calibration": BENCH_CALIBRATION}
    dirs = build_steps(body, f"{recipe.stem}-e2e", ["model"] + [f"{s}.engine" for s in STAGES], art)
    build_s = time.perf_counter() - t0
    built = Pipeline({s: stage_runtime(s, dirs[f"{s}.engine"], args.threads) for s in STAGES})
    ref = reference_pipeline(load_reference(dirs["model"], STAGES, args.threads))
    text_ids, prompt = Frontend(dirs["model"]).item_inputs(load_dataset(REPO / "calib_data" / "eval").head(1)[0])
    tokens = built.llm.generate(text_ids, prompt, Sampling(mode="greedy", max_tokens=args.chunk_tokens))
    mel = built.flow.mel(tokens, prompt)
    ref_tokens = ref.llm.generate(text_ids, prompt, Sampling(mode="greedy", max_tokens=args.chunk_tokens))
    print(f"engines of {recipe.name}: {build_s:.0f} s (build or cache); chunk: {len(tokens)} tokens, "
          f"{min(mel.shape[1], 50)} mel frames to HiFT", flush=True)

    sides = {"reference": chunk_parts(ref, text_ids, prompt, tokens, mel, args.chunk_tokens),
             "built": chunk_parts(built, text_ids, prompt, tokens, mel, args.chunk_tokens)}
    # The built flow on one thread as well: what the chunk's flow costs when the threads do not help.
    flow_1 = stage_runtime("flow", dirs["flow.engine"], 1)
    times, probes = run_rounds(sides, args.rounds, args.min_seconds, args.threads,
                               {"built_flow_1_thread": lambda: flow_1.mel(tokens, prompt)})
    rows = summarize(times, probes)
    out = {"machine": machine(), "recipe": str(recipe), "model": args.model, "threads": args.threads,
           "chunk_tokens": int(len(tokens)), "tokens_identical_to_reference": bool(np.array_equal(tokens, ref_tokens)),
           "rounds": len(times["built"]["llm"]), "min_seconds": args.min_seconds, "probes": probes,
           "parts": rows, "times": times, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    dest = Path(args.results) / f"first_chunk-{recipe.stem}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))

    print(f"{recipe.name} on {args.model}, first chunk ({len(tokens)} tokens), {args.threads} threads, "
          f"{out['rounds']} rounds; machine: {out['machine']}")
    lose = int(sum(probes["threads_lose"]))
    print(f"rounds where {args.threads} threads lose to one on the small op: {lose} of {out['rounds']}")
    print("probes per round (median, min-max): " + "; ".join(
        f"{k} {np.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for k, v in probes.items()
        if not k.startswith("threads_lose")))
    print("| part | reference ms | built ms (min-max) | speed-up (median of rounds) | spread | share of chunk | "
          "share of its variance | built time's corr. with "
          + " / ".join(k for k in probes if not k.startswith("threads_lose")) + " | reference's |")
    print("|---|---|---|---|---|---|---|---|---|")

    def pct(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.0f} %"

    def corrs(c: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:+.2f}" for v in c.values())

    for part, r in rows.items():
        print(f"| {part} | {1000 * r['reference_s']:.0f} | {1000 * r['built_s']:.0f} "
              f"({1000 * r['built_min_s']:.0f}-{1000 * r['built_max_s']:.0f}) | {r['speedup']:.2f}x | "
              f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f} | {pct(r['share_of_chunk'])} | "
              f"{pct(r['share_of_chunk_variance'])} | {corrs(r['corr_built'])} | {corrs(r['corr_reference'])} |")
    print("\nBy the machine's state (medians of the rounds whose probes before each side and after agree; "
          "state changed: the rest):")
    print("| part | threads win: reference ms | built ms | speed-up | rounds | threads lose: reference ms | built ms | "
          "speed-up | rounds | state changed: reference ms | built ms | speed-up | rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for part, r in rows.items():
        cells = []
        for state in (*STATES, CHANGED):
            st = r["by_state"].get(state)
            cells.append(f"{1000 * st['reference_s']:.0f} | {1000 * st['built_s']:.0f} | {st['speedup']:.2f}x | "
                         f"{st['pairs']}" if st else "- | - | - | 0")
        print(f"| {part} | {' | '.join(cells)} |")
    flow_1 = np.asarray(probes["built_flow_1_thread_ms"])
    lose_mask = np.asarray(probes["threads_lose"], bool)
    print("built flow on one thread, ms (median): " + ", ".join(
        f"{name} {np.median(flow_1[m]):.0f}" for name, m in (("threads win", ~lose_mask), ("threads lose", lose_mask))
        if m.any()))
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
