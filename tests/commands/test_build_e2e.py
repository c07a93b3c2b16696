"""End-to-end builds of the tiny model: caching, selective rebuilds, no torch on a no-op, bundle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import REPO, run_cli, write_recipe
from seed_store import FOLLOWUP, seeded


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One full build of recipes/cpu-fp32.yaml into a fresh artifacts dir."""
    art = tmp_path_factory.mktemp("art")
    t0 = time.perf_counter()
    res = run_cli("build", str(REPO / "recipes" / "cpu-fp32.yaml"), "--artifacts", str(art), "-q")
    return {"art": art, "res": res, "seconds": time.perf_counter() - t0}


def _bundle(art: Path) -> Path:
    (bundle,) = list((art / "builds").glob("cpu-fp32-*"))
    return bundle


def test_first_build_passes_and_writes_bundle(built: dict) -> None:
    res = built["res"]
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    bundle = _bundle(built["art"])
    for name in ("manifest.json", "report.json", "report.md", "recipe.json"):
        assert (bundle / name).is_file(), name
    for stage in ("llm", "flow", "hift"):
        assert (bundle / "engines" / stage / "engine.json").is_file()
    # The static-cache decode step is a torch program only: ONNX engines carry the growing-cache step.
    assert set(json.loads((bundle / "engines" / "llm" / "graphs.json").read_text())["graphs"]) == {"llm_step"}
    report = json.loads((bundle / "report.json").read_text())
    checks = report["checks"]
    assert report["gate"]["passed"], report["gate"]
    # The acceptance figures of the foundation issue, read from the build's own report.
    assert checks["llm"]["metrics"]["max_abs_logit_error"] < 1e-3
    assert checks["llm"]["metrics"]["greedy_identical_ratio"] == 1.0
    assert checks["flow"]["metrics"]["estimator_max_abs_error"] < 1e-3
    assert set(checks["flow"]["metrics"]["estimator_error_by_length"]) >= {"16", "512"}
    assert checks["hift"]["metrics"]["waveform_snr_db_min"] >= 40
    assert report["speed"]["end_to_end"]["reference_s"] > 0
    # The speed figures name the CPU they were taken on, in the JSON and in the readable report.
    host = report["speed"]["host"]
    assert host["vcpus"] >= 1 and host["arch"]
    assert f"Measured on: {host['cpu']}" in (bundle / "report.md").read_text()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["target"] == "cpu" and set(manifest["stages"]) == {"llm", "flow", "hift"}


def test_noop_rebuild_runs_nothing_and_skips_torch(built: dict, tmp_path: Path) -> None:
    assert built["res"].returncode == 0
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys, time\n"
        "t0 = time.perf_counter()\n"
        "from cosycompile.cli import main\n"
        f"rc = main(['build', {str(REPO / 'recipes' / 'cpu-fp32.yaml')!r}, '--artifacts', {str(built['art'])!r}, '-q'])\n"
        "print('RC', rc, 'TORCH', 'torch' in sys.modules, 'ORT', 'onnxruntime' in sys.modules,"
        " 'SECONDS', time.perf_counter() - t0)\n"
    )
    import subprocess
    import sys

    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - t0
    assert "RC 0 TORCH False ORT False" in res.stdout, res.stdout + res.stderr
    assert "ran: nothing (all cached)" in res.stdout
    assert wall < 2.0, f"no-op rebuild took {wall:.2f}s"


