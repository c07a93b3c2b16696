"""Benchmark: what bounds the LLM decode step, with no compiler in the way. The eager PyTorch step of
a built-in model's LM (``builtin:random-0.5b`` shapes by default, weights drawn on the device) in
FP32 and in BF16 (the whole module cast, rotary angles kept in float32), decoded through the
growing cache (``LLMDecodeStep``) and through the static cache (``LLMStaticStep`` with
``StaticCacheDecoder``: on a GPU one CUDA graph replay per token), against:
- the FP32 eager growing-cache step, in interleaved pairs (median of per-pair ratios, spread);
- the floor: bytes one step reads (weights in that dtype + the mean KV cache) / the device's memory
  throughput measured in the same run (the larger of a tensor copy's and a GEMV's, as in llm_decode);
- quality: logit cosine of the step against the FP32 step on the same 72 positions (prefill).

It needs no build, so it fits where compile time does not (a short lease on a GPU machine); the
AOTInductor packages of bench/llm_decode.py are what a recipe deploys, this is their eager bound.

Usage: python bench/decode_bound.py [--device auto|cpu|cuda] [--dtypes fp32,bf16] [--batches 1,8]
Writes artifacts/bench/decode_bound-<device>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any, Callable

from builtin_models import machine
from llm_decode import stream_bytes_per_s, decoder

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def decode_run(torch: Any, lm: Any, device: str, dtype: Any, batch: int, past: int, tokens: int,
               static: bool) -> Callable[[], None]:
    """``tokens`` one-token steps of ``lm`` from a random past of ``past`` positions."""
    from cosycompile.backends.torch.static_decode import StaticCacheDecoder
    from cosycompile.families.qwen2_steps import LLMDecodeStep, LLMStaticStep

    c = lm.cfg
    shape = dict(layers=c.num_layers, kv_heads=c.num_kv_heads, head_dim=c.head_dim, hidden=c.hidden_size)
    if static:
        return decoder(None, torch, device, batch, past, tokens, **shape, dtype=dtype,
                       static=StaticCacheDecoder(LLMStaticStep(lm).eval(), device))
    return decoder(LLMDecodeStep(lm).eval(), torch, device, batch, past, tokens, **shape, dtype=dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="random-0.5b", help="built-in model whose LM shapes are used")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--past", type=int, default=120, help="positions already in the KV cache")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per timed run")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import numpy as np
    import torch

    from cosycompile.families.cosyvoice2.config import PRESETS
    from cosycompile.families.cosyvoice2.loader import BUILDERS
    from cosycompile.families.qwen2_steps import LLMDecodeStep
    from cosycompile.validate.metrics import logit_cosine
    from cosycompile.validate.speed import paired_ratio

    torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    torch.manual_seed(0)
    with torch.device(device):
        lm = BUILDERS["llm"](PRESETS[args.preset]).eval()
    c = lm.cfg
    models = {"fp32": lm}
    for name in args.dtypes.split(","):
        if name != "fp32":
            models[name] = copy.deepcopy(lm).to(dtypes[name])

    gen = torch.Generator().manual_seed(1)
    prefill = (0.02 * torch.randn(1, 72, c.hidden_size, generator=gen)).to(device)
    empty = torch.zeros(c.num_layers, 2, 1, c.num_kv_heads, 0, c.head_dim, device=device)
    with torch.inference_mode():
        ref_logits = LLMDecodeStep(lm).eval()(prefill, empty)[0][0].float().cpu().numpy()
    streams = stream_bytes_per_s(torch, device)
    bandwidth = streams["floor"]
    out: dict[str, Any] = {"preset": args.preset, "device": device, "past": args.past, "tokens": args.tokens,
                           "pairs": args.pairs, "torch": torch.__version__, "copy_gb_per_s": streams["copy"] / 1e9,
                           "read_gb_per_s": streams["read"] / 1e9,
                           "machine": (f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" if device == "cuda"
                                       else f"{machine()}, {args.threads} threads"), "rows": []}
    # What a step reads: every weight but the token embedding (the step takes embeddings as input).
    skip = {id(lm.qwen.model.embed_tokens.weight), id(lm.speech_embedding.weight), id(lm.llm_embedding.weight)}
    params = sum(p.numel() for p in lm.parameters() if id(p) not in skip)
    for batch in (int(b) for b in args.batches.split(",")):
        reference = decode_run(torch, lm, device, torch.float32, batch, args.past, args.tokens, static=False)
        for name, model in models.items():
            dtype = dtypes[name]
            with torch.inference_mode():
                logits = LLMDecodeStep(model).eval()(prefill.to(dtype), empty.to(dtype))[0][0].float().cpu().numpy()
            cosine = logit_cosine(ref_logits, logits)
            size = torch.finfo(dtype).bits // 8
            kv = batch * c.num_layers * 2 * c.num_kv_heads * c.head_dim * size * (args.past + args.tokens / 2)
            floor_ms = 1000 * (params * size + kv) / bandwidth
            for static in (False, True):
                cand = decode_run(torch, model, device, dtype, batch, args.past, args.tokens, static)
                r = paired_ratio(reference, cand, pairs=args.pairs)
                out["rows"].append({
                    "dtype": name, "loop": "static cache" + (", CUDA graph" if device == "cuda" else "")
                    if static else "growing cache", "batch": batch,
                    "ms_per_token": 1000 * r.candidate_s / args.tokens,
                    "fp32_eager_ms_per_token": 1000 * r.reference_s / args.tokens, "speedup": r.ratio,
                    "spread": r.spread, "pairs": r.pairs, "floor_ms_per_token": floor_ms,
                    "weight_bytes": params * size, "logit_cosine": cosine})
                row = out["rows"][-1]
                print(f"  {name} {row['loop']} batch {batch}: {row['ms_per_token']:.3f} ms/token", flush=True)
    dest = Path(args.artifacts) / "bench" / f"decode_bound-{device}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    print(f"{args.preset} LM decode step, eager PyTorch, on {out['machine']}, torch {torch.__version__}; past "
          f"{args.past}, {args.tokens} tokens a run; copy throughput {out['copy_gb_per_s']:.0f} GB/s (read + write), "
          f"GEMV read {out['read_gb_per_s']:.0f} GB/s; the floor divides by the larger")
    print("| dtype | decode loop | batch | ms/token | vs FP32 eager growing cache (median, spread, pairs) | "
          "floor ms/token (weights MB) | logit cosine |")
    print("|---|---|---|---|---|---|---|")
    for row in out["rows"]:
        print(f"| {row['dtype']} | {row['loop']} | {row['batch']} | {row['ms_per_token']:.3f} | {row['speedup']:.2f}x "
              f"({row['spread'][0]:.2f}-{row['spread'][1]:.2f}, {row['pairs']}; FP32 {row['fp32_eager_ms_per_token']:.3f} ms)"
              f" | {row['floor_ms_per_token']:.3f} ({row['weight_bytes'] / 1e6:.0f}) | {row['logit_cosine']:.4f} |")
    print(f"result: {dest}")
    return 0 if all(np.isfinite(r["ms_per_token"]) for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
