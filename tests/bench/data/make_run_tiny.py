"""Makes a run like the stored one in run-tiny/: bench/run_all.py's own ``run()`` (what `make bench`
calls) over quick commands on builtin:tiny (a few minutes on 2 vCPUs; the full `make bench` takes
hours on the 0.5B shapes). The run lands in artifacts/bench/runs/<stamp>/; tests/bench/test_print_tables.py
says how it becomes the stored run.

Usage: .venv/bin/python tests/bench/data/make_run_tiny.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import run_all  # noqa: E402

REPO, PY = run_all.REPO, sys.executable
BENCH, RECIPES = REPO / "bench", REPO / "recipes"
# One eval item of 30 tokens, 2 pairs (the spread is a range), no minimum time per ratio.
QUICK = ["--model", "builtin:tiny", "--min-seconds", "0"]


def main() -> int:
    cmds = [[PY, str(BENCH / "end_to_end.py"), "--recipe", str(RECIPES / f"{r}.yaml"), *QUICK, "--tokens", "30",
             "--pairs", "2"] for r in ("cpu-fp32", "cpu-int8-dynamic")]
    cmds.append([PY, str(BENCH / "quantized_speed.py"), "--recipe", str(RECIPES / "cpu-int8-dynamic.yaml"), *QUICK,
                 "--frames", "100", "--tokens", "8", "--runs", "2"])
    cmds.append([PY, str(BENCH / "noop_rebuild.py"), "--runs", "3", "--entries", "100"])
    folder = REPO / "artifacts" / "bench" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    print("run folder:", folder, flush=True)
    return run_all.run(cmds, folder, REPO / "artifacts" / "bench", [])


if __name__ == "__main__":
    sys.exit(main())
