"""``cosycompile validate BUNDLE``: run the checks on a bundle's own engines, on a machine that can
run them (a GPU bundle built on a CPU machine says "built, not validated here" until then)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosycompile.errors import UserError


def validate_bundle(bundle: Path, artifacts: Path, reporter: Any, recipe_path: Path | None = None,
                    force: bool = False) -> tuple[Path, Any]:
    """Validate ``bundle``'s engines against the FP32 reference; returns the validated bundle's dir
    and the recipe."""
    from cosycompile.cache.local import Store
    from cosycompile.exporters import exporter_infos
    from cosycompile.plan import executor, plan_build, run_problems
    from cosycompile.recipe.schema import load_recipe

    from cosycompile.runtime.bundle import MANIFEST, read_manifest

    manifest = read_manifest(bundle / MANIFEST)
    source = recipe_path or Path(manifest.get("recipe_source", ""))
    if not source.is_file():
        raise UserError(f"{bundle}: its recipe {source} is not on this machine; give it with --recipe")
    recipe = load_recipe(source)
    if recipe.name != manifest.get("recipe"):
        raise UserError(f"{source}: recipe '{recipe.name}' is not the bundle's ('{manifest.get('recipe')}')")
    problems = run_problems(recipe)
    if problems:
        why = "; ".join(f"{s}: {r}" for s, r in problems.items())
        raise UserError(f"{bundle}: this machine cannot run its engines ({why}); validate it on one that can")
    missing = [s for s in recipe.enabled_stages() if not (bundle / "engines" / s / "engine.json").is_file()]
    if missing:
        raise UserError(f"{bundle}: no engine for stage(s) {', '.join(missing)}")
    plan = plan_build(recipe, engines_from=bundle)
    store = Store(artifacts)
    result = executor(plan, store, reporter, force=force).run()
    return exporter_infos()["bundle"].hook("export")(plan, store, result), recipe