def test_changing_one_stage_reruns_only_that_stage(seed: Path, tmp_path: Path) -> None:
    """From a store that holds the whole of a cpu-fp32 build (the session's seed holds FOLLOWUP's)."""
    recipe = write_recipe(tmp_path / "r.yaml", {
        **FOLLOWUP, "stages": {"hift": {"engine": {"options": {"optimization": "basic"}}}},
    }, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(seeded(seed, tmp_path / "art")), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    ran_line = next(line for line in res.stdout.splitlines() if "; ran: " in line)
    ran = ran_line.split("; ran: ", 1)[1].split(", ")
    assert ran == ["hift.engine", "hift.check", "pipeline.check"]


def test_plan_shows_reasons_without_work(built: dict, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {
        "extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": "cpu-fp32",
        "stages": {"flow": {"export": {"simplify": "none"}}},
    })
    before = sorted(p.name for p in (built["art"] / "cache" / "objects").glob("*/*"))
    res = run_cli("plan", str(recipe), "--artifacts", str(built["art"]))
    assert res.returncode == 0, res.stderr
    lines = {line.split()[1]: line for line in res.stdout.splitlines() if line.startswith("  ")}
    assert lines["flow.simplify"].lstrip().startswith("RUN") and "params changed: method" in lines["flow.simplify"]
    assert lines["flow.export"].lstrip().startswith("cached")
    assert lines["llm.engine"].lstrip().startswith("cached")
    assert before == sorted(p.name for p in (built["art"] / "cache" / "objects").glob("*/*"))


@pytest.mark.extended  # tests/recipes/test_shared_steps.py shows the shared reference key in make test
def test_second_recipe_on_the_same_model_reuses_the_fp32_reference(built: dict, tmp_path: Path) -> None:
    """cpu-fp32 then cpu-int8 on one model: the PyTorch reference runs once, in one cache entry."""
    assert built["res"].returncode == 0
    recipe = write_recipe(tmp_path / "cpu-int8.yaml", {
        "extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "cpu-int8",
        "calibration": {"set": str(REPO / "calib_data" / "calib"), "max_items": 2},
        "validation": {"speed": {"runs": 1, "throughput": []}}}, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(built["art"]))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    ran = next(ln for ln in res.stdout.splitlines() if ln.startswith("built cpu-int8")).split("ran: ", 1)[1]
    assert "reference" not in ran.split(", ") and "pipeline.check" in ran
    assert "reference         cached" in res.stderr or "reference  cached" in " ".join(res.stderr.split())
    steps = [json.loads(p.read_text())["step"] for p in (built["art"] / "cache" / "objects").glob("*/*/entry.json")]
    assert steps.count("reference") == 1
    assert steps.count("pipeline.check") >= 2


def test_cached_speed_without_warmup_counts_the_eval_synthesis(seed: Path, tmp_path: Path) -> None:
    """reference: cached, warmup 0: the first eval item's synthesis is the first timed run of the
    stage and end-to-end workloads (split by stage), the other runs are whole syntheses too."""
    art = seeded(seed, tmp_path / "art")
    recipe = write_recipe(tmp_path / "r.yaml", {
        **FOLLOWUP, "name": "cpu-fp32-cached",
        "validation": {**FOLLOWUP["validation"], "speed": {"reference": "cached", "warmup": 0, "runs": 2,
                                                           "throughput": []}}}, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    (bundle,) = list((art / "builds").glob("cpu-fp32-cached-*"))
    speed = json.loads((bundle / "report.json").read_text())["speed"]
    parts = [speed[s]["built_s"] for s in ("llm", "flow", "hift")]
    for name in ("llm", "flow", "hift", "end_to_end"):
        assert speed[name]["from_eval_synthesis"] and speed[name]["reference_cached"], speed[name]
        assert speed[name]["reference_s"] > 0 and speed[name]["built_s"] > 0
    # Medians of the same two runs: the parts of one synthesis never add up to more than its total
    # by more than the larger run's share.
    assert sum(parts) <= 2 * speed["end_to_end"]["built_s"]
    assert "from_eval_synthesis" not in speed["first_chunk"] and speed["first_chunk"]["built_s"] > 0


def test_fewer_cfm_steps_rebuild_only_the_flow_and_are_scored_against_the_10_step_mel(seed: Path,
                                                                                     tmp_path: Path) -> None:
    """``stages.flow.runtime.n_timesteps`` reaches the bundle's runtime, and the flow check compares
    the 5-step engine with the model's own 10-step FP32 mel (so its SNR falls from ~130 dB)."""
    art = seeded(seed, tmp_path / "art")
    ten_steps = write_recipe(tmp_path / "ten.yaml", FOLLOWUP, base=False)
    assert "ran: nothing (all cached)" in run_cli("build", str(ten_steps), "--artifacts", str(art), "-q").stdout
    recipe = write_recipe(tmp_path / "r.yaml", {
        **FOLLOWUP, "name": "fewer-cfm-steps", "stages": {"flow": {"runtime": {"n_timesteps": 5}}},
    }, base=False)
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-2000:]
    ran = next(ln for ln in res.stdout.splitlines() if "; ran: " in ln).split("; ran: ", 1)[1].split(", ")
    assert ran == ["flow.export", "flow.simplify", "flow.engine", "flow.check", "pipeline.check"]
    (bundle,) = list((art / "builds").glob("fewer-cfm-steps-*"))
    assert json.loads((bundle / "engines" / "flow" / "graphs.json").read_text())["info"]["n_timesteps"] == 5
    (first,) = (art / "builds").glob("followup-*")
    ten = json.loads((first / "report.json").read_text())["checks"]["flow"]["metrics"]
    five = json.loads((bundle / "report.json").read_text())["checks"]["flow"]["metrics"]
    assert ten["cfm_steps"] == 10 and five["cfm_steps"] == 5
    assert five["estimator_max_abs_error"] < 1e-3  # same graphs: only the solver changed
    assert five["cfm_mel_snr_db_min"] < ten["cfm_mel_snr_db_min"] - 20
