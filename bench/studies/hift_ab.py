"""Study: is one built HiFT engine faster than another? Two engine dirs of the same model (e.g. the
cached ``hift.engine`` entries before and after a change to the project's ONNX Runtime operators),
their vocoder timed in interleaved pairs on one mel, with B's waveform against A's beside it. When
both dirs carry the operator library (``runtime/ort_ops``), its ``Snake`` is also timed alone, A's
library against B's, at the shapes of HiFT's three upsampling levels for that mel.

Usage: python bench/studies/hift_ab.py --a ENGINE_DIR --b ENGINE_DIR [--frames 500] [--threads 2]
       [--pairs 15] [--min-seconds 0]
ENGINE_DIR: a ``hift.engine`` step's output (``artifacts/cache/objects/../<key>/data``).
Writes artifacts/bench/hift_ab.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from builtin_models import add_min_seconds, machine, write_result  # noqa: E402

# Channels and upsampling factor of HiFT's three levels (CosyVoice2's 24 kHz vocoder: 8, 5, 3).
LEVELS = ((256, 8), (128, 40), (64, 120))
OP_RUNS = 50  # Snake calls per timed sample: one call is well under a millisecond


def _repeat(fn: Any, runs: int) -> Any:
    def timed() -> None:
        for _ in range(runs):
            fn()
    return timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, type=Path, help="the engine dir timed as the reference side")
    ap.add_argument("--b", required=True, type=Path, help="the engine dir whose speed-up over A is reported")
    ap.add_argument("--frames", type=int, default=500, help="mel frames (500 = 10 s of audio)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=15)
    add_min_seconds(ap, default=0.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    for p in (args.a, args.b):
        if not p.is_dir():
            print(f"error: {p} is not a directory", file=sys.stderr)
            return 2

    from cosycompile.runtime import ort_ops
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.validate.metrics import waveform_snr_db
    from cosycompile.validate.speed import paired_ratio

    a, b = (stage_runtime("hift", d, args.threads) for d in (args.a, args.b))
    mel = (np.random.default_rng(0).standard_normal((80, args.frames)) * 2 - 6).astype(np.float32)
    wav_a, wav_b = a.wav(mel, 0), b.wav(mel, 0)
    identical = bool(np.array_equal(wav_a, wav_b))
    r = paired_ratio(lambda: a.wav(mel, 0), lambda: b.wav(mel, 0), pairs=args.pairs, min_seconds=args.min_seconds)
    out: dict[str, Any] = {
        "machine": machine(), "frames": args.frames, "threads": args.threads, "a": str(args.a), "b": str(args.b),
        "a_ms": 1000 * r.reference_s, "b_ms": 1000 * r.candidate_s, "speedup": r.ratio, "spread": list(r.spread),
        "pairs": r.pairs, "waveforms_identical": identical,
        "waveform_snr_db_b_on_a": None if identical else waveform_snr_db(wav_a, wav_b), "snake": []}
    libs = [ort_ops.library_in(d) for d in (args.a, args.b)]
    if all(libs):
        for channels, factor in LEVELS:
            steps = args.frames * factor
            x = np.random.default_rng(1).standard_normal((1, channels, steps)).astype(np.float32)
            alpha = np.linspace(0.2, 2.0, channels, dtype=np.float32)
            sa, sb = (ort_ops.snake_session(lib, [1, channels, steps], alpha, 1 / alpha, args.threads)
                      for lib in libs)
            s = paired_ratio(_repeat(lambda: sa.run(None, {"x": x}), OP_RUNS),
                             _repeat(lambda: sb.run(None, {"x": x}), OP_RUNS), pairs=7)
            out["snake"].append({"shape": [1, channels, steps], "a_ms": 1000 * s.reference_s / OP_RUNS,
                                 "b_ms": 1000 * s.candidate_s / OP_RUNS, "speedup": s.ratio,
                                 "spread": list(s.spread), "pairs": s.pairs})
    dest = write_result(Path(args.artifacts), "hift_ab", out)
    print(f"HiFT, {args.frames} mel frames, {args.threads} threads, {out['machine']}")
    same = "bit-identical" if identical else f"B against A {out['waveform_snr_db_b_on_a']:.1f} dB"
    print(f"A {out['a_ms']:.0f} ms, B {out['b_ms']:.0f} ms: B over A {r.ratio:.3f}x "
          f"(spread {r.spread[0]:.3f}-{r.spread[1]:.3f}, {r.pairs} pairs); waveforms {same}")
    for row in out["snake"]:
        print(f"Snake {row['shape']}: A {row['a_ms']:.3f} ms, B {row['b_ms']:.3f} ms, B over A {row['speedup']:.2f}x "
              f"({row['spread'][0]:.2f}-{row['spread'][1]:.2f}, {row['pairs']} pairs)")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
