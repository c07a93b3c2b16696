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
    # Every family is offered every shape a GPU recipe of any family builds (six today), its own recipe first.
    assert set(out["recipes"]) == {"cosyvoice", "cosyvoice2", "cosyvoice3"}
    shapes = {len(names) for names in out["recipes"].values()}
    assert len(shapes) == 1 and shapes.pop() >= 6, out["recipes"]
    assert "cv3-l20-int8" in out["recipes"]["cosyvoice3"] and "h100-torch.cosyvoice3" in out["recipes"]["cosyvoice3"]
    assert all(any(r.startswith(f"{f}/") for r in out["rows"]) for f in out["recipes"])
    assert any("fp8" in s and "a100" in s for s in out["skipped"])  # A100 has no FP8
    # CosyVoice-300M's LM has no Qwen2 checkpoint: its TensorRT-LLM rows are skipped, with the reason.
    assert any(s.startswith("cosyvoice/l20-int8.cosyvoice@") and "not a Qwen2 body" in s for s in out["skipped"])
    # Rows whose LLM TensorRT-LLM serves have no checks; the others are planned with theirs.
    assert out["unchecked"] and all("int8" in r or "fp8" in r or "awq" in r for r in out["unchecked"])
    assert len(out["unchecked"]) < len(out["rows"])
    # Shared steps merged: fewer distinct steps than rows times steps per row; every step assumed 10 s here.
    assert out["work_s"] == 10 * out["steps"]
    one, four = out["runs"]
    assert one["wall_s"] == out["work_s"] and one["steps_run"] == out["steps"]
    assert out["critical_path_s"] <= four["wall_s"] < one["wall_s"]


def test_durations_can_be_kept_to_builds_of_a_large_model(tmp_path: Path) -> None:
    from cosycompile.cache.local import Store

    store = Store(tmp_path / "art")

    def commit(key: str, step: str, kind: str, seconds: float, nbytes: int, inputs: dict[str, str]) -> None:
        stage = tmp_path / f"stage-{key[:4]}"
        (stage / "data").mkdir(parents=True)
        (stage / "data" / "f.bin").write_bytes(b"x" * nbytes)
        store.commit(key, stage, {"step": step, "seconds": seconds,
                                  "components": {"kind": kind, "inputs": inputs}})

    commit("a" * 64, "model", "model.builtin", 1.0, 3_000_000, {})  # the "large" model: 3 MB
    commit("b" * 64, "model", "model.builtin", 1.0, 1_000, {})
    commit("c" * 64, "llm.export", "llm.export", 30.0, 10, {"model": "a" * 64})
    commit("d" * 64, "llm.export", "llm.export", 2.0, 10, {"model": "b" * 64})
    commit("e" * 64, "llm.simplify", "onnx.simplify", 20.0, 10, {"graphs": "c" * 64})  # the large one's, two steps on
    commit("f" * 64, "llm.simplify", "onnx.simplify", 1.0, 10, {"graphs": "9" * 64})  # its model is not in the cache
    every = sim.recorded_seconds([tmp_path / "art"])
    assert sorted(every[("llm.export", "llm.export")]) == [2.0, 30.0] and len(every[("llm.simplify", "onnx.simplify")]) == 2
    large = sim.recorded_seconds([tmp_path / "art"], min_model_mb=2.0)
    assert large == {("model", "model.builtin"): [1.0], ("llm.export", "llm.export"): [30.0],
                     ("llm.simplify", "onnx.simplify"): [20.0]}
