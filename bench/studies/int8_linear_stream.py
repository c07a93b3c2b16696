"""Study: how fast cosycompile's INT8 operator streams a decode step's weights, per kernel and thread
count, against a large copy on the same threads.

One decode step of the 0.5B LM multiplies one row by every linear of its 24 layers (q/k/v, o,
gate+up, down; 358 MB of INT8 weights, more than any cache). This times exactly those products,
through ``cosycompile::int8_linear_with`` for each kernel this CPU can run (``--kernels``), the
median of ``--runs`` passes, and prints the weights' bytes over that time next to a 2 GiB tensor
copy's read + write rate, which bounds what one pass can read here.

Usage: python bench/studies/int8_linear_stream.py [--threads 1,2] [--kernels vnni,avx2] [--runs 15]
Writes artifacts/bench/int8_linear_stream.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

LAYERS = 24
SHAPES = ((896, 1152), (896, 896), (896, 9728), (4864, 896))  # (K, N) of q/k/v, o, gate+up, down


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kernels", default="vnni,avx2", help="those this CPU cannot run are left out")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import torch

    from builtin_models import machine
    from cosycompile.runtime.torch_ops import build_library, load_library

    out = Path(args.artifacts) / "bench"
    load_library(build_library(out / "torch_ops"))
    runnable = torch.ops.cosycompile.int8_linear_kernels()
    kernels = [k for k in args.kernels.split(",") if k in runnable]
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), torch.rand(n, generator=gen) * 1e-3)
               for _ in range(LAYERS) for k, n in SHAPES]
    mb = sum(w.numel() for w, _ in weights) / 1e6
    xs = {k: torch.randn(1, k, generator=gen) for k, _ in SHAPES}
    big = torch.empty(512 << 18)
    dst = torch.empty_like(big)

    def median_s(work) -> float:
        work()
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            work()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        copy_gbs = 2 * big.numel() * 4 / median_s(lambda: dst.copy_(big)) / 1e9
        for kernel in kernels:
            def step(kernel: str = kernel) -> None:
                for w, s in weights:
                    torch.ops.cosycompile.int8_linear_with(xs[w.shape[1]], w, s, None, kernel)
            sec = median_s(step)
            rows.append({"threads": threads, "kernel": kernel, "ms": 1e3 * sec, "gb_per_s": mb / 1e3 / sec,
                         "copy_gb_per_s": copy_gbs})
    print(f"{machine()}; {LAYERS} layers, {mb:.0f} MB of INT8 weights, one row, median of {args.runs} passes")
    print("| threads | kernel | ms a step | weights GB/s | copy GB/s (read + write) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threads']} | {r['kernel']} | {r['ms']:.1f} | {r['gb_per_s']:.1f} | {r['copy_gb_per_s']:.1f} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_linear_stream.json").write_text(json.dumps({"machine": machine(), "weights_mb": mb, "rows": rows},
                                                            indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
