"""`make bench`: every benchmark of the project, each measuring its ratios within one run.

Runs bench/machine_timeline.py for 3 minutes (the share and spells of the VM's two states), then
bench/quantized_speed.py for the INT8 (static and dynamic flow) and INT4 CPU recipes on
builtin:random-0.5b (interleaved FP32/quantized pairs, 60 s windows), bench/flow_sensitivity.py (simulated INT8
per layer group of the flow estimator), bench/cfm_steps.py (mel SNR of fewer CFM steps against 10),
bench/torch_backend.py (AOTInductor vs ONNX
Runtime FP32 packages, interleaved), bench/llm_decode.py (the LLM decode step's torch packages vs the
FP32 eager step, with the bandwidth floor), bench/flow_profile.py (where a cpu-fast flow-estimator
call spends its time, by operator), bench/reference_reuse.py (validation time of a second recipe on
the same model), bench/end_to_end.py (offline RTF and first chunk against the FP32 reference in the
same run, for the INT8 recipes, cpu-fast and cpu-fast-cfm5) and bench/noop_rebuild.py, and prints their tables;
copy the figures into docs/BENCHMARKS.md together with the command and the machine.

Each run's result files are kept under artifacts/bench/runs/<stamp>/ with every script's wall time;
from the second run on, its ratios are printed against the previous run's (bench/compare_runs.py).
A second run reuses the engines the first one built (the scripts' artifacts dirs persist), so it
mostly measures. ``--only WORD[,WORD]`` runs the commands that contain one of the words.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from builtin_models import machine

REPO = Path(__file__).resolve().parents[1]


def commands(fresh: Path) -> list[list[str]]:
    """Every benchmark command of a run, in order."""
    py, bench = sys.executable, REPO / "bench"
    # First, how the VM's state runs today: the share of each state moves the overall ratios.
    cmds = [[py, str(bench / "machine_timeline.py"), "--minutes", "3"]]
    cmds += [[py, str(bench / "quantized_speed.py"), "--recipe", str(REPO / "recipes" / f"{r}.yaml")]
            for r in ("cpu-int8", "cpu-int8-dynamic", "cpu-int4")]
    cmds += [[py, str(bench / s)] for s in ("flow_sensitivity.py", "cfm_steps.py", "torch_backend.py", "llm_decode.py",
                                            "flow_profile.py")]
    # A fresh artifacts dir: the first build must compute the reference for the ratio to mean anything.
    cmds.append([py, str(bench / "reference_reuse.py"), "--artifacts", str(fresh)])
    cmds += [[py, str(bench / "end_to_end.py"), "--recipe", str(REPO / "recipes" / f"{r}.yaml")]
             for r in ("cpu-int8", "cpu-int8-dynamic", "cpu-fast", "cpu-fast-cfm5")]
    cmds.append([py, str(bench / "noop_rebuild.py")])
    return cmds


def label(cmd: list[str]) -> str:
    """A command without the interpreter and the repo's paths: ``end_to_end.py --recipe cpu-fast.yaml``."""
    return " ".join(Path(c).name if c.startswith(str(REPO)) else c for c in cmd[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated; run only the commands whose label contains one, "
                                               "e.g. 'torch_backend,end_to_end.py --recipe cpu-fast.yaml'")
    args = ap.parse_args()
    words = [w for w in args.only.split(",") if w]
    results = REPO / "artifacts" / "bench"
    runs = results / "runs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    started = time.time()
    rc, timings = 0, []
    with tempfile.TemporaryDirectory(prefix="reference-reuse-") as fresh:
        todo = [c for c in commands(Path(fresh)) if not words or any(w in label(c) for w in words)]
        if not todo:
            print(f"run_all: no benchmark command contains any of {words}", file=sys.stderr)
            return 2
        for cmd in todo:
            print("$", " ".join(cmd), flush=True)
            t0 = time.perf_counter()
            code = subprocess.call(cmd)
            timings.append({"cmd": label(cmd), "seconds": round(time.perf_counter() - t0, 1), "rc": code})
            print(f"  ({timings[-1]['seconds']:.0f} s, exit {code})", flush=True)
            rc |= code
            if fresh in cmd:
                # Its cache holds a second copy of the 0.5B engines (about 10 GB): free it now, not
                # after the end-to-end builds that follow have filled the disk next to it.
                shutil.rmtree(fresh, ignore_errors=True)
    # Keep this run's result files (only those written during it) for bench/compare_runs.py.
    folder = runs / stamp
    folder.mkdir(parents=True, exist_ok=True)
    for f in results.glob("*.json"):
        if f.stat().st_mtime >= started:
            shutil.copy2(f, folder / f.name)
    (folder / "run_all.json").write_text(json.dumps({"machine": machine(), "scripts": timings,
                                                     "seconds": round(time.time() - started)}, indent=1))
    print(f"\nrun kept in {folder} ({(time.time() - started) / 60:.0f} min)")
    previous = sorted(p for p in runs.iterdir() if p.is_dir() and p.name < stamp)
    if previous:
        print(f"against the previous run ({previous[-1].name}):", flush=True)
        subprocess.call([sys.executable, str(REPO / "bench" / "compare_runs.py"), str(previous[-1]), str(folder)])
    return rc


if __name__ == "__main__":
    sys.exit(main())
