"""Benchmark: end-to-end offline RTF and streaming first chunk of a recipe's engines against the
PyTorch FP32 reference in the same run, with the quality of the same engines next to it, without
the build's stage checks.

``bench/end_to_end.py`` runs the whole build, whose stage checks compare every quantized engine
with an FP32 engine of the same backend: on a GPU target that is twice the AOTInductor compiles.
This script builds only the three engines (through the normal cached build graph), then on the
first eval item, greedy, ``--tokens`` speech tokens:
- speed: LLM, flow (10-step CFM), HiFT, end to end and first chunk (25 + 3 tokens through all
  three), each in interleaved pairs against the PyTorch FP32 reference (on the CPU, ``--threads``);
- quality: speech tokens identical to the reference's; each stage on the reference's own input
  (flow mel SNR on the reference tokens, HiFT waveform SNR on the reference mel), so that a token
  that flips under greedy decoding of random weights does not hide the other stages' numbers.

Usage: python bench/pipeline_speed.py [--recipe recipes/h100-torch.yaml] [--build-only]
Writes artifacts/bench/pipeline_speed-<recipe>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from builtin_models import build_steps, machine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
STAGES = ("llm", "flow", "hift")


def device_line() -> str:
    """The GPU the engines run on, if any, after the CPU that runs the reference."""
    import torch

    gpu = f"; GPU {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""
    return f"{machine()}, torch {torch.__version__}{gpu}"


def synthesis_quality(r: Any, b: Any, built: Any, prompt: Any) -> dict[str, Any]:
    """Quality of the built pipeline's synthesis ``b`` against the reference's ``r`` of the same item:
    the tokens, and each later stage on the reference's own input (flow on its tokens, HiFT on its
    mel), so that a token flipped under greedy decoding of random weights hides no other number."""
    from cosycompile.validate import metrics as M

    n = min(len(r.tokens), len(b.tokens))
    agree = np.append(r.tokens[:n] == b.tokens[:n], False)  # the sentinel ends a run of all-equal tokens
    quality = {
        "tokens_reference": int(len(r.tokens)), "tokens_built": int(len(b.tokens)),
        "tokens_identical": bool(np.array_equal(r.tokens, b.tokens)),
        "leading_tokens_identical": int(np.argmin(agree)),
        "token_edit_distance": M.token_edit_distance(r.tokens.tolist(), b.tokens.tolist())[1],
        "flow_mel_snr_db_on_reference_tokens": M.mel_snr_db(r.mel, built.flow.mel(r.tokens, prompt)),
        "hift_waveform_snr_db_on_reference_mel": M.waveform_snr_db(r.wav, built.hift.wav(r.mel, 0)),
    }
    if quality["tokens_identical"]:
        quality["end_to_end_waveform_snr_db"] = M.waveform_snr_db(r.wav, b.wav)
    return quality


def time_cases(ref: Any, built: Any, cases: dict[str, Any], names: list[str], pairs: int) -> dict[str, Any]:
    """Each named workload (``reference.step.workloads``' cases) on both pipelines, in interleaved pairs
    (the warm-up pair also makes whatever the built side captures or compiles for its shapes)."""
    from cosycompile.validate.speed import paired_ratio

    speed: dict[str, Any] = {}
    for case in names:
        fn = cases[case]
        p = paired_ratio(lambda: fn(ref), lambda: fn(built), pairs=pairs)
        speed[case] = {"reference_s": p.reference_s, "built_s": p.candidate_s, "speedup": p.ratio,
                       "spread": list(p.spread), "pairs": p.pairs, "ratios": list(p.ratios)}
        print(f"  {case}: built {1000 * p.candidate_s:.1f} ms, reference {1000 * p.reference_s:.0f} ms", flush=True)
    return speed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "h100-torch.yaml"))
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens of the eval item (250 = 10 s)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the reference (and of CPU engines)")
    ap.add_argument("--cases", default="llm,flow,hift,end_to_end,first_chunk")
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    ap.add_argument("--build-only", action="store_true", help="build (or find cached) the engines and stop")
    args = ap.parse_args()
    art = Path(args.artifacts)
    recipe = Path(args.recipe).resolve()

    from cosycompile.reference.runners import load_reference, reference_pipeline
    from cosycompile.reference.step import workloads
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend
    from cosycompile.runtime.loading import read_passport, stage_runtime
    from cosycompile.runtime.pipeline import Pipeline, Sampling

    t0 = time.perf_counter()
    body = {"extends": str(recipe), "model": args.model}
    # The LLM last: a parallel llm_decode.py can compile its (same-key) engine meanwhile.
    dirs = build_steps(body, f"{recipe.stem}-speed", ["model"] + [f"{s}.engine" for s in reversed(STAGES)], art)
    build_s = time.perf_counter() - t0
    print(f"engines of {recipe.name} on {args.model}: {build_s:.0f} s (build or cache)", flush=True)
    if args.build_only:
        return 0

    built = Pipeline({s: stage_runtime(s, dirs[f"{s}.engine"], args.threads) for s in STAGES})
    passports = {s: read_passport(dirs[f"{s}.engine"]) for s in STAGES}
    ref = reference_pipeline(load_reference(dirs["model"], STAGES, args.threads))
    item = load_dataset(REPO / "calib_data" / "eval").head(1)[0]
    first = Frontend(dirs["model"]).item_inputs(item)
    sampling = Sampling(mode="greedy", seed=0, max_tokens=args.tokens)

    r = ref.synthesize(*first, sampling)
    b = built.synthesize(*first, sampling)
    quality = synthesis_quality(r, b, built, first[1])
    w = workloads(built, first, sampling, b.tokens, b.mel)
    audio_s = b.wav.size / built.hift.sample_rate  # the vocoder's rate: the family's
    speed = time_cases(ref, built, w["cases"], args.cases.split(","), args.pairs)
    out = {"machine": device_line(), "recipe": str(recipe), "model": args.model, "tokens": args.tokens,
           "mel_frames": int(b.mel.shape[1]), "audio_seconds": audio_s, "threads": args.threads,
           "build_seconds": build_s, "engines": {s: {k: passports[s].get(k) for k in ("backend", "precision", "device")}
                                                 for s in STAGES},
           "quality": quality, "speed": speed}
    if "end_to_end" in speed:
        out["rtf_built"] = speed["end_to_end"]["built_s"] / audio_s
        out["rtf_reference"] = speed["end_to_end"]["reference_s"] / audio_s
    dest = art / "bench" / f"pipeline_speed-{recipe.stem}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))

    engines = ", ".join(f"{s} {e['backend']} {e['precision']} {e['device']}" for s, e in out["engines"].items())
    print(f"{recipe.name} on {args.model}: {len(b.tokens)} tokens, {b.mel.shape[1]} mel frames, {audio_s:.1f} s audio; "
          f"engines {engines}")
    print(f"machine: {out['machine']}; reference: PyTorch FP32 on the CPU, {args.threads} threads")
    print("| workload | reference ms | built ms | speed-up (median of pairs) | spread | pairs |")
    print("|---|---|---|---|---|---|")
    for case, s in speed.items():
        # Two decimals: the acceptance thresholds (4.5x) sit where one decimal cannot tell 4.46 from 4.54.
        print(f"| {case} | {1000 * s['reference_s']:.0f} | {1000 * s['built_s']:.1f} | {s['speedup']:.2f}x | "
              f"{s['spread'][0]:.2f}-{s['spread'][1]:.2f} | {s['pairs']} |")
    if "rtf_built" in out:
        print(f"RTF built {out['rtf_built']:.4f}, reference {out['rtf_reference']:.3f}")
    print("quality: " + json.dumps(quality, default=float))
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
