"""Validation separated from building: a bundle's own engines re-checked by `cosycompile validate`,
and builds whose engines cannot run here end "built, not validated here"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import EVAL_SET, run_cli, write_recipe
from seed_store import FOLLOWUP, seeded


@pytest.mark.slow
def test_validate_rechecks_a_bundles_own_engines(tmp_path: Path, seed: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {**FOLLOWUP, "name": "later"}, base=False)
    art = seeded(seed, tmp_path / "art")
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-3000:]
    (bundle,) = (art / "builds").glob("later-*")
    res = run_cli("validate", str(bundle), "--artifacts", str(art), "-q")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    validated = Path(next(ln for ln in res.stdout.splitlines() if ln.startswith("validated: ")).split(": ", 1)[1])
    assert validated != bundle and "gate: PASS" in res.stdout
    before = json.loads((bundle / "report.json").read_text())["checks"]
    after = json.loads((validated / "report.json").read_text())["checks"]
    # The same engines against the same cached reference: identical accuracy figures.
    for stage, key in (("llm", "max_abs_logit_error"), ("flow", "estimator_max_abs_error"), ("hift", "waveform_snr_db_min")):
        assert after[stage]["metrics"][key] == before[stage]["metrics"][key]
    steps = json.loads((validated / "manifest.json").read_text())["steps"]
    assert {"llm.engine", "flow.engine", "hift.engine"} <= set(steps)
    # A changed engine file is refused before any check runs.
    victim = next((bundle / "engines" / "hift").glob("*.onnx"))
    victim.write_bytes(victim.read_bytes()[:-1] + bytes([victim.read_bytes()[-1] ^ 1]))
    res = run_cli("validate", str(bundle), "--artifacts", str(tmp_path / "art2"), "-q")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert victim.name in res.stderr


def test_validate_without_its_recipe_is_a_one_line_error(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"recipe": "x", "recipe_source": str(tmp_path / "gone.yaml"),
                                                     "files": {}}))
    res = run_cli("validate", str(bundle), "--artifacts", str(tmp_path / "art"))
    assert res.returncode == 2 and "--recipe" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_gpu_engines_built_here_fail_the_gate_unless_allowed(tmp_path: Path, seed: Path) -> None:
    """TensorRT-RTX engines compile on this CPU machine but cannot run on it."""
    from cosycompile.backends.tensorrt import build_problem, run_problem
    from cosycompile.core.targets import TARGETS

    target = TARGETS["rtx4090"]
    if build_problem(target) or not run_problem(target):
        pytest.skip("needs a machine that builds TensorRT-RTX engines but cannot run them")
    recipe = write_recipe(tmp_path / "r.yaml", {
        "name": "rtx-flow", "model": "builtin:tiny", "target": "rtx4090",
        "stages": {"llm": {"enabled": False}, "hift": {"enabled": False}, "flow": {"engine": {"backend": "tensorrt"}}},
        "validation": {"eval_set": str(EVAL_SET), "max_items": 1}})
    art = seeded(seed, tmp_path / "art")
    res = run_cli("build", str(recipe), "--artifacts", str(art), "-q")
    assert res.returncode == 1, res.stderr[-3000:] + res.stdout[-2000:]
    assert "built, not validated here" in res.stdout and "cosycompile validate" in res.stdout
    (bundle,) = (art / "builds").glob("rtx-flow-*")
    report = json.loads((bundle / "report.json").read_text())
    assert report["validated"] is False and "flow" in report["not_validated"]
    passport = json.loads((bundle / "engines" / "flow" / "engine.json").read_text())
    assert passport["backend"] == "tensorrt" and passport["compute_capability"] == "sm89"
    assert run_cli("build", str(recipe), "--artifacts", str(art), "-q", "--allow-unvalidated").returncode == 0
    assert run_cli("gate", str(bundle)).returncode == 1
    assert run_cli("gate", str(bundle), "--allow-unvalidated").returncode == 0
    res = run_cli("validate", str(bundle), "--artifacts", str(art))
    assert res.returncode == 2 and "cannot run its engines" in res.stderr
