"""Recipes share the steps that compute the same thing (issue 42, item 3): every shipped recipe of a
family that calibrates runs one ``calibrate`` entry (keyed by the model, the items and the code, not
by which stages it quantizes or how), and recipes with the same LLM quantization share that step."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from helpers import REPO, write_recipe

RECIPES = sorted(p for p in (REPO / "recipes").glob("*.yaml") if p.name not in ("base.yaml", "gpu-base.yaml"))


def _keys(recipe: Path, art: Path) -> dict[str, str]:
    res = subprocess.run([sys.executable, "-m", "cosycompile", "plan", str(recipe), "--todo", "--json", "--artifacts",
                          str(art)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return {s["name"]: s["key"] for s in json.loads(res.stdout)["steps"]}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    art = tmp_path_factory.mktemp("art")
    return {r.stem: _keys(r, art) for r in RECIPES}


def test_one_calibration_per_family(plans: dict[str, dict[str, str]]) -> None:
    by_family: dict[str, set[str]] = defaultdict(set)
    for name, keys in plans.items():
        if "calibrate" in keys:
            family = {"cv3-": "cosyvoice3", "cv1-": "cosyvoice"}.get(name[:4], "cosyvoice2")
            by_family[family].add(keys["calibrate"])
    assert set(by_family) == {"cosyvoice", "cosyvoice2", "cosyvoice3"}
    assert all(len(keys) == 1 for keys in by_family.values()), dict(by_family)


def test_the_recipes_of_one_model_share_one_reference(plans: dict[str, dict[str, str]]) -> None:
    # The FP32 reference is keyed by the model, the eval items and the code, not by how the engines are
    # quantized: cpu-fp32, then cpu-int8 on one model, run it once (the build-level proof is
    # tests/commands/test_build_e2e.py's, in the extended tier).
    from cosycompile.recipe.schema import load_recipe

    by_model: dict[str, set[str]] = defaultdict(set)
    for name, keys in plans.items():
        if "reference" in keys:
            by_model[load_recipe(REPO / "recipes" / f"{name}.yaml").model].add(keys["reference"])
    assert {"cpu-fp32", "cpu-int8", "cpu-int4", "cv1-cpu-int8", "cv3-cpu-int8"} <= \
        {name for name, keys in plans.items() if "reference" in keys}
    assert set(by_model) == {"builtin:tiny", "builtin:cv1-tiny", "builtin:cv3-tiny"}
    assert all(len(keys) == 1 for keys in by_model.values()), dict(by_model)


def test_the_same_llm_quantization_is_one_step(plans: dict[str, dict[str, str]]) -> None:
    int8 = {plans[r]["llm.quantize"] for r in ("cpu-int8", "cpu-fast", "cpu-int8-dynamic")}
    assert len(int8) == 1, int8
    operator = {plans[r]["llm.quantize"] for r in ("cpu-fast-torch-llm", "cpu-amx", "cpu-torch-int8")}
    assert len(operator) == 1 and not operator & int8, operator


def test_permission_to_calibrate_on_the_eval_set_is_not_in_the_key(plans: dict[str, dict[str, str]],
                                                                     tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", {"extends": str(REPO / "recipes" / "cpu-int8.yaml"), "name": "cpu-int8",
                                                "calibration": {"same_as_eval": True}}, base=False)
    assert _keys(recipe, tmp_path / "art")["calibrate"] == plans["cpu-int8"]["calibrate"]
