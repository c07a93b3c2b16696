"""Benchmark: what the CFM step count costs in quality, on the PyTorch FP32 flow.

The mel of the flow solved with N Euler steps against the model's own 10-step mel, identical noise,
tokens and speaker embedding (the figure the flow check reports as ``flow.mel_snr_db`` for a recipe
that sets ``stages.flow.runtime.n_timesteps``), with the solve time of each N (one run each: time
is proportional to N, one estimator call per step). On random weights the velocity field is nearly
straight, so this shows what a built-in model can and cannot tell about fewer steps.

Usage: python bench/cfm_steps.py [--model builtin:random-0.5b] [--frames 500] [--steps 8 6 5 4 3]
Writes artifacts/bench/cfm_steps-<model>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 6, 5, 4, 3])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    from builtin_models import load_builtin

    from cosycompile.reference.runners import reference_runtime
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.validate.metrics import mel_snr_db

    models = load_builtin(args.model, ("flow",), Path(args.artifacts), args.threads, "bench-cfm-steps")
    flow = reference_runtime("flow", models)
    reference_steps = flow.n_timesteps
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, models.config.speech_token_size, args.frames // 2)
    prompt = Prompt.empty()
    prompt.embedding = rng.standard_normal(192).astype(np.float32)

    rows = []
    ref_mel = None
    for n in [reference_steps, *args.steps]:
        flow.n_timesteps = n
        t0 = time.perf_counter()
        mel = flow.mel(tokens, prompt)
        seconds = time.perf_counter() - t0
        if ref_mel is None:
            ref_mel = mel
        rows.append({"steps": n, "mel_snr_db_vs_reference": None if n == reference_steps else mel_snr_db(ref_mel, mel),
                     "solve_s": seconds})
    print(f"| CFM steps | mel SNR vs {reference_steps} steps | solve s (one run) |")
    print("|---|---|---|")
    for r in rows:
        snr = "reference" if r["mel_snr_db_vs_reference"] is None else f"{r['mel_snr_db_vs_reference']:.1f} dB"
        print(f"| {r['steps']} | {snr} | {r['solve_s']:.2f} |")
    out = Path(args.artifacts) / "bench" / f"cfm_steps-{args.model.replace(':', '-')}.json"
    out.write_text(json.dumps({"model": args.model, "frames": args.frames, "threads": args.threads,
                               "machine": machine(), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
