"""A model family is one folder: no step of another family's build can run (so no key can depend on)
a module of it. Checked for every shipped recipe over the import closure that its steps' keys hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO

SHIPPED = sorted(p for p in (REPO / "recipes").glob("*.yaml") if not p.stem.endswith("base"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_no_step_reaches_another_familys_folder(path: Path) -> None:
    from cosycompile.core.keys import module_closure
    from cosycompile.families import family_infos
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe

    plan = plan_build(load_recipe(path))
    others = [info.package + "." for name, info in family_infos().items() if name != plan.family.name]
    steps, todo = {}, list(plan.steps)
    while todo:  # every step of the graph, through each step's inputs
        step = todo.pop()
        if id(step) not in steps:
            steps[id(step)] = step
            todo.extend(step.deps.values())
    reached = {m for step in steps.values() for m in module_closure(
        r for r in step.code_roots() if r == "cosycompile" or r.startswith("cosycompile."))}
    foreign = sorted(m for m in reached if m.startswith(tuple(others)) or m + "." in others)
    assert not foreign, f"{path.name} ({plan.family.name}) reaches {foreign[:5]}"
    # The family's own folder is reached (otherwise the check above would pass vacuously).
    assert any(m.startswith(plan.family.package + ".") for m in reached)
