"""Benchmark: quantized vs FP32 ONNX Runtime engines on builtin:random-0.5b (the real shapes).

Builds (through the normal cached build graph) the recipe's quantized engines and the FP32 engines
of the same backend, then measures in ONE run, same inputs, same thread count:
- flow estimator: latency of one estimator call (batch 2, T frames), INT8 vs FP32 engine, and the mel
  SNR after the full 10-step CFM against the PyTorch FP32 reference with identical noise;
- LLM decode step: per-token latency on a growing KV cache, quantized vs FP32 engine, and the
  teacher-forced logit cosine against the PyTorch FP32 reference.

Usage: python bench/quantized_speed.py [--recipe recipes/cpu-int8.yaml] [--frames 500] [--threads 2]
       [--runs 5] [--min-seconds 60]
Writes a JSON result to artifacts/bench/<recipe>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from builtin_models import BENCH_CALIBRATION, add_min_seconds, machine, machine_probes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def paired(reference, candidate, pairs: int, min_seconds: float, threads: int):
    """FP32 engine vs quantized engine timed in interleaved pairs (the project's one ratio method),
    with the machine probed before each pair."""
    import torch

    from cosycompile.validate.speed import paired_ratio

    a = torch.randn(1024, 1024)
    return paired_ratio(reference, candidate, pairs=pairs, min_seconds=min_seconds,
                        probe=lambda: machine_probes(torch, threads, a))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-int8.yaml"))
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed per run")
    ap.add_argument("--runs", type=int, default=5)
    # 60 s: 30 s left too few pairs for these medians to agree between two whole `make bench` runs,
    # and twice the pairs brought them within tolerance (docs/bench-log/2026-11-26-xeon-whole-make-bench-second.md).
    add_min_seconds(ap, default=60.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import yaml

    from cosycompile.plan import plan_build
    from cosycompile.cache.local import Store
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.core.graph import Executor, Reporter, StateFile
    from cosycompile.recipe.schema import load_recipe
    from cosycompile.validate.metrics import logit_cosine, mel_snr_db
    from cosycompile.validate.machine_state import ratio_by_state

    base = load_recipe(args.recipe)
    tmp = Path(args.artifacts) / "bench"
    tmp.mkdir(parents=True, exist_ok=True)
    name = f"bench-{base.name}"
    recipe_file = tmp / f"{name}.yaml"
    recipe_file.write_text(yaml.safe_dump({
        "extends": str(Path(args.recipe).resolve()), "name": name, "model": args.model,
        "calibration": BENCH_CALIBRATION,
        "validation": {"max_items": 1, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": 60},
                       "speed": {"threads": args.threads}},
    }))
    recipe = load_recipe(recipe_file)
    plan = plan_build(recipe)
    store = Store(Path(args.artifacts))
    targets = [plan.stage_steps[s][k] for s in ("llm", "flow") for k in ("engine", "engine_fp32")
               if k in plan.stage_steps[s]]
    state = StateFile(store.root / "state" / f"{name}.json")
    t0 = time.perf_counter()
    result = Executor(store, targets, state, Reporter()).run()
    build_s = time.perf_counter() - t0
    eng = {(s, k): result.entries[plan.stage_steps[s][k].name].data for s in ("llm", "flow")
           for k in ("engine", "engine_fp32") if k in plan.stage_steps[s]}
    mdir = result.entries["model"].data

    from cosycompile.reference.runners import load_reference, reference_runtime
    from builtin_models import estimator_inputs

    models = load_reference(mdir, ("llm", "flow"), args.threads)
    rng = np.random.default_rng(0)
    out: dict = {"recipe": base.name, "model": args.model, "threads": args.threads, "frames": args.frames,
                 "min_seconds": args.min_seconds,
                 "machine": machine(),
                 "build_seconds": build_s}

    # Flow estimator: one call at T frames, batch 2 (CFG), quantized vs FP32 engine.
    q_flow = stage_runtime("flow", eng[("flow", "engine")], args.threads)
    f_flow = stage_runtime("flow", eng[("flow", "engine_fp32")], args.threads)
    ref_flow = reference_runtime("flow", models)
    T = args.frames
    feeds = tuple(estimator_inputs(rng, T).values())
    r = paired(lambda: f_flow.estimator_call(*feeds), lambda: q_flow.estimator_call(*feeds), args.runs,
               args.min_seconds, args.threads)
    tokens = rng.integers(0, 6561, T // 2)
    from cosycompile.runtime.pipeline import Prompt

    prompt = Prompt.empty()
    prompt.embedding = rng.standard_normal(192).astype(np.float32)
    ref_mel = ref_flow.mel(tokens, prompt)
    out["flow"] = {"fp32_engine_ms": 1000 * r.reference_s, "quant_engine_ms": 1000 * r.candidate_s,
                   "speedup": r.ratio, "speedup_spread": r.spread, "pairs": r.pairs, "by_state": ratio_by_state(r),
                   "mel_snr_db_quant_vs_torch": mel_snr_db(ref_mel, q_flow.mel(tokens, prompt)),
                   "mel_snr_db_fp32_engine_vs_torch": mel_snr_db(ref_mel, f_flow.mel(tokens, prompt)),
                   "precision": recipe.typed("flow")["quantize"].format}

    # LLM decode step: per-token latency after a prefill; logit cosine teacher-forced.
    q_llm = stage_runtime("llm", eng[("llm", "engine")], args.threads)
    f_llm = stage_runtime("llm", eng[("llm", "engine_fp32")], args.threads)
    ref_llm = reference_runtime("llm", models)
    # Ids the model's text table holds (builtin:tiny has 512); the same draws as before on the 0.5B model.
    text = rng.integers(0, min(1000, ref_llm.text_embedding.shape[0]), 24)
    empty = Prompt.empty()

    def decode(rt) -> None:
        # Through decoding(), as the pipeline decodes: a step engine that keeps its cache keeps it here.
        _, cache = rt.step(rt.prefix(text, empty), rt.empty_cache())
        next_logits = rt.decoding(cache, args.tokens)
        for tok in range(args.tokens):
            next_logits(rt.speech_embedding[tok][None, None].astype(np.float32))

    r = paired(lambda: decode(f_llm), lambda: decode(q_llm), max(3, args.runs // 2), args.min_seconds, args.threads)
    speech = rng.integers(0, 6561, 48)
    ref_logits = ref_llm.teacher_forced_logits(text, empty, speech)
    out["llm"] = {"fp32_engine_ms_per_token": 1000 * r.reference_s / args.tokens,
                  "quant_engine_ms_per_token": 1000 * r.candidate_s / args.tokens,
                  "speedup": r.ratio, "speedup_spread": r.spread, "pairs": r.pairs, "tokens_timed": args.tokens,
                  "by_state": ratio_by_state(r),
                  "logit_cosine_quant_vs_torch": logit_cosine(ref_logits, q_llm.teacher_forced_logits(text, empty, speech)),
                  "logit_cosine_fp32_engine_vs_torch": logit_cosine(ref_logits,
                                                                    f_llm.teacher_forced_logits(text, empty, speech)),
                  "precision": recipe.typed("llm")["quantize"].format}
    dest = tmp / f"{base.name}.json"
    dest.write_text(json.dumps(out, indent=1))
    fl, ll = out["flow"], out["llm"]
    print("| recipe | stage | format | FP32 engine | quantized engine | speed-up | quality vs PyTorch FP32 |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {base.name} | flow estimator (T={T}, batch 2) | {fl['precision']} | {fl['fp32_engine_ms']:.1f} ms | "
          f"{fl['quant_engine_ms']:.1f} ms | {fl['speedup']:.2f}x ({fl['speedup_spread'][0]:.2f}-{fl['speedup_spread'][1]:.2f}, "
          f"{fl['pairs']} pairs) | mel SNR {fl['mel_snr_db_quant_vs_torch']:.1f} dB "
          f"after 10 CFM steps (FP32 engine: {fl['mel_snr_db_fp32_engine_vs_torch']:.1f} dB) |")
    print(f"| {base.name} | LLM decode step | {ll['precision']} | {ll['fp32_engine_ms_per_token']:.2f} ms/token | "
          f"{ll['quant_engine_ms_per_token']:.2f} ms/token | {ll['speedup']:.2f}x ({ll['speedup_spread'][0]:.2f}-"
          f"{ll['speedup_spread'][1]:.2f}, {ll['pairs']} pairs) | logit cosine "
          f"{ll['logit_cosine_quant_vs_torch']:.4f} |")
    print("\nBy the machine's state before each pair (threads win or lose to one thread on a small parallel op):")
    print("| stage | state | pairs | FP32 engine | quantized engine | speed-up | copy GB/s |")
    print("|---|---|---|---|---|---|---|")
    for stage, row, scale, unit in (("flow estimator", fl, 1000, "ms"), ("LLM decode step", ll, 1000 / args.tokens, "ms/token")):
        for state, st in row["by_state"].items():
            print(f"| {stage} | {state.replace('_', ' ')} | {st['pairs']} | {scale * st['reference_s']:.2f} {unit} | "
                  f"{scale * st['built_s']:.2f} {unit} | {st['speedup']:.2f}x | {st['copy_gb_per_s']:.0f} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
