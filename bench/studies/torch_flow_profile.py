"""Study: where one flow-estimator call of a torch recipe's quantized program spends its time on this CPU,
by kernel (torch's profiler over the program compiled by Inductor with kernel profiling on).

Builds ``--recipe``'s ``flow.quantize`` step on ``--model`` through the cached build graph (LLM and HiFT
off), compiles the estimator program with ``torch.compile`` (freezing on, as the torch backend's
packages are built; JIT rather than AOTInductor, whose packages record no kernels), and profiles
``--calls`` calls at ``--frames`` frames, batch 2. Inductor's fused kernels are named after the ops
they fuse; extern calls (``aten::_int_mm``, ``aten::mkldnn_convolution``, the attention kernel) keep
their own names (``cosycompile::int8_attention`` for INT8 attention). ``--attention fp32`` profiles the
recipe's flow with the attention products left FP32.

Usage: python bench/studies/torch_flow_profile.py [--recipe recipes/cpu-torch-int8.yaml] [--frames 632]
       [--attention fp32]
Writes artifacts/bench/torch_flow_profile.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-torch-int8.yaml"))
    ap.add_argument("--model", default="builtin:random-0.5b")
    ap.add_argument("--frames", type=int, default=632)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--attention", choices=("recipe", "fp32"), default="recipe",
                    help="'fp32': the recipe's flow quantize block with the attention products left FP32")
    ap.add_argument("--artifacts", default=str(REPO / "artifacts"))
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch._inductor.config as inductor

    from builtin_models import build_steps, estimator_inputs, machine
    from cosycompile.recipe.schema import load_recipe
    from cosycompile.runtime.graphs_dir import read_graphs_dir
    from cosycompile.runtime.torch_programs import load_program

    flow: dict = {}
    if args.attention == "fp32":
        flow["quantize"] = {**load_recipe(args.recipe).stage("flow").quantize, "attention": "fp32"}
    body = {"extends": str(Path(args.recipe).resolve()), "model": args.model,
            "stages": {"llm": {"enabled": False}, "hift": {"enabled": False}, "flow": flow}}
    name = f"bench-torch-flow-profile-{Path(args.recipe).stem}-{args.attention}"
    graphs = build_steps(body, name, ["flow.quantize"], Path(args.artifacts))["flow.quantize"]
    program = load_program(read_graphs_dir(graphs).graph_path("flow_estimator")).module()

    torch.set_num_threads(args.threads)
    inductor.cpp.enable_kernel_profile = True
    inductor.freezing = True
    feeds = [torch.from_numpy(a) for a in estimator_inputs(np.random.default_rng(0), args.frames).values()]
    compiled = torch.compile(program, dynamic=False)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(*feeds)
        compile_s = time.perf_counter() - t0
        for _ in range(2):
            compiled(*feeds)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            compiled(*feeds)
        wall_ms = (time.perf_counter() - t0) / args.calls * 1000
        with torch.profiler.profile() as prof:
            for _ in range(args.calls):
                compiled(*feeds)
    rows = []
    # Self times do not overlap, so every event with some (aten::, mkldnn::, Inductor's kernels, the
    # compiled region's own Python) adds up to the profiled call; the linears are mkldnn:: ops.
    for ev in prof.key_averages():
        if ev.self_cpu_time_total > 0:
            rows.append({"kernel": ev.key, "ms_a_call": ev.self_cpu_time_total / args.calls / 1000,
                         "calls_a_call": ev.count / args.calls})
    rows.sort(key=lambda r: -r["ms_a_call"])
    total = sum(r["ms_a_call"] for r in rows)
    out = {"machine": machine(), "torch": torch.__version__, "recipe": Path(args.recipe).stem,
           "attention": args.attention, "frames": args.frames, "threads": args.threads, "compile_s": compile_s,
           "wall_ms_a_call": wall_ms, "ms_a_call": total, "rows": rows}
    dest = Path(args.artifacts) / "bench" / "torch_flow_profile.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"{out['recipe']} flow estimator (attention {args.attention}), T={args.frames}, batch 2, {args.threads} "
          f"threads, {out['machine']}; {wall_ms:.0f} ms a call unprofiled, "
          f"{total:.0f} ms profiled")
    print("| kernel | ms a call | share | calls a call |")
    print("|---|---|---|---|")
    for r in rows[:15]:
        print(f"| {r['kernel'][:90]} | {r['ms_a_call']:.1f} | {100 * r['ms_a_call'] / total:.1f} % | {r['calls_a_call']:.0f} |")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
