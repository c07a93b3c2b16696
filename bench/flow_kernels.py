"""Benchmark: kernel alternatives for the flow estimator's costliest parts on this CPU, each against
what the `cpu-fast` engine runs now, in interleaved pairs.

bench/flow_profile.py shows the estimator's FP32 attention products at ~95 % of the FP32 GEMM peak.
This asks whether another kernel beats them, at the estimator's own shapes (batch 2 for CFG, 8 heads
of 64, ``--frames`` frames):
- attention: ONNX Runtime's unfused pattern as the exporter writes it (head transposes, QK^T, scale,
  mask add, softmax, PV) against ONNX Runtime's fused MultiHeadAttention op, and torch's
  scaled_dot_product_attention and plain matmul-softmax-matmul in FP32 and BF16 (GFLOP/s of the two
  products each);
- Mish: the `cpu-fast` estimator as built against the same graph with every
  ``x * tanh(softplus(x))`` written as ONNX's Mish op (opset 18), whole calls, with the largest
  output difference.

Usage: python bench/flow_kernels.py [--frames 632] [--pairs 15]
Writes artifacts/bench/flow_kernels.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HEADS, HEAD_DIM = 8, 64


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


def fuse_mish(model: Any) -> int:
    """Rewrite every ``Mul(x, Tanh(Softplus(x)))`` whose intermediates feed nothing else as Mish(x)."""
    from onnx import helper

    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    drop, replace = set(), {}
    for mul in graph.node:
        if mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        for x, t in (mul.input, mul.input[::-1]):
            tanh = producer.get(t)
            soft = producer.get(tanh.input[0]) if tanh is not None and tanh.op_type == "Tanh" else None
            if soft is None or soft.op_type != "Softplus" or soft.input[0] != x or uses[t] != 1 or uses[tanh.input[0]] != 1:
                continue
            drop |= {id(tanh), id(soft)}
            replace[id(mul)] = helper.make_node("Mish", [x], list(mul.output))
            break
    kept = [replace.get(id(n), n) for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    return len(replace)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=632)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    art = Path(args.artifacts)

    import onnx
    import torch
    import torch.nn.functional as F
    from builtin_models import estimator_inputs, flow_engine

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

    engine = flow_engine(REPO / "recipes" / "cpu-fast.yaml", args.model, art)
    path = read_graphs_dir(engine).graph_path("flow_estimator")
    model = onnx.load(str(path))
    fused = fuse_mish(model)
    with tempfile.TemporaryDirectory() as tmp:
        fused_path = str(Path(tmp) / "mish.onnx")
        onnx.save(model, fused_path)
        as_built, with_mish = (ort_session(str(p), args.threads, "disable") for p in (path, fused_path))
    est = estimator_inputs(rng, T)
    diff = float(np.abs(as_built.run(None, est)[0] - with_mish.run(None, est)[0]).max())
    m = paired_ratio(lambda: as_built.run(None, est), lambda: with_mish.run(None, est), pairs=max(args.pairs // 3, 3))
    out = {"model": args.model, "frames": T, "threads": args.threads, "torch": torch.__version__,
           "attention": rows, "mish": {"fused": fused, "speedup": m.ratio, "spread": m.spread, "pairs": m.pairs,
                                       "call_ms": 1000 * m.candidate_s, "max_abs_diff": diff}}
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
    print(f"Mish: {fused} fused in the cpu-fast estimator; whole call {out['mish']['call_ms']:.0f} ms, {m.ratio:.2f}x "
          f"({m.spread[0]:.2f}-{m.spread[1]:.2f}, {m.pairs} pairs) against as built; max output difference {diff:.1e}")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
