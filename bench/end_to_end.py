"""Benchmark: end-to-end offline RTF and streaming first-chunk latency of a CPU recipe on
builtin:random-0.5b (the real shapes), against the PyTorch FP32 reference in the same run.

Builds the recipe with ``validation.speed.reference: same-run`` (reference and build timed in
interleaved pairs, median of per-pair ratios; ``machine_state``: each ratio per state of the VM
too) on one eval item of ``--tokens`` speech tokens, and
prints the report's speed table with the quality of the same engines next to it. First chunk = the
family's first streamed chunk (the flow runtime's ``first_chunk``) through LLM, flow and HiFT.

Usage: python bench/end_to_end.py [--recipe recipes/cpu-int8.yaml] [--artifacts DIR] [--pairs 3]
       [--min-seconds 30]
Writes artifacts/bench/end_to_end-<recipe>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from builtin_models import BENCH_CALIBRATION, add_min_seconds, machine

REPO = Path(__file__).resolve().parents[1]


def remeasure(recipe: Path, art: Path) -> None:
    """Drop this bench recipe's cached checks (each stage's and the pipeline's) and its bundle,
    keeping every build step.

    The timings live in the checks' cache entries: without this, a second run with the engines
    unchanged re-reads the first run's report and "agrees" with it exactly.
    """
    sys.path.insert(0, str(REPO))
    from cosycompile.cache.local import Store
    from cosycompile.exporters.bundle.export import bundle_dir
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    plan = plan_build(load_recipe(recipe))
    store = Store(art)
    shutil.rmtree(bundle_dir(plan, store), ignore_errors=True)
    checks = [plan.final] + [steps["check"] for steps in plan.stage_steps.values() if "check" in steps]
    for step in checks:
        store.discard(store.entry_dir(step.key(store)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "cpu-int8.yaml"))
    ap.add_argument("--artifacts", default=str(REPO / "artifacts" / "bench" / "end-to-end"))
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens of the eval item (250 = 10 s)")
    ap.add_argument("--pairs", type=int, default=3)
    add_min_seconds(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="builtin:random-0.5b")
    args = ap.parse_args()
    import yaml

    recipe = Path(args.recipe).resolve()
    name = f"{recipe.stem}-e2e"
    art = Path(args.artifacts)
    art.mkdir(parents=True, exist_ok=True)
    path = art / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "extends": str(recipe), "name": name, "model": args.model,
        "calibration": BENCH_CALIBRATION,
        "validation": {"max_items": 1, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": args.tokens},
                       "speed": {"reference": "same-run", "warmup": 1, "runs": args.pairs, "threads": args.threads,
                                 "min_seconds": args.min_seconds, "machine_state": True,
                                 "throughput": []}},
    }))
    remeasure(path, art)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(path), "--artifacts", str(art), "-q"],
                         capture_output=True, text=True, cwd=REPO)
    if res.returncode not in (0, 1):
        sys.exit(f"build failed:\n{res.stderr[-3000:]}")
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("bundle: ")), None)
    if line is None:
        sys.exit(f"build wrote no bundle (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    bundle = Path(line.split(": ", 1)[1])
    report = json.loads((bundle / "report.json").read_text())
    speed, checks = report["speed"], report["checks"]
    steps = json.loads((bundle / "manifest.json").read_text())["steps"]
    out = {"machine": machine(),
           "recipe": str(recipe), "tokens": args.tokens, "pairs": args.pairs, "min_seconds": args.min_seconds,
           "threads": args.threads,
           "wall_s": time.perf_counter() - t0, "gate_passed": report["gate"]["passed"],
           "findings": report["gate"]["findings"], "speed": speed,
           "step_peak_rss_mb": {n: v.get("peak_rss_mb") for n, v in steps.items()},
           "quality": {"pipeline": checks["pipeline"]["metrics"],
                       **{s: checks[s]["metrics"] for s in ("llm", "flow", "hift") if s in checks}}}
    dest = REPO / "artifacts" / "bench" / f"end_to_end-{recipe.stem}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=float))
    print(f"{recipe.name} on {args.model}, {args.tokens} tokens ({speed.get('audio_seconds', 0):.1f} s audio), "
          f"{args.threads} threads, interleaved pairs: at least {args.pairs}, for at least {args.min_seconds:.0f} s")
    print("| workload | reference s | built s | speed-up (median of pairs) | spread | pairs |")
    print("|---|---|---|---|---|---|")
    for w in ("llm", "flow", "hift", "end_to_end", "first_chunk"):
        r = speed.get(w)
        if r:
            print(f"| {w} | {r['reference_s']:.2f} | {r['built_s']:.2f} | {r['speedup']:.2f}x | "
                  f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f} | {r.get('pairs', '')} |")
    print("By the machine's state around each pair's runs (threads win or lose to one thread on a small parallel op; "
          "state changed: the probes around the pair disagreed):")
    print("| workload | state | pairs | reference s | built s | speed-up | copy GB/s |")
    print("|---|---|---|---|---|---|---|")
    for w in ("llm", "flow", "hift", "end_to_end", "first_chunk"):
        for state, st in speed.get(w, {}).get("by_state", {}).items():
            print(f"| {w} | {state.replace('_', ' ')} | {st['pairs']} | {st['reference_s']:.2f} | {st['built_s']:.2f} | "
                  f"{st['speedup']:.2f}x | {st['copy_gb_per_s']:.0f} |")
    for s in ("llm", "flow", "hift"):
        for state, st in checks.get(s, {}).get("metrics", {}).get("speedup_vs_fp32_by_state", {}).items():
            print(f"| {s} stage check vs its FP32 engine | {state.replace('_', ' ')} | {st['pairs']} | "
                  f"{st['reference_s']:.3f} | {st['built_s']:.3f} | {st['speedup']:.2f}x | {st['copy_gb_per_s']:.0f} |")
    e2e = speed.get("end_to_end", {})
    print(f"RTF reference {e2e.get('rtf_reference', float('nan')):.2f}, built {e2e.get('rtf_built', float('nan')):.2f}; "
          f"first chunk built {1000 * speed.get('first_chunk', {}).get('built_s', float('nan')):.0f} ms; "
          f"peak RSS of the step that needed the most {max((v or 0) for v in out['step_peak_rss_mb'].values()):.0f} MiB")
    q = checks["pipeline"]["metrics"]
    print(f"quality: tokens identical {q.get('tokens_identical_ratio')}, mel SNR min {q.get('mel_snr_db_min')}, "
          f"gate {'PASS' if report['gate']['passed'] else 'FAIL'} {[f['metric'] for f in report['gate']['findings']]}")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
