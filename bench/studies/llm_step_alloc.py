"""Study: what the memory allocator costs a torch-backend LLM decode step on a CPU.

The AOTInductor decode step returns its whole present cache as a new tensor every token. Each is
larger than the last, so glibc's malloc, whose mmap threshold follows the largest chunk freed so far,
maps fresh pages for every step and unmaps the previous ones: page faults, page zeroing and kernel
locks on every token. This times the step alone in child processes, interleaved (ABAB), once with
glibc's defaults and once with a fixed mmap threshold and a high trim threshold
(``GLIBC_TUNABLES``), so that freed cache memory is reused; it reports each side's median step,
the page faults of the child (minor faults, load included) and the per-pair ratio.

Usage: python bench/studies/llm_step_alloc.py --engine artifacts/builds/<bundle>/engines/llm
       [--past 165] [--steps 400] [--pairs 5] [--threads 2]
Writes artifacts/bench/llm_step_alloc.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for builtin_models
from builtin_models import machine, write_result

REPO = Path(__file__).resolve().parents[2]
TUNED = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"

CHILD = r"""
import json, resource, sys, time
import numpy as np, torch
from pathlib import Path
from cosycompile.backends.torch.build import load
engine, past, steps, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
runner = load(engine, threads)["llm_step"]
spec = json.loads((engine / "graphs.json").read_text())["info"]
L, KVH, D, H = spec["num_layers"], spec["kv_heads"], spec["head_dim"], spec["hidden_size"]
rng = np.random.default_rng(0)
cache = torch.from_numpy(rng.standard_normal((L, 2, 1, KVH, past, D)).astype(np.float32))
times = []
for _ in range(steps):
    e = torch.from_numpy(rng.standard_normal((1, 1, H)).astype(np.float32))
    t0 = time.perf_counter()
    cache = runner.run({"inputs_embeds": e, "past_key_values": cache})["present_key_values"]
    times.append(time.perf_counter() - t0)
print(json.dumps({"median_ms": float(np.median(times[5:]) * 1e3),
                  "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt}))
"""


def _child(engine: Path, past: int, steps: int, threads: int, tunables: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    done = subprocess.run([sys.executable, "-c", CHILD, str(engine), str(past), str(steps), str(threads)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", type=Path, required=True, help="a torch-backend LLM engine dir (llm_step.pt2)")
    ap.add_argument("--past", type=int, default=165, help="cached positions before the first step")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = ap.parse_args()
    if not (args.engine / "llm_step.pt2").is_file():
        print(f"error: {args.engine} holds no llm_step.pt2 (a torch-backend LLM engine dir)", file=sys.stderr)
        return 2
    rows = []
    for i in range(args.pairs):
        base = _child(args.engine, args.past, args.steps, args.threads, None)
        tuned = _child(args.engine, args.past, args.steps, args.threads, TUNED)
        rows.append({"default": base, "tuned": tuned, "ratio": base["median_ms"] / tuned["median_ms"]})
        print(f"pair {i + 1}: default {base['median_ms']:.2f} ms, tuned {tuned['median_ms']:.2f} ms", flush=True)
    ratios = [r["ratio"] for r in rows]
    out = {"machine": machine(), "engine": str(args.engine), "past": args.past, "steps": args.steps,
           "threads": args.threads, "tunables": TUNED, "pairs": rows,
           "ratio_median": statistics.median(ratios), "ratio_spread": [min(ratios), max(ratios)]}
    dest = write_result(args.artifacts, "llm_step_alloc", out)
    sides = ("default", "tuned")
    med = {side: statistics.median(r[side]["median_ms"] for r in rows) for side in sides}
    faults = {side: statistics.median(r[side]["minor_faults"] for r in rows) for side in sides}
    table = ["| allocator | median step ms | minor page faults (child, load included) |", "|---|---|---|",
             *(f"| {side} | {med[side]:.2f} | {faults[side]:,.0f} |" for side in sides)]
    print("\n".join([f"machine: {out['machine']}; past {args.past}, {args.steps} steps, {args.threads} threads",
                     *table, f"default over tuned: {out['ratio_median']:.3f}x ({min(ratios):.3f}-{max(ratios):.3f}, "
                     f"{len(rows)} pairs)", f"result: {dest}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
