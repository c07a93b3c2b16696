"""Benchmark: kernel alternatives for the flow estimator's costliest parts on this CPU, each against
what the `cpu-fast` engine runs now, in interleaved pairs.

bench/flow_profile.py shows the estimator's FP32 attention products near the FP32 GEMM peak
(docs/bench-log/2026-11-25-cpu-flow-bound-zen4.md).
This asks whether another kernel beats them, at the estimator's own shapes (batch 2 for CFG, 8 heads
of 64, ``--frames`` frames):
- attention: ONNX Runtime's unfused pattern as the exporter writes it (head transposes, QK^T, scale,
  mask add, softmax, PV) against ONNX Runtime's fused MultiHeadAttention op, and torch's
  scaled_dot_product_attention and plain matmul-softmax-matmul in FP32 and BF16 (GFLOP/s of the two
  products each);
- whole estimator calls of ``--recipe``'s flow engine built with the ONNX Runtime backend's rewrites
  (fused attention, the rational Mish: each alone and both, the default) against the same engine
  built with ``rewrites: []`` (the offline optimizer's graph), in interleaved pairs for at least
  ``--min-seconds`` each, with the largest output difference. Kernels timed alone spread widely from
  pair to pair, so the whole call is the figure.

Usage: python bench/studies/flow_kernels.py [--recipe recipes/cpu-fast.yaml] [--frames 632] [--pairs 15]
       [--min-seconds 30]
Writes artifacts/bench/flow_kernels.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for builtin_models
from builtin_models import add_min_seconds, estimator_inputs, machine, machine_probes, rewrite_variants

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

HEADS, HEAD_DIM = 8, 64
# Engine builds compared whole-call against the optimizer's graph ("none").
REWRITE_SETS = {"none": [], "attention": ["attention"], "mish": ["mish"], "both": ["attention", "mish"]}


def ort_session(model: Any, threads: int, level: str = "extended") -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if level == "extended"
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def attention_graphs(batch: int, frames: int) -> tuple[Any, Any]:
    """(the exporter's unfused attention, ONNX Runtime's MultiHeadAttention) over q, k, v [B, T, H*D]
    and an additive mask [B, 1, T, T]."""
    from onnx import TensorProto, helper

    D = HEADS * HEAD_DIM
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, frames, D]) for n in "qkv"]
    ins.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, frames, frames]))
    out = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [batch, frames, D])]
    split = helper.make_tensor("split", TensorProto.INT64, [4], [batch, frames, HEADS, HEAD_DIM])
    merge = helper.make_tensor("merge", TensorProto.INT64, [3], [batch, frames, D])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [HEAD_DIM ** -0.5])
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [n, "split"], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}h"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Add", ["ss", "mask"], ["sm"]), helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["a"]), helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["at", "merge"], ["o"])]
    unfused = helper.make_model(helper.make_graph(nodes, "attention", ins, out, initializer=[split, merge, scale]),
                                opset_imports=[helper.make_opsetid("", 18)])
    mha = helper.make_model(
        helper.make_graph([helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "mask"], ["o"],
                                            domain="com.microsoft", num_heads=HEADS)], "mha", ins, out),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    return unfused, mha


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-fast.yaml"))
    ap.add_argument("--frames", type=int, default=632)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    add_min_seconds(ap)
    args = ap.parse_args()
    art = Path(args.artifacts)

    import torch
    import torch.nn.functional as F

    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.validate.speed import paired_ratio

    torch.set_num_threads(args.threads)
    B, T = 2, args.frames
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, HEADS * HEAD_DIM), dtype=np.float32) for _ in range(3))
    feeds = {"q": q, "k": k, "v": v, "mask": np.zeros((B, 1, T, T), np.float32)}
    unfused, mha = attention_graphs(B, T)
    s_unfused, s_mha = ort_session(unfused, args.threads), ort_session(mha, args.threads)
    want = s_unfused.run(None, feeds)[0]
    heads = [torch.from_numpy(a).view(B, T, HEADS, HEAD_DIM).transpose(1, 2).contiguous() for a in (q, k, v)]
    bf16 = [h.bfloat16() for h in heads]

    def torch_math(qh: Any, kh: Any, vh: Any) -> Any:
        return torch.softmax(qh @ kh.transpose(-1, -2) * HEAD_DIM ** -0.5, dim=-1) @ vh

    candidates: dict[str, Callable[[], Any]] = {
        "ONNX Runtime MultiHeadAttention (FP32)": lambda: s_mha.run(None, feeds)[0],
        "torch scaled_dot_product_attention FP32": lambda: F.scaled_dot_product_attention(*heads),
        "torch scaled_dot_product_attention BF16": lambda: F.scaled_dot_product_attention(*bf16),
        "torch matmul-softmax-matmul BF16": lambda: torch_math(*bf16),
    }
    flops = 4.0 * B * HEADS * T * T * HEAD_DIM
    rows = []
    with torch.inference_mode():
        for name, fn in candidates.items():
            got = fn()
            got = got if isinstance(got, np.ndarray) else got.float().transpose(1, 2).reshape(B, T, -1).numpy()
            r = paired_ratio(lambda: s_unfused.run(None, feeds), fn, pairs=args.pairs, warmup=2)
            rows.append({"kernel": name, "ms": 1000 * r.candidate_s, "reference_ms": 1000 * r.reference_s,
                         "gflops": flops / r.candidate_s / 1e9, "reference_gflops": flops / r.reference_s / 1e9,
                         "speedup": r.ratio, "spread": r.spread, "pairs": r.pairs,
                         "max_abs_error": float(np.abs(got - want).max())})

    engines = rewrite_variants(Path(args.recipe), args.model, art, "flow", REWRITE_SETS, "flow-rewrites")
    sessions = {n: ort_session(str(read_graphs_dir(e).graph_path("flow_estimator")), args.threads, "disable")
                for n, e in engines.items()}
    est = estimator_inputs(rng, T)
    plain = sessions.pop("none")
    base = plain.run(None, est)[0]
    a = torch.randn(1024, 1024)
    whole = []
    for name, sess in sessions.items():
        diff = float(np.abs(sess.run(None, est)[0] - base).max())
        r = paired_ratio(lambda: plain.run(None, est), lambda s=sess: s.run(None, est), pairs=3,
                         min_seconds=args.min_seconds, probe=lambda: machine_probes(torch, args.threads, a))
        whole.append({"rewrites": REWRITE_SETS[name], "call_ms": 1000 * r.candidate_s,
                      "plain_call_ms": 1000 * r.reference_s, "speedup": r.ratio, "spread": r.spread,
                      "pairs": r.pairs, "max_abs_diff": diff})
    out = {"model": args.model, "recipe": Path(args.recipe).name, "frames": T, "threads": args.threads,
           "machine": machine(), "torch": torch.__version__, "attention": rows, "whole_call": whole}
    dest = art / "bench" / "flow_kernels.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"attention at the flow estimator's shape (batch {B}, {HEADS} heads x {HEAD_DIM}, T={T}), {args.threads} "
          f"threads, against ONNX Runtime's unfused FP32 pattern ({rows[0]['reference_ms']:.1f} ms, "
          f"{rows[0]['reference_gflops']:.0f} GFLOP/s of products)")
    print("| kernel | ms | GFLOP/s | vs unfused ONNX Runtime (median, spread, pairs) | max abs error |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['ms']:.1f} | {r['gflops']:.0f} | {r['speedup']:.2f}x ({r['spread'][0]:.2f}-"
              f"{r['spread'][1]:.2f}, {r['pairs']}) | {r['max_abs_error']:.1e} |")
    print(f"\nwhole estimator calls of {out['recipe']}'s flow engine (T={T}) against it built with rewrites: []")
    print("| rewrites | ms a call (plain) | vs plain (median, spread, pairs) | max output difference |")
    print("|---|---|---|---|")
    for w in whole:
        print(f"| {', '.join(w['rewrites'])} | {w['call_ms']:.0f} ({w['plain_call_ms']:.0f}) | {w['speedup']:.2f}x "
              f"({w['spread'][0]:.2f}-{w['spread'][1]:.2f}, {w['pairs']}) | {w['max_abs_diff']:.1e} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
