"""Study: what do INT8 attention products save at the flow estimator's shape on this CPU, and what is
left of an attention once they are INT8?

One attention of the CosyVoice2 estimator (batch 2 for CFG, 8 heads of 64, ``--frames`` frames, an
all-zero additive mask as one unpadded utterance gives), each variant compiled by Inductor as the
torch backend compiles the estimator, timed in interleaved pairs against scaled_dot_product_attention
in FP32 (what the FP32 torch package runs):
- matmul, softmax, matmul in FP32;
- the same in BF16 (products in BF16, softmax in FP32);
- torch_dynamic's composite ``int8_attention``: two ``torch._int_mm`` per head, the softmax between;
- ``cosycompile::int8_attention`` (what ``attention: int8`` puts in the program): the same arithmetic
  in one operator call, not compiled further.
Each with its output SNR against float64 attention on the same inputs, and, for the composite,
torch's profiler split of one call into the products and the fused softmax/quantize kernels. Last, the
operator on heads as the estimator's projections leave them ([B, T, H*D] viewed as [B, H, T, D]): read
where they lie against copied contiguous first, interleaved.

Usage: python bench/studies/int8_attention.py [--frames 632] [--threads 2] [--pairs 15] [--min-seconds 20]
Writes artifacts/bench/int8_attention.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=632)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--min-seconds", type=float, default=20.0)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import torch
    import torch._inductor.config as inductor

    from builtin_models import machine, machine_probes
    from cosycompile.quantize.torch_dynamic.attention import int8_attention
    from cosycompile.runtime.torch_ops import build_library, load_library
    from cosycompile.validate.speed import paired_ratio

    load_library(build_library(Path(args.artifacts) / "bench" / "torch_ops"))

    torch.set_num_threads(args.threads)
    inductor.cpp.enable_kernel_profile = True  # the fused kernels show in the profiler by name
    B, H, T, D = 2, 8, args.frames, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    mask = torch.zeros(B, 1, T, T)
    scale = D ** -0.5

    def sdpa(q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def plain(q, k, v, m):
        return torch.softmax(q @ k.transpose(-1, -2) * scale + m, -1) @ v

    def bf16(q, k, v, m):
        s = (q.bfloat16() @ k.bfloat16().transpose(-1, -2)).float() * scale + m
        return (torch.softmax(s, -1).bfloat16() @ v.bfloat16()).float()

    def int8(q, k, v, m):
        return int8_attention(q, k, v, m, scale)

    exact = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * scale, -1) @ v.double()
    compiled = {name: torch.compile(fn, dynamic=False) for name, fn in
                (("sdpa fp32", sdpa), ("matmul-softmax-matmul fp32", plain), ("matmul-softmax-matmul bf16", bf16),
                 ("int8_attention", int8))}
    compiled["cosycompile::int8_attention"] = lambda q, k, v, m: torch.ops.cosycompile.int8_attention(q, k, v, m, scale)
    a = torch.randn(1024, 1024)
    out: dict = {"machine": machine(), "torch": torch.__version__, "frames": T, "threads": args.threads, "rows": {}}
    with torch.no_grad():
        base = compiled["sdpa fp32"]
        for name, fn in compiled.items():
            got = fn(q, k, v, mask).double()
            snr = 10 * math.log10(float((exact ** 2).sum() / ((got - exact) ** 2).sum().clamp(min=1e-300)))
            r = paired_ratio(lambda: base(q, k, v, mask), lambda: fn(q, k, v, mask), pairs=args.pairs,
                             min_seconds=args.min_seconds, probe=lambda: machine_probes(torch, args.threads, a))
            out["rows"][name] = {"ms": 1000 * r.candidate_s, "sdpa_ms": 1000 * r.reference_s, "speedup": r.ratio,
                                 "spread": r.spread, "pairs": r.pairs, "snr_db_vs_float64": snr}
        # Heads as a projection leaves them: rows H*D apart. Equal values, so equal outputs.
        qp, kp, vp = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
        op = torch.ops.cosycompile.int8_attention
        r = paired_ratio(lambda: op(qp.contiguous(), kp.contiguous(), vp.contiguous(), mask, scale),
                         lambda: op(qp, kp, vp, mask, scale), pairs=args.pairs, min_seconds=args.min_seconds,
                         probe=lambda: machine_probes(torch, args.threads, a))
        assert torch.equal(op(qp, kp, vp, mask, scale), op(q, k, v, mask, scale))
        out["projected_heads"] = {"copied_ms": 1000 * r.reference_s, "in_place_ms": 1000 * r.candidate_s,
                                  "speedup": r.ratio, "spread": r.spread, "pairs": r.pairs}
        fn = compiled["int8_attention"]
        with torch.profiler.profile() as prof:
            for _ in range(10):
                fn(q, k, v, mask)
    split: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.key == "aten::_int_mm":
            split["INT8 products (_int_mm)"] = ev.self_cpu_time_total / 10 / 1000
        elif ev.key.startswith(("graph_", "cpp_fused")):
            split["fused kernels (scales, quantize, softmax, rescale)"] = (
                split.get("fused kernels (scales, quantize, softmax, rescale)", 0.0) + ev.self_cpu_time_total / 10 / 1000)
    out["int8_split_ms"] = split
    dest = Path(args.artifacts) / "bench" / "int8_attention.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"one attention, batch 2, 8 heads of 64, T={T}, {args.threads} threads, {out['machine']}, torch {out['torch']}")
    print("| variant (Inductor) | ms | vs SDPA FP32 (median, spread, pairs) | output SNR vs float64 |")
    print("|---|---|---|---|")
    for name, row in out["rows"].items():
        print(f"| {name} | {row['ms']:.2f} | {row['speedup']:.2f}x ({row['spread'][0]:.2f}-{row['spread'][1]:.2f}, "
              f"{row['pairs']} pairs) | {row['snr_db_vs_float64']:.1f} dB |")
    ph = out["projected_heads"]
    print(f"\ncosycompile::int8_attention on projected heads: read in place {ph['in_place_ms']:.2f} ms, copied "
          f"contiguous first {ph['copied_ms']:.2f} ms: {ph['speedup']:.3f}x ({ph['spread'][0]:.3f}-"
          f"{ph['spread'][1]:.3f}, {ph['pairs']} pairs)")
    print("\nint8_attention, one call by kernel kind (profiler, 10 calls): "
          + "; ".join(f"{k} {v:.2f} ms" for k, v in split.items()))
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
