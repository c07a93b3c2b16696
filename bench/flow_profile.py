"""Benchmark: where one flow-estimator call of an ONNX Runtime engine spends its time, by operator
type, with the throughput of its FP32 products next to this machine's FP32 GEMM peak.

The CPU RTF of the `cpu-fast` recipe is bounded by the flow (10 estimator calls an utterance). This
tells which part of a call is the bound: the INT8 linears, the FP32 attention products (QK^T and
PV stay FP32 in every CPU recipe), or the element-wise work around them.

Builds (cached) the flow engine of ``--recipe`` on ``--model``, then runs the estimator at ``--frames``
frames, batch 2 (CFG), with ONNX Runtime's profiler on, ``--runs`` times after a warm-up. Per node
it sums kernel time by operator type; for MatMul / FusedMatMul nodes it counts FLOPs from the
shapes the profiler records (2 * output elements * inner dim). The FP32 GEMM peak is torch's
2048^3 matmul on the same threads, in the same run.

Usage: python bench/flow_profile.py [--recipe recipes/cpu-fast.yaml] [--frames 632] [--runs 3]
Writes artifacts/bench/flow_profile.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# FP32 products: the attention's Q.K^T and P.V are MatMul / FusedMatMul nodes as the optimizer leaves
# them, or inside MultiHeadAttention where the backend's attention rewrite fused the chain (whose
# time then includes its softmax and bias add).
PRODUCTS = ("MatMul", "FusedMatMul", "MultiHeadAttention")


def product_flops(event: dict) -> float:
    """FLOPs of one MatMul-like node from its profiled shapes (0 where they are missing)."""
    args = event.get("args", {})
    shapes = [next(iter(d.values())) for d in args.get("input_type_shape", [])]
    outs = [next(iter(d.values())) for d in args.get("output_type_shape", [])]
    if len(shapes) < 2 or not outs or not shapes[0]:
        return 0.0
    a, b = shapes[0], shapes[1]
    if args.get("op_name") == "MultiHeadAttention":
        # query [B, S, D], key [B, T, D]: two products of 2*B*S*T*D each, whatever the head split.
        return 4.0 * a[0] * a[1] * b[1] * a[2]
    # FusedMatMul may transpose A (transA): its inner dim is then A's second-last.
    inner = a[-1] if len(b) < 2 or a[-1] in (b[-2], b[-1]) else a[-2]
    return 2.0 * math.prod(outs[0]) * inner


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-fast.yaml"))
    ap.add_argument("--frames", type=int, default=632, help="mel frames (632: the 10 s eval item with its prompt)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    art = Path(args.artifacts)

    import onnxruntime as ort
    from builtin_models import estimator_inputs, flow_engine
    from torch_backend import gemm_gflops

    from cosycompile.runtime.graphs_dir import read_graphs_dir

    recipe = Path(args.recipe)
    gd = read_graphs_dir(flow_engine(recipe, args.model, art))
    if gd.graphs["flow_estimator"].get("format", "onnx") != "onnx":
        raise SystemExit(f"{recipe.name}: the flow engine is not an ONNX Runtime engine")

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized at build
    so.enable_profiling = True
    tmp = tempfile.mkdtemp(prefix="flow-profile-")
    so.profile_file_prefix = str(Path(tmp) / "ort")
    session = ort.InferenceSession(str(gd.graph_path("flow_estimator")), so, providers=["CPUExecutionProvider"])
    T = args.frames
    feeds = estimator_inputs(np.random.default_rng(0), T)
    session.run(None, feeds)
    # The warm-up's events are in the same file: keep only what follows the last warm-up node.
    for _ in range(args.runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_timed = runs[-args.runs]["ts"] if len(runs) >= args.runs else 0
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first_timed]
    by_op: dict[str, float] = collections.Counter()
    flops = 0.0
    product_us = 0.0
    for e in nodes:
        op = e["args"]["op_name"]
        by_op[op] += e["dur"]
        if op in PRODUCTS:
            flops += product_flops(e)
            product_us += e["dur"]
    total_us = sum(by_op.values())
    run_ms = [r["dur"] / 1000 for r in runs[-args.runs:]]
    peak = gemm_gflops("float32", args.threads)
    out = {
        "model": args.model, "recipe": recipe.name, "frames": T, "runs": args.runs, "threads": args.threads,
        "ort": ort.__version__, "call_ms": float(np.median(run_ms)), "fp32_gemm_gflops": peak,
        "ops": {op: {"ms_per_call": us / 1000 / args.runs, "share": us / total_us} for op, us in by_op.most_common()},
        "fp32_products": {"gflop_per_call": flops / 1e9 / args.runs, "ms_per_call": product_us / 1000 / args.runs,
                          "gflops": flops / (product_us * 1e-6) / 1e9 if product_us else 0.0},
    }
    dest = art / "bench" / "flow_profile.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    p = out["fp32_products"]
    print(f"{args.model}, {recipe.name} flow estimator, T={T}, batch 2, {args.threads} threads, ONNX Runtime "
          f"{ort.__version__}: {out['call_ms']:.0f} ms a call (median of {args.runs}, profiler on)")
    print(f"FP32 MatMul/FusedMatMul/MultiHeadAttention: {p['gflop_per_call']:.1f} GFLOP a call in {p['ms_per_call']:.0f} ms = "
          f"{p['gflops']:.0f} GFLOP/s; this machine's FP32 GEMM (torch 2048^3): {peak:.0f} GFLOP/s")
    print("| operator | ms a call | share |")
    print("|---|---|---|")
    for op, row in list(out["ops"].items())[:14]:
        print(f"| {op} | {row['ms_per_call']:.1f} | {100 * row['share']:.1f} % |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
