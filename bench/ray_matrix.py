"""Benchmark: the wall time of a two-recipe matrix (``cpu-int8`` and ``rtx4090-fp16`` on builtin:tiny)
built by the local executor, by Ray on one node, and by Ray on two nodes (a CPU node and an "sm89"
node), arms interleaved round by round, every run from empty caches.

Everything runs on this machine, on loopback in a private network namespace (root): a SeaweedFS S3
server as the remote cache and `ray start` nodes. One node: ``--num-cpus=N --resources '{"sm89": 1}'``.
Two nodes: a CPU node with N CPUs and an "sm89" node with none, which takes only the TensorRT-RTX
engine steps. Wall time is the ``cosycompile build`` command's, from start to exit (the cluster is up
before). Beside each time: the gate and the cpu-int8 bundle's end-to-end quality (waveform and mel
SNR against the FP32 reference), and which node built how many steps.

Usage: python bench/ray_matrix.py [--rounds 2] [--cpus 2] [--out DIR] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "cache"), str(REPO / "tests" / "executors" / "ray")]

from builtin_models import machine  # noqa: E402
from ray_cluster import GCS_PORT, RayNode, private_network, wait_for_nodes  # noqa: E402
from s3_servers import SeaweedServer, client_env  # noqa: E402

RECIPES = ("cpu-int8", "rtx4090-fp16")
ARMS = ("local", "ray-1-node", "ray-2-nodes")


def _recipes(root: Path) -> list[Path]:
    out = []
    for name in RECIPES:
        p = root / f"{name}.yaml"
        p.write_text(json.dumps({"extends": str(REPO / "recipes" / f"{name}.yaml"), "name": name,
                                 "validation": {"max_items": 1, "speed": {"runs": 1, "throughput": []}}}))
        out.append(p)
    return out


def _quality(stdout: str) -> dict[str, Any]:
    bundle = next(Path(m.group(1)) for m in re.finditer(r"^bundle: (.*cpu-int8-\w+)$", stdout, re.M))
    report = json.loads((bundle / "report.json").read_text())
    item = report["items"][0]  # one eval item (max_items 1)
    return {"waveform_snr_db": item.get("waveform_snr_db"), "mel_snr_db": item.get("mel_snr_db"),
            "tokens_identical": item.get("tokens_identical"),
            "gates": re.findall(r"^gate: (\w+)", stdout, re.M)}


def _run(arm: str, work: Path, recipes: list[Path], env: dict[str, str], server: SeaweedServer, cpus: int) -> dict:
    nodes: list[RayNode] = []
    args = [sys.executable, "-m", "cosycompile", "build", *map(str, recipes), "--artifacts", str(work / "driver"),
            "--allow-unvalidated"]
    if arm == "local":
        args += ["--cache-remote", ""]
    else:
        args += ["--executor", "ray", "--cache-remote", f"s3://{server.new_bucket()}/bench"]
        if arm == "ray-1-node":
            nodes.append(RayNode("one", work, env, head=True, cpus=cpus, resources='{"sm89": 1}'))
        else:
            nodes.append(RayNode("cpu", work, env, head=True, cpus=cpus))
            nodes.append(RayNode("sm89", work, env, head=False, cpus=0, resources='{"sm89": 1}'))
        env = {**env, "RAY_ADDRESS": f"127.0.0.1:{GCS_PORT}"}
        wait_for_nodes(len(nodes), env, nodes=nodes)
    try:
        t0 = time.perf_counter()
        res = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
        wall = time.perf_counter() - t0
    finally:
        for n in nodes:
            n.kill()
    if res.returncode != 0:
        raise SystemExit(f"{arm}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    placed = re.findall(r"^  (\S+)\s+\S+\s+\S+\s+\w+\s+\d+\s+(.*)$", res.stdout, re.M)
    return {"arm": arm, "wall_s": wall, "placement": dict(placed), **_quality(res.stdout)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the node that runs the CPU steps")
    ap.add_argument("--out", type=Path, default=REPO / "artifacts" / "bench")
    ap.add_argument("--work", type=Path, help="keep every run's caches here (for cluster_simulation.py); "
                                              "default: a temporary folder")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, private_network():
        root = args.work or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        recipes = _recipes(root)
        server = SeaweedServer(root / "s3").start()
        try:
            env = client_env(server.endpoint)
            for r in range(args.rounds):
                for arm in ARMS:
                    work = root / f"{arm}-{r}"
                    work.mkdir()
                    row = {"round": r, **_run(arm, work, recipes, env, server, args.cpus)}
                    rows.append(row)
                    print(f"round {r} {arm}: {row['wall_s']:.1f} s, gates {row['gates']}, cpu-int8 waveform SNR "
                          f"{row['waveform_snr_db']} dB, placement {row['placement']}", flush=True)
        finally:
            server.stop()
    ratios = {arm: [next(x["wall_s"] for x in rows if x["round"] == r and x["arm"] == arm)
                    / next(x["wall_s"] for x in rows if x["round"] == r and x["arm"] == "local")
                    for r in range(args.rounds)] for arm in ARMS[1:]}
    print("| arm | wall s (median) | vs local (median of per-round ratios; range) |\n|---|---|---|")
    for arm in ARMS:
        walls = [x["wall_s"] for x in rows if x["arm"] == arm]
        rel = ("1" if arm == "local" else
               f"{statistics.median(ratios[arm]):.2f} ({min(ratios[arm]):.2f}-{max(ratios[arm]):.2f})")
        print(f"| {arm} | {statistics.median(walls):.1f} | {rel} |")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "ray_matrix.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, "ratios": ratios}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
