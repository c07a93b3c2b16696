"""Benchmark: the ONNX Runtime LLM decode loop with the ``kv_cache`` rewrite against without it.

The exported step takes and returns the whole cache as one stacked tensor, which ONNX Runtime copies
about four times a step; the ``kv_cache`` rewrite gives the step one cache input and output per
layer, and the pipeline's decoder keeps those between steps. This builds ``--recipe``'s LLM engine
twice, with the backend's rewrites ``[attention, mish]`` (the stacked cache) and
``[attention, mish, kv_cache]``, and times the pipeline's decode loop (``LLMRuntime.decoding``,
``--tokens`` steps after a prefill of ``--past`` positions) of each in interleaved pairs for at
least ``--min-seconds`` per cache length, with the largest logit difference between the two
(the rewrite is exact, so it should be 0).

Usage: python bench/studies/llm_kv_cache.py [--recipe recipes/cpu-fast.yaml] [--past 100 300 600] [--tokens 64]
       [--min-seconds 30]
Writes artifacts/bench/llm_kv_cache.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for builtin_models
from builtin_models import add_min_seconds, machine, rewrite_variants

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

VARIANTS = {"stacked": ["attention", "mish"], "per-layer": ["attention", "mish", "kv_cache"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-fast.yaml"))
    ap.add_argument("--past", type=int, nargs="+", default=[100, 300, 600], help="cached positions before the loop")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps a timed run")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    add_min_seconds(ap)
    args = ap.parse_args()
    art = Path(args.artifacts)

    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.validate.speed import paired_ratio

    engines = rewrite_variants(Path(args.recipe), args.model, art, "llm", VARIANTS, "llm-kv")
    rts = {name: stage_runtime("llm", path, args.threads) for name, path in engines.items()}
    stacked, per_layer = rts["stacked"], rts["per-layer"]
    if per_layer.kept is None:
        print("the kv_cache rewrite did not match this LLM step (see the engine passport's rewrites)")
        return 1
    rng = np.random.default_rng(0)
    hidden = stacked.speech_embedding.shape[1]
    embeds = [stacked.speech_embedding[t][None, None].astype(np.float32)
              for t in rng.integers(0, stacked.speech_token_size, args.tokens)]

    def loop(rt: Any, cache: np.ndarray) -> list[np.ndarray]:
        step = rt.decoding(cache, args.tokens)
        return [step(e) for e in embeds]

    rows = []
    for past in args.past:
        prefill = rng.standard_normal((1, past, hidden), dtype=np.float32) * 0.05
        _, cache = stacked.step(prefill, stacked.empty_cache())
        diff = max(float(np.abs(a - b).max()) for a, b in zip(loop(stacked, cache), loop(per_layer, cache)))
        r = paired_ratio(lambda: loop(stacked, cache), lambda: loop(per_layer, cache), pairs=args.pairs,
                         min_seconds=args.min_seconds)
        rows.append({"past": past, "stacked_ms_per_token": 1000 * r.reference_s / args.tokens,
                     "per_layer_ms_per_token": 1000 * r.candidate_s / args.tokens, "speedup": r.ratio,
                     "spread": r.spread, "pairs": r.pairs, "max_abs_logit_diff": diff})
    out = {"model": args.model, "recipe": Path(args.recipe).name, "tokens": args.tokens, "threads": args.threads,
           "machine": machine(), "rows": rows}
    dest = art / "bench" / "llm_kv_cache.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"{out['recipe']}'s LLM decode loop ({args.tokens} tokens a run, {args.threads} threads) with the kv_cache "
          f"rewrite against the stacked cache, on {out['machine']}")
    print("| cached positions | stacked ms/token | per-layer ms/token | speed-up (median, spread, pairs) | max logit diff |")
    print("|---|---|---|---|---|")
    for w in rows:
        print(f"| {w['past']} | {w['stacked_ms_per_token']:.2f} | {w['per_layer_ms_per_token']:.2f} | "
              f"{w['speedup']:.2f}x ({w['spread'][0]:.2f}-{w['spread'][1]:.2f}, {w['pairs']}) | "
              f"{w['max_abs_logit_diff']:.1e} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
