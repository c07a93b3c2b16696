"""The matrix simulation of bench/cluster_simulation.py: its scheduler on graphs whose answer is known,
and the script on the repository's real GPU recipes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import cluster_simulation as sim  # noqa: E402


def _graph() -> dict[str, sim.Node]:
    # a -> b (GPU sm90, 5 s), a -> c (CPU, 3 s), b, c -> d: critical path a, b, d.
    return {"a": sim.Node("a", "export", None, 2.0, False), "b": sim.Node("b", "engine", "sm90", 5.0, False, {"a"}),
            "c": sim.Node("c", "quantize", None, 3.0, False, {"a"}), "d": sim.Node("d", "check", None, 1.0, False, {"b", "c"})}


def test_critical_path_and_schedules_of_a_small_graph() -> None:
    nodes = _graph()
    length, chain, tail = sim.critical_path(nodes)
    assert (length, chain) == (8.0, ["a", "b", "d"])
    one = sim.simulate(nodes, 1, ["sm90"], tail)
    two = sim.simulate(nodes, 2, ["sm90"], tail)
    assert one["wall_s"] == 11.0 and one["steps_run"] == 4  # all work, one after another
    assert two["wall_s"] == 8.0  # the critical path: c runs beside b
    # A GPU step waits for a node of its kind: with two kinds on two nodes, b goes to node 0 only.
    nodes["c"].hardware = "sm90"
    assert sim.simulate(nodes, 2, ["sm89", "sm90"], tail)["wall_s"] == 11.0


def test_the_script_plans_the_real_matrix(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "bench" / "cluster_simulation.py"), "--artifacts", str(tmp_path),
                          "--nodes", "1", "4", "--default", "10", "--json", str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert any(r.startswith("cosyvoice3/") for r in out["rows"]) and any(r.startswith("cosyvoice2/") for r in out["rows"])
    assert any("fp8" in s and "a100" in s for s in out["skipped"])  # A100 has no FP8
    # Shared steps merged: fewer distinct steps than rows times steps per row; every step assumed 10 s here.
    assert out["work_s"] == 10 * out["steps"]
    one, four = out["runs"]
    assert one["wall_s"] == out["work_s"] and one["steps_run"] == out["steps"]
    assert out["critical_path_s"] <= four["wall_s"] < one["wall_s"]
