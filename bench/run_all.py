"""`make bench`: every benchmark of the project, each measuring its ratios within one run.

Runs bench/quantized_speed.py for the INT8 (static and dynamic flow) and INT4 CPU recipes on
builtin:random-0.5b (interleaved FP32/quantized pairs), bench/flow_sensitivity.py (simulated INT8 per
layer group of the flow estimator), bench/cfm_steps.py (mel SNR of fewer CFM steps against 10),
bench/torch_backend.py (AOTInductor vs ONNX
Runtime FP32 packages, interleaved), bench/llm_decode.py (the LLM decode step's torch packages vs the
FP32 eager step, with the bandwidth floor), bench/flow_profile.py (where a cpu-fast flow-estimator
call spends its time, by operator), bench/reference_reuse.py (validation time of a second recipe on
the same model), bench/end_to_end.py (offline RTF and first chunk against the FP32 reference in the
same run, for the INT8 recipes, cpu-fast and cpu-fast-cfm5) and bench/noop_rebuild.py, and prints their tables;
copy the figures into docs/BENCHMARKS.md together with the command and the machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    rc = 0
    for recipe in ("cpu-int8", "cpu-int8-dynamic", "cpu-int4"):
        cmd = [sys.executable, str(REPO / "bench" / "quantized_speed.py"), "--recipe",
               str(REPO / "recipes" / f"{recipe}.yaml")]
        print("$", " ".join(cmd), flush=True)
        rc |= subprocess.call(cmd)
    for script in ("flow_sensitivity.py", "cfm_steps.py", "torch_backend.py", "llm_decode.py", "flow_profile.py"):
        cmd = [sys.executable, str(REPO / "bench" / script)]
        print("$", " ".join(cmd), flush=True)
        rc |= subprocess.call(cmd)
    # A fresh artifacts dir: the first build must compute the reference for the ratio to mean anything.
    fresh = REPO / "artifacts" / "bench" / f"reference-reuse-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, str(REPO / "bench" / "reference_reuse.py"), "--artifacts", str(fresh)]
    print("$", " ".join(cmd), flush=True)
    rc |= subprocess.call(cmd)
    for recipe in ("cpu-int8", "cpu-int8-dynamic", "cpu-fast", "cpu-fast-cfm5"):
        cmd = [sys.executable, str(REPO / "bench" / "end_to_end.py"), "--recipe", str(REPO / "recipes" / f"{recipe}.yaml")]
        print("$", " ".join(cmd), flush=True)
        rc |= subprocess.call(cmd)
    cmd = [sys.executable, str(REPO / "bench" / "noop_rebuild.py")]
    print("$", " ".join(cmd), flush=True)
    rc |= subprocess.call(cmd)
    return rc


if __name__ == "__main__":
    sys.exit(main())
