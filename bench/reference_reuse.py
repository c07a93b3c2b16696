"""Benchmark: validation time of a second recipe on the same model, which reuses the cached FP32
reference, against the first recipe's (which computes it).

Builds ``cpu-fp32`` then ``cpu-int8`` on ``builtin:random-0.5b`` (the real shapes) into one fresh
artifacts dir, each through the CLI in its own process, and sums the seconds of the validation steps
each build actually ran (``reference``, ``<stage>.check``, ``pipeline.check``). Speed is compared
with the reference step's own timing (``validation.speed.reference: cached``), one timed run.

Usage: python bench/reference_reuse.py [--artifacts DIR] [--tokens 250]
Writes artifacts/bench/reference_reuse.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from builtin_models import BENCH_CALIBRATION, machine

REPO = Path(__file__).resolve().parents[1]
VALIDATION = ("reference", "llm.check", "flow.check", "hift.check", "pipeline.check")


def build(recipe: Path, art: Path) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "cosycompile", "build", str(recipe), "--artifacts", str(art), "-q"],
                         capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):  # 1: the gate failed, which is a result here
        sys.exit(f"build of {recipe} failed:\n{res.stderr[-3000:]}")
    ran = next(ln for ln in res.stdout.splitlines() if ln.startswith("built ")).split("ran: ", 1)[1].split(", ")
    bundle = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("bundle: ")).split(": ", 1)[1])
    steps = json.loads((bundle / "manifest.json").read_text())["steps"]
    validation = {s: steps[s]["seconds"] for s in VALIDATION if s in ran and s in steps}
    return {"wall_s": wall, "ran": ran, "validation_s": sum(validation.values()), "validation_steps": validation,
            "gate": "PASS" if res.returncode == 0 else "FAIL", "bundle": str(bundle)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", default=str(REPO / "artifacts" / "bench" / "reference-reuse"))
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens of the eval item (250 = 10 s of audio)")
    args = ap.parse_args()
    import yaml

    art = Path(args.artifacts)
    if art.exists() and any(art.iterdir()):
        sys.exit(f"{art}: must be empty (the first build has to compute the reference)")
    art.mkdir(parents=True, exist_ok=True)
    common = {
        "model": "builtin:random-0.5b",
        "calibration": BENCH_CALIBRATION,
        "validation": {"max_items": 1, "sampling": {"mode": "greedy", "seed": 0, "max_tokens": args.tokens},
                       "speed": {"reference": "cached", "warmup": 0, "runs": 1, "throughput": []}},
    }
    results = {}
    for name in ("cpu-fp32", "cpu-int8"):
        recipe = art / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / f"{name}.yaml"), "name": name, **common}))
        results[name] = build(recipe, art)
        print(f"{name}: validation {results[name]['validation_s']:.1f} s "
              f"({results[name]['validation_steps']}), wall {results[name]['wall_s']:.1f} s", flush=True)
    first, second = results["cpu-fp32"]["validation_s"], results["cpu-int8"]["validation_s"]
    out = {"machine": machine(),
           "tokens": args.tokens, "builds": results, "second_over_first": second / first if first else None}
    dest = REPO / "artifacts" / "bench" / "reference_reuse.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print("| build | validation steps run | validation s | wall s |")
    print("|---|---|---|---|")
    for name, r in results.items():
        steps = ", ".join(f"{k} {v:.0f}" for k, v in r["validation_steps"].items())
        print(f"| {name} | {steps} | {r['validation_s']:.0f} | {r['wall_s']:.0f} |")
    print(f"second / first validation time: {out['second_over_first']:.1%}")
    print(f"result: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
