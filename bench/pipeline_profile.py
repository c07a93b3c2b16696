"""Benchmark: where a bundle's synthesis spends its time outside the graphs.

Loads a built bundle as ``cosycompile synthesize`` does, synthesizes the first eval item once to warm
up, then profiles ``--runs`` more syntheses (greedy, ``--tokens`` speech tokens) with cProfile. The
time inside the engines' graph calls (ONNX Runtime's ``InferenceSession.run``, an AOTInductor package's
call) is the graph time; everything else (the numpy control flow of the runtimes, copies between
stages, sampling, the iSTFT) is listed by function, largest own time first, each as a share of the
whole synthesis. Offline synthesis by default; ``--stream`` profiles token-chunk streaming instead.

Usage: python bench/pipeline_profile.py --bundle artifacts/builds/<name>-<key> [--tokens 250] [--stream]
Writes artifacts/bench/pipeline_profile-<bundle>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# pstats names of the calls that run a graph: ONNX Runtime's session, an AOTInductor package's model.
GRAPH_CALLS = ("onnxruntime_pybind11_state.run>", "torch._C._aoti.boxed_run>")


def _label(func: tuple[str, int, str]) -> str:
    file, line, name = func
    if file == "~":
        return name
    short = file.split("/site-packages/")[-1].split("/cosycompile/")[-1]
    return f"{short}:{line}({name})"


def split_profile(stats: pstats.Stats, total_s: float, top: int) -> dict[str, Any]:
    """Graph time, the rest, and the ``top`` functions of the rest by own time (share of ``total_s``)."""
    graph_s, rest = 0.0, []
    for func, (_, calls, own, _cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        label = _label(func)
        if any(g in label for g in GRAPH_CALLS):
            graph_s += own
        else:
            rest.append((own, calls, label))
    rest.sort(reverse=True)
    return {"graph_s": graph_s, "other_s": total_s - graph_s, "other_share": (total_s - graph_s) / total_s,
            "top": [{"function": label, "own_s": own, "share": own / total_s, "calls": calls}
                    for own, calls, label in rest[:top]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens of the eval item (250 = 10 s)")
    ap.add_argument("--runs", type=int, default=2, help="syntheses profiled after the warm-up one")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of the engines")
    ap.add_argument("--stream", action="store_true", help="profile token-chunk streaming instead of offline")
    ap.add_argument("--top", type=int, default=15, help="functions listed outside the graphs")
    ap.add_argument("--results", type=Path, default=REPO / "artifacts" / "bench")
    args = ap.parse_args()

    from cosycompile.runtime.bundle import load_bundle, stream_pieces, synthesize_pieces
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.pipeline import Sampling

    loaded = load_bundle(args.bundle.resolve(), args.threads)
    item = load_dataset(REPO / "calib_data" / "eval").head(1)[0]
    prompt = loaded.frontend.no_prompt(item.text)
    ids = [loaded.frontend.text_ids(item.text)]
    sampling = Sampling(mode="greedy", seed=0, max_tokens=args.tokens)
    pieces = stream_pieces if args.stream else synthesize_pieces

    def synthesize() -> int:
        # Offline pieces are wavs; streamed ones are chunks carrying theirs.
        return sum(int(getattr(w, "wav", w).size) for w in pieces(loaded.pipeline, ids, prompt, sampling))

    samples = synthesize()  # warm-up: first-call allocations and thread pools out of the profile
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    for _ in range(args.runs):
        synthesize()
    profile.disable()
    total_s = time.perf_counter() - t0
    audio_s = samples / loaded.pipeline.sample_rate
    result = split_profile(pstats.Stats(profile), total_s, args.top)
    out = {"machine": machine(), "bundle": str(args.bundle), "mode": "stream" if args.stream else "offline",
           "tokens": args.tokens, "runs": args.runs, "threads": args.threads, "audio_seconds": audio_s,
           "seconds_per_synthesis": total_s / args.runs, **result}
    args.results.mkdir(parents=True, exist_ok=True)
    dest = args.results / f"pipeline_profile-{args.bundle.resolve().name}.json"
    dest.write_text(json.dumps(out, indent=1))

    print(f"{args.bundle.name}: {out['mode']}, {audio_s:.1f} s of audio, {out['seconds_per_synthesis']:.2f} s a "
          f"synthesis ({args.runs} profiled); machine: {out['machine']}")
    print(f"graphs {100 * result['graph_s'] / total_s:.1f} %, everything else {100 * result['other_share']:.1f} % "
          "(cProfile's own overhead included)")
    print("| function (outside the graphs) | own s | share | calls |")
    print("|---|---:|---:|---:|")
    for row in result["top"]:
        print(f"| `{row['function']}` | {row['own_s']:.3f} | {100 * row['share']:.1f} % | {row['calls']} |")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
