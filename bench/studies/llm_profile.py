"""Benchmark: where one token of the ONNX Runtime LLM decode step goes, by operator, at several cache lengths.

Builds ``--recipe``'s LLM engine with the backend rewrites ``--rewrites`` (through the normal cached
build graph), then for each ``--past`` times one-token steps without the profiler (median) and with
ONNX Runtime's profiler on (per-operator kernel time a step; the profiler inflates small nodes, so
compare rows, not the sum with the unprofiled step). The stacked cache (``--rewrites attention mish``)
shows what the ``kv_cache`` rewrite removes: Split, Concat and Reshape time that grows with the cache.

Usage: python bench/studies/llm_profile.py [--recipe recipes/cpu-fast.yaml] [--rewrites attention mish kv_cache]
       [--past 0 300 600] [--steps 40]
Writes artifacts/bench/llm_profile.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for builtin_models
from builtin_models import machine, rewrite_variants

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-fast.yaml"))
    ap.add_argument("--rewrites", nargs="*", default=["attention", "mish", "kv_cache"])
    ap.add_argument("--past", type=int, nargs="+", default=[0, 300, 600], help="cached positions")
    ap.add_argument("--steps", type=int, default=40, help="steps timed (and then profiled) per cache length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12, help="operators shown")
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()
    art = Path(args.artifacts)

    import onnxruntime as ort

    from cosycompile.backends.onnxruntime.kv_cache import layer_names
    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.loading import stage_runtime

    name = "-".join(args.rewrites) or "none"
    engine = rewrite_variants(Path(args.recipe), args.model, art, "llm", {name: args.rewrites}, "llm-profile")[name]
    rt = stage_runtime("llm", engine, args.threads)
    graph = read_graphs_dir(engine).graph_path("llm_step")
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((1, 1, rt.speech_embedding.shape[1]), dtype=np.float32) * 0.05
    rows = []
    for past in args.past:
        cache = rng.standard_normal((rt.num_layers, 2, 1, rt.kv_heads, past, rt.head_dim), dtype=np.float32)
        # Each step restarts from the same cache: every timed step sees ``past`` positions.
        times = []
        for i in range(args.steps + 3):
            step = rt.decoding(cache, 1)
            t = time.perf_counter()
            step(emb)
            if i >= 3:
                times.append(time.perf_counter() - t)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.enable_profiling = True
        with tempfile.TemporaryDirectory() as tmp:
            so.profile_file_prefix = str(Path(tmp) / "llm")
            sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
            names = {i.name for i in sess.get_inputs()}
            feeds = {"inputs_embeds": emb}
            if "past_key_values" in names:
                feeds["past_key_values"] = cache
            else:
                views = [np.ascontiguousarray(cache[i, j]) for i in range(rt.num_layers) for j in range(2)]
                feeds.update(zip(layer_names("past_key_values", rt.num_layers), views))
            for _ in range(args.steps):
                sess.run(None, feeds)
            events = json.loads(Path(sess.end_profiling()).read_text())
        by_op: dict[str, float] = defaultdict(float)
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_op[e["args"]["op_name"]] += e["dur"] / 1000 / args.steps
        rows.append({"past": past, "step_ms": 1000 * float(np.median(times)), "op_ms": dict(by_op)})
    out = {"model": args.model, "recipe": Path(args.recipe).name, "rewrites": args.rewrites, "threads": args.threads,
           "machine": machine(), "rows": rows}
    dest = art / "bench" / "llm_profile.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    ops = sorted(rows[-1]["op_ms"], key=lambda k: -rows[-1]["op_ms"][k])[:args.top]
    print(f"{out['recipe']}'s LLM decode step, rewrites {args.rewrites}, {args.threads} threads, on {out['machine']}")
    print("| cached positions | step, no profiler | " + " | ".join(ops) + " |")
    print("|---|---|" + "---|" * len(ops))
    for r in rows:
        print(f"| {r['past']} | {r['step_ms']:.1f} ms | " + " | ".join(f"{r['op_ms'].get(o, 0):.2f}" for o in ops) + " |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
