"""Study: is one flow engine faster than another? Two built engine dirs of the same model (e.g. the
cached ``flow.engine`` entries before and after a change to a quantizer), their estimator calls timed
in interleaved pairs on the same inputs, with each one's mel SNR after the 10-step CFM against
PyTorch FP32 beside it.

A change measured this way is not diluted by a third engine's noise: ``bench/torch_backend.py``
times every engine against an FP32 baseline, and two runs of a 2-vCPU VM move that baseline by
several percent.

Usage: python bench/studies/engine_ab.py --a ENGINE_DIR --b ENGINE_DIR --model-dir MODEL_DIR
       [--frames 500] [--threads 2] [--pairs 9] [--min-seconds 60]
ENGINE_DIR: a ``flow.engine`` step's output (``artifacts/cache/objects/../<key>/data``); MODEL_DIR: the
``model`` step's (the PyTorch reference for the SNR). Writes artifacts/bench/engine_ab.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from builtin_models import add_min_seconds, estimator_inputs, machine, machine_probes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, type=Path, help="the engine dir timed as the reference side")
    ap.add_argument("--b", required=True, type=Path, help="the engine dir whose speed-up over A is reported")
    ap.add_argument("--model-dir", required=True, type=Path)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=9)
    add_min_seconds(ap, default=60.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    for p in (args.a, args.b, args.model_dir):
        if not p.is_dir():
            print(f"error: {p} is not a directory", file=sys.stderr)
            return 2

    import torch

    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.validate.machine_state import ratio_by_state
    from cosycompile.validate.metrics import mel_snr_db
    from cosycompile.validate.speed import paired_ratio

    rng = np.random.default_rng(0)
    feeds = tuple(estimator_inputs(rng, args.frames).values())
    tokens = rng.integers(0, 6561, args.frames // 2)
    prompt = Prompt.empty()
    prompt.embedding = rng.standard_normal(192).astype(np.float32)
    ref_mel = reference_runtime("flow", load_reference(args.model_dir, ("flow",), args.threads)).mel(tokens, prompt)
    a, b = (stage_runtime("flow", d, args.threads) for d in (args.a, args.b))
    square = torch.randn(1024, 1024)
    r = paired_ratio(lambda: a.estimator_call(*feeds), lambda: b.estimator_call(*feeds), pairs=args.pairs,
                     min_seconds=args.min_seconds, probe=lambda: machine_probes(torch, args.threads, square))
    out = {"machine": machine(), "torch": torch.__version__, "frames": args.frames, "threads": args.threads,
           "a": str(args.a), "b": str(args.b), "a_ms": 1000 * r.reference_s, "b_ms": 1000 * r.candidate_s,
           "speedup": r.ratio, "spread": list(r.spread), "pairs": r.pairs, "by_state": ratio_by_state(r),
           "mel_snr_db_after_cfm": {"a": mel_snr_db(ref_mel, a.mel(tokens, prompt)),
                                    "b": mel_snr_db(ref_mel, b.mel(tokens, prompt))}}
    dest = Path(args.artifacts) / "bench" / "engine_ab.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    snr = out["mel_snr_db_after_cfm"]
    print(f"flow estimator, batch 2, T={args.frames}, {args.threads} threads, {out['machine']}, torch {out['torch']}")
    print("| side | ms | mel SNR after 10 CFM steps |\n|---|---|---|")
    print(f"| A | {out['a_ms']:.0f} | {snr['a']:.1f} dB |\n| B | {out['b_ms']:.0f} | {snr['b']:.1f} dB |")
    print(f"B over A: {r.ratio:.3f}x (spread {r.spread[0]:.3f}-{r.spread[1]:.3f}, {r.pairs} pairs)")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
