"""Benchmark: the torch backend (AOTInductor packages) against ONNX Runtime FP32 engines on
builtin:random-0.5b, flow estimator and HiFT, in ONE run with interleaved pairs.

Builds through the normal cached build graph: the flow and HiFT engines of recipes/cpu-fp32.yaml
(ONNX Runtime FP32) and recipes/cpu-torch.yaml (AOTInductor FP32), the flow of cpu-torch with
``quantize: {format: bf16}`` (torch_autocast), with ``{format: int8}`` (torch_dynamic: INT8
linears through torch._int_mm) and with ``{format: int8, attention: int8}`` (the attention products
too, as recipes/cpu-torch-int8.yaml builds it), and the flow of recipes/cpu-int8-dynamic.yaml (ONNX
Runtime dynamic INT8) for comparison. Then, same inputs, same thread count:
- flow estimator: one call at T frames, batch 2 (CFG), against the ONNX Runtime FP32 engine and, for
  the torch packages, against the torch FP32 package (their own FP32 engine); mel SNR after the
  full 10-step CFM against the PyTorch FP32 reference with identical noise;
- HiFT: mel -> wav for T frames; waveform SNR against the PyTorch FP32 reference;
- the compute bound: FLOPs of one estimator call (torch's FLOP counter) and the GEMM throughput of
  this machine measured in the same run (2048^3 matmul, FP32 and BF16).

Usage: python bench/torch_backend.py [--frames 500] [--threads 2] [--pairs 5]
Writes artifacts/bench/torch_backend.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from builtin_models import add_min_seconds, machine, machine_probes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(recipe_body: dict, name: str, stages: tuple[str, ...], art: Path) -> dict[str, Path]:
    """Engine dirs of ``stages`` for a derived recipe (and the model dir), through the cached build graph."""
    from builtin_models import build_steps

    out = build_steps(recipe_body, name, [f"{s}.engine" for s in stages] + ["model"], art)
    return {s: out[f"{s}.engine"] for s in stages} | {"model": out["model"]}


def gemm_gflops(dtype: str, threads: int, n: int = 2048, reps: int = 5) -> float:
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(n, n).to(getattr(torch, dtype))
    b = torch.randn(n, n).to(getattr(torch, dtype))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    add_min_seconds(ap)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    art = Path(args.artifacts)
    common = {"model": args.model, "validation": {"max_items": 1, "speed": {"threads": args.threads}}}
    t0 = time.perf_counter()
    ort_e = build({"extends": str(REPO / "recipes" / "cpu-fp32.yaml"), **common}, "bench-ort-fp32", ("flow", "hift"), art)
    aoti = build({"extends": str(REPO / "recipes" / "cpu-torch.yaml"), **common}, "bench-torch-fp32", ("flow", "hift"), art)
    bf16 = build({"extends": str(REPO / "recipes" / "cpu-torch.yaml"), **common,
                  "stages": {"flow": {"quantize": {"format": "bf16"}}}}, "bench-torch-bf16", ("flow",), art)
    int8 = build({"extends": str(REPO / "recipes" / "cpu-torch.yaml"), **common,
                  "stages": {"flow": {"quantize": {"format": "int8"}}}}, "bench-torch-int8", ("flow",), art)
    int8_attn = build({"extends": str(REPO / "recipes" / "cpu-torch.yaml"), **common,
                       "stages": {"flow": {"quantize": {"format": "int8", "attention": "int8"}}}},
                      "bench-torch-int8-attention", ("flow",), art)
    ort_int8 = build({"extends": str(REPO / "recipes" / "cpu-int8-dynamic.yaml"), **common}, "bench-ort-int8-dynamic",
                     ("flow",), art)
    build_s = time.perf_counter() - t0

    import torch
    # A submodule torch does not import by itself; a build in this process imported it, a fully
    # cached run does not.
    import torch.utils.flop_counter
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from builtin_models import estimator_inputs

    from cosycompile.reference.runners import load_reference, reference_runtime
    from cosycompile.runtime.loading import stage_runtime
    from cosycompile.runtime.pipeline import Prompt
    from cosycompile.validate.machine_state import ratio_by_state
    from cosycompile.validate.metrics import mel_snr_db, waveform_snr_db
    from cosycompile.validate.speed import paired_ratio

    square = torch.randn(1024, 1024)

    def probe() -> dict:
        return machine_probes(torch, args.threads, square)

    models = load_reference(ort_e["model"], ("flow", "hift"), args.threads)
    rng = np.random.default_rng(0)
    T = args.frames
    feeds = tuple(estimator_inputs(rng, T).values())
    flows = {"onnxruntime fp32": stage_runtime("flow", ort_e["flow"], args.threads),
             "torch fp32": stage_runtime("flow", aoti["flow"], args.threads),
             "torch bf16": stage_runtime("flow", bf16["flow"], args.threads),
             "torch int8 (torch._int_mm)": stage_runtime("flow", int8["flow"], args.threads),
             "torch int8, int8 attention": stage_runtime("flow", int8_attn["flow"], args.threads),
             "onnxruntime dynamic int8": stage_runtime("flow", ort_int8["flow"], args.threads)}
    tokens = rng.integers(0, 6561, T // 2)
    prompt = Prompt.empty()
    prompt.embedding = rng.standard_normal(192).astype(np.float32)
    ref_mel = reference_runtime("flow", models).mel(tokens, prompt)
    est = models.flow.decoder.estimator
    # The math backend: torch's FLOP counter has no entry for the CPU flash-attention kernel, and
    # would leave the attention products (a third of the call) out of the count.
    with (torch.no_grad(), sdpa_kernel([SDPBackend.MATH]),
          torch.utils.flop_counter.FlopCounterMode(display=False) as fc):
        est(*(torch.from_numpy(f) for f in feeds))
    out: dict = {"model": args.model, "threads": args.threads, "frames": T, "pairs": args.pairs,
                 "min_seconds": args.min_seconds,
                 "machine": machine(),
                 "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                 "build_seconds": build_s, "estimator_gflop": fc.get_total_flops() / 1e9,
                 "gemm_gflops": {d: gemm_gflops(d, args.threads) for d in ("float32", "bfloat16")}, "flow": {}, "hift": {}}
    base = flows["onnxruntime fp32"]
    for name, rt in flows.items():
        r = paired_ratio(lambda: base.estimator_call(*feeds), lambda: rt.estimator_call(*feeds), pairs=args.pairs,
                         min_seconds=args.min_seconds, probe=probe)
        out["flow"][name] = {"ms": 1000 * r.candidate_s, "ort_fp32_ms": 1000 * r.reference_s, "speedup": r.ratio,
                             "spread": r.spread, "pairs": r.pairs, "by_state": ratio_by_state(r),
                             "gflops": out["estimator_gflop"] / r.candidate_s,
                             "mel_snr_db_after_cfm": mel_snr_db(ref_mel, rt.mel(tokens, prompt))}
        if name.startswith("torch") and name != "torch fp32":
            own = flows["torch fp32"]
            r = paired_ratio(lambda: own.estimator_call(*feeds), lambda: rt.estimator_call(*feeds), pairs=args.pairs,
                             min_seconds=args.min_seconds, probe=probe)
            out["flow"][name]["vs_own_fp32"] = {"speedup": r.ratio, "spread": r.spread, "pairs": r.pairs,
                                                "torch_fp32_ms": 1000 * r.reference_s, "ms": 1000 * r.candidate_s}
    mel = ref_mel.astype(np.float32)
    hifts = {"onnxruntime fp32": stage_runtime("hift", ort_e["hift"], args.threads),
             "torch fp32": stage_runtime("hift", aoti["hift"], args.threads)}
    ref_wav = reference_runtime("hift", models).wav(mel, seed=0)
    hbase = hifts["onnxruntime fp32"]
    for name, rt in hifts.items():
        r = paired_ratio(lambda: hbase.wav(mel, seed=0), lambda: rt.wav(mel, seed=0), pairs=args.pairs,
                         min_seconds=args.min_seconds, probe=probe)
        out["hift"][name] = {"ms": 1000 * r.candidate_s, "ort_fp32_ms": 1000 * r.reference_s, "speedup": r.ratio,
                             "spread": r.spread, "pairs": r.pairs, "by_state": ratio_by_state(r),
                             "waveform_snr_db": waveform_snr_db(ref_wav, rt.wav(mel, seed=0))}
    dest = art / "bench" / "torch_backend.json"
    dest.write_text(json.dumps(out, indent=1, default=float))
    print(f"{args.model}, T={T} frames, {args.threads} threads, {out['machine']}, torch {out['torch']} "
          f"({out['cpu_capability']}); GEMM {out['gemm_gflops']['float32']:.0f} GFLOP/s fp32, "
          f"{out['gemm_gflops']['bfloat16']:.0f} bf16; estimator call {out['estimator_gflop']:.1f} GFLOP")
    print("| stage | engine | ms | vs ONNX Runtime FP32 (median of pairs, spread) | vs torch FP32 (same) | "
          "quality vs PyTorch FP32 |")
    print("|---|---|---|---|---|---|")
    for name, f in out["flow"].items():
        own = f.get("vs_own_fp32")
        own_cell = f"{own['speedup']:.2f}x ({own['spread'][0]:.2f}-{own['spread'][1]:.2f}, {own['pairs']} pairs)" if own else ""
        print(f"| flow estimator (batch 2) | {name} | {f['ms']:.0f} | {f['speedup']:.2f}x ({f['spread'][0]:.2f}-"
              f"{f['spread'][1]:.2f}, {f['pairs']} pairs) | {own_cell} | mel SNR {f['mel_snr_db_after_cfm']:.1f} dB "
              f"after 10 CFM steps; {f['gflops']:.0f} GFLOP/s |")
    for name, h in out["hift"].items():
        print(f"| HiFT | {name} | {h['ms']:.0f} | {h['speedup']:.2f}x ({h['spread'][0]:.2f}-{h['spread'][1]:.2f}, "
              f"{h['pairs']} pairs) | | waveform SNR {h['waveform_snr_db']:.1f} dB |")
    print("\nBy the machine's state before each pair (threads win or lose to one thread on a small parallel op):")
    print("| stage | engine | state | pairs | ONNX Runtime FP32 ms | engine ms | speed-up | copy GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for stage, rows in (("flow estimator", out["flow"]), ("HiFT", out["hift"])):
        for name, row in rows.items():
            for state, st in row["by_state"].items():
                print(f"| {stage} | {name} | {state.replace('_', ' ')} | {st['pairs']} | {1000 * st['reference_s']:.0f} | "
                      f"{1000 * st['built_s']:.0f} | {st['speedup']:.2f}x | {st['copy_gb_per_s']:.0f} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
