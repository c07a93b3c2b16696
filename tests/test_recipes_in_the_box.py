"""Every recipe shipped in recipes/ loads, plans, and is listed in the README's recipe table."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO

# base.yaml and gpu-base.yaml are what the others extend, not recipes to build.
SHIPPED = sorted(p for p in (REPO / "recipes").glob("*.yaml") if not p.stem.endswith("base"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_plans(path: Path, tmp_path: Path) -> None:
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    recipe = load_recipe(path)
    assert recipe.name == path.stem
    plan = plan_build(recipe)
    assert set(plan.stage_steps) == set(recipe.enabled_stages())
    assert all("engine" in steps for steps in plan.stage_steps.values())


def test_readme_lists_every_shipped_recipe() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [p.name for p in SHIPPED if f"`{p.name}`" not in readme and f"`{p.name}` (demo)" not in readme]
    assert not missing, f"README's recipe table lacks {missing}"
