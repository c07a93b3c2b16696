"""Study: how fast are ``torch._int_mm`` products against FP32 ones on this CPU, at the shapes the
``torch_dynamic`` quantizer gives them in the 0.5B models?

PyTorch hands ``_int_mm`` to oneDNN only on CPUs with AVX512-VNNI and runs a scalar loop elsewhere
(``cosycompile.runtime.host.int8_matmul_is_vectorized``). This times each product the INT8 programs
make (the LLM decode step's linears at one row, the flow estimator's linears and one head's attention
products at ``--frames``, batch 2) against the FP32 product of the same shape (``torch.mm``, MKL), in
interleaved pairs, so that a CPU class can be placed on one side of that line by measurement.

Usage: python bench/studies/int8_products.py [--frames 500] [--threads 2] [--pairs 9] [--min-seconds 10]
Writes artifacts/bench/int8_products.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from builtin_models import add_min_seconds, machine  # noqa: E402

# (what, rows, inner, outer): CosyVoice2-0.5B's Qwen2 decode step (hidden 896, 2 KV heads of 64,
# MLP 4864) at one token, and the flow estimator (256 channels, 8 heads of 64, feed-forward 1024).
DECODE = [("LLM q/k/v", 1, 896, 1152), ("LLM o", 1, 896, 896), ("LLM gate+up", 1, 896, 9728),
          ("LLM down", 1, 4864, 896)]


def shapes(frames: int) -> list[tuple[str, int, int, int]]:
    """Every product of one decode step and one estimator call, one of each shape."""
    rows = 2 * frames  # CFG batch of 2
    return DECODE + [("flow q/k/v", rows, 256, 512), ("flow out", rows, 512, 256),
                     ("flow ff in", rows, 256, 1024), ("flow ff out", rows, 1024, 256),
                     ("flow Q.K (one head)", frames, 64, frames), ("flow P.V (one head)", frames, frames, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=9)
    add_min_seconds(ap, default=10.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    if args.frames < 1 or args.threads < 1 or args.pairs < 1:
        print("error: --frames, --threads and --pairs must be at least 1", file=sys.stderr)
        return 2

    import torch

    from cosycompile.runtime.host import int8_matmul_is_vectorized
    from cosycompile.validate.speed import paired_ratio

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for what, m, k, n in shapes(args.frames):
        a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
        b8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g).t()  # the layout the programs pass
        a32, b32 = a8.float(), b8.float()  # .float() keeps b8's column-major strides
        if k * 127 * 127 < 2 ** 24:  # FP32 sums these integers exactly: both sides compute the same product
            assert torch.equal(torch._int_mm(a8, b8), (a32 @ b32).int()), what
        r = paired_ratio(lambda: torch.mm(a32, b32), lambda: torch._int_mm(a8, b8), pairs=args.pairs,
                         min_seconds=args.min_seconds)
        rows_out.append({"product": what, "m": m, "k": k, "n": n, "fp32_ms": 1000 * r.reference_s,
                         "int8_ms": 1000 * r.candidate_s, "int8_speedup": r.ratio, "spread": list(r.spread),
                         "pairs": r.pairs})
    out = {"machine": machine(), "torch": torch.__version__, "threads": args.threads, "frames": args.frames,
           "int8_matmul_is_vectorized": int8_matmul_is_vectorized(), "products": rows_out}
    dest = Path(args.artifacts) / "bench" / "int8_products.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    print(f"{out['machine']}, torch {out['torch']}, {args.threads} threads; "
          f"torch._int_mm vectorized here: {out['int8_matmul_is_vectorized']}")
    print("| product | M x K x N | FP32 ms | INT8 ms | INT8 over FP32 (median of pairs, spread, pairs) |")
    print("|---|---|---|---|---|")
    for p in rows_out:
        print(f"| {p['product']} | {p['m']} x {p['k']} x {p['n']} | {p['fp32_ms']:.3f} | {p['int8_ms']:.3f} | "
              f"{p['int8_speedup']:.2f}x ({p['spread'][0]:.2f}-{p['spread'][1]:.2f}, {p['pairs']}) |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
