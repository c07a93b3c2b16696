"""Every shipped GPU recipe (CosyVoice-300M, CosyVoice2 and CosyVoice3) builds on this CPU machine up to its engines.

Each one runs through the CLI as ``cosycompile build RECIPE --artifacts ART`` (a recipe that extends
the shipped one with a one-item eval and a two-item calibration set): it exits 3 with every step it
can run here cached, or 0 when all of its engines build here too (TensorRT-RTX compiles ahead of
time; they are then built, not validated here), and ``plan --todo --json`` then leaves exactly the
engine steps this machine cannot build and the check that waits for them. One artifacts dir serves
the whole module, so the recipes of one model share their model, reference, exports and calibration.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosycompile.errors import RecipeError
from cosycompile.recipe.schema import load_recipe
from tests.helpers import REPO, write_recipe
from seed_store import seeded


def _target(path: Path) -> str | None:
    """A shipped recipe's target; None for one that is no recipe on its own (a shared base)."""
    try:
        return load_recipe(path).target
    except RecipeError:
        return None


TARGETS = {p.name: _target(p) for p in sorted((REPO / "recipes").glob("*.yaml"))}
GPU_RECIPES = [name for name, target in TARGETS.items() if target not in (None, "cpu")]
# `make test` builds one recipe whose engines all build here (TensorRT-RTX, the DiT flow of CosyVoice3)
# and one whose LLM engine is left for a GPU machine (TensorRT-LLM); tests/backends/test_tensorrt.py
# builds rtx4090-fp16's engines too. The others (every shipped GPU recipe is built by one tier or the
# other) are the extended tier's: h100-torch alone spends most of two minutes in AOTInductor exports.
CI_RECIPES = {"l20-int8.yaml", "cv3-rtx4090-fp16.yaml"}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800)


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory, seed: Path) -> Path:
    """The artifacts dir every recipe of this module builds into, from the session's seed (the tiny
    model's CPU builds: the same model, reference, ONNX exports and calibration)."""
    return seeded(seed, tmp_path_factory.mktemp("gpu-recipes") / "art")


def test_the_gpu_recipes_of_every_family_are_found() -> None:
    # gpu-base.yaml names TensorRT-LLM on base.yaml's cpu target: a base to extend, not a recipe.
    assert [name for name, target in TARGETS.items() if target is None] == ["gpu-base.yaml"]
    families = {load_recipe(REPO / "recipes" / r).model.split(":")[-1].split("-")[0] for r in GPU_RECIPES}
    assert families == {"tiny", "cv3", "cv1"}
    assert {"l20-int8.yaml", "h100-fp8.yaml", "rtx4090-fp16.yaml", "cv3-l20-int8.yaml", "cv3-h100-fp8.yaml",
            "cv3-rtx4090-fp16.yaml", "cv1-l20-int8.yaml", "cv1-rtx4090-fp16.yaml"} <= set(GPU_RECIPES)
    assert CI_RECIPES <= set(GPU_RECIPES)


@pytest.mark.parametrize("name", [n if n in CI_RECIPES else pytest.param(n, marks=pytest.mark.extended)
                                  for n in GPU_RECIPES])
def test_gpu_recipe_builds_up_to_its_engines(name: str, art: Path) -> None:
    shipped = REPO / "recipes" / name
    recipe = write_recipe(art.parent / "recipes" / name, {
        "extends": str(shipped), "name": f"{shipped.stem}-on-cpu",
        "validation": {"max_items": 1}, "calibration": {"max_items": 2},
    }, base=False)
    # --allow-unvalidated: engines that all build here but cannot run here (TensorRT-RTX's) end the
    # build "built, not validated here", exit 0 rather than a failed gate.
    res = _cli("build", str(recipe), "--artifacts", str(art), "-q", "--allow-unvalidated", cwd=art.parent)
    assert res.returncode in (0, 3), res.stdout[-3000:] + res.stderr[-3000:]

    todo = _cli("plan", str(recipe), "--artifacts", str(art), "--todo", "--json", cwd=art.parent)
    assert todo.returncode == 0, todo.stderr
    doc = json.loads(todo.stdout)
    steps = {s["name"]: s for s in doc["steps"]}
    # Nothing this machine can run is left over: every step not cached is one it cannot run.
    assert all(s["state"] == "left" for s in steps.values()), steps
    engines = {n for n in steps if n.endswith(".engine")}
    assert all(steps[e]["needs"]["blocked"] for e in engines), steps
    if not engines:
        assert res.returncode == 0 and not steps, res.stdout
        return
    # Exactly the engines left and the checks that wait for them (the pipeline check, when the
    # recipe's engines cannot all run here; a stage's own check otherwise).
    checks = set(steps) - engines
    assert checks and all(n.endswith(".check") for n in checks), steps
    assert all(set(steps[c]["needs"]["waits_for"]) & engines for c in checks), steps
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert "finish with: " in res.stdout
    typed = load_recipe(shipped)
    if typed.stage("llm").engine.backend == "trtllm":  # TensorRT-LLM has no CPU-only install
        assert "llm.engine" in engines
