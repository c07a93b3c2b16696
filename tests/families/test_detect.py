"""The family of a build's model: read from the model dir (which config file it holds), from the
built-in's name, or named by the recipe (``model.family``, checked against the registry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosycompile.errors import ModelError, RecipeError
from helpers import write_recipe


def test_family_is_detected_from_the_model_dir(tiny_model_dir: Path) -> None:
    from cosycompile.families import detect_family, resolve_family

    assert detect_family(tiny_model_dir).name == "cosyvoice2"
    assert resolve_family(tiny_model_dir).name == "cosyvoice2"
    assert resolve_family("builtin:tiny-snake").name == "cosyvoice2"


def test_a_dir_without_a_known_config_names_the_files_it_looked_for(tmp_path: Path) -> None:
    from cosycompile.families import detect_family

    with pytest.raises(ModelError) as err:
        detect_family(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path}:") and "cosyvoice2.yaml" in msg and "\n" not in msg


def test_plan_uses_the_model_dirs_family(tmp_path: Path, tiny_model_dir: Path) -> None:
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", {"name": "t", "model": str(tiny_model_dir)}))
    assert recipe.model_family is None
    plan = plan_build(recipe)
    assert plan.family.name == "cosyvoice2"
    reference = next(s for s in plan.steps[0].deps.values() if s.name == "reference")
    assert reference.params["family"] == "cosyvoice2"


def test_recipe_names_the_family(tmp_path: Path, tiny_model_dir: Path) -> None:
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "model": {"path": str(tiny_model_dir), "family": "cosyvoice2"}})
    recipe = load_recipe(path)
    assert recipe.model == str(tiny_model_dir) and recipe.model_family == "cosyvoice2"
    assert plan_build(recipe).family.name == "cosyvoice2"


def test_an_unknown_family_is_a_one_line_recipe_error_listing_the_known_ones(tmp_path: Path) -> None:
    from cosycompile.recipe.schema import load_recipe

    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "model": {"path": "builtin:tiny", "family": "cosyvoice9"}})
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg
    assert "cosyvoice9" in msg and "known: " in msg and "cosyvoice2" in msg


def test_a_builtin_of_another_family_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import cosycompile.families as families
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    real = families.family_infos()
    other = dataclasses.replace(real["cosyvoice2"], name="other", builtins=("other-tiny",))
    monkeypatch.setattr(families, "family_infos", lambda: {**real, "other": other})
    path = write_recipe(tmp_path / "r.yaml", {"name": "t", "model": {"path": "builtin:tiny", "family": "other"}})
    with pytest.raises(ModelError, match="unknown built-in model 'builtin:tiny' of family 'other'"):
        plan_build(load_recipe(path))
