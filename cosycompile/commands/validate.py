"""``cosycompile validate BUNDLE``: run the checks on a bundle's own engines, on a machine that can
run them (a GPU bundle built on a CPU machine says "built, not validated here" until then)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_common
from cosycompile.errors import UserError

ORDER = 50


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


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("validate", help="run the checks of a bundle on its own engines (on a machine that can run them)",
                       description="Validate BUNDLE's engines against the PyTorch FP32 reference, as a build would, "
                                   "and write a validated bundle. Needs the bundle's recipe (recorded in its manifest, "
                                   "or --recipe) and its model and eval set.")
    p.add_argument("bundle", type=Path, help="bundle dir")
    p.add_argument("--recipe", type=Path, help="the recipe file, if not where the manifest says")
    p.add_argument("--force", action="store_true", help="re-run every step even if cached")
    add_common(p)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``validate`` command."""
    from cosycompile.commands.gate import apply_gate
    from cosycompile.core.graph import Reporter

    bundle, recipe = validate_bundle(args.bundle, args.artifacts, Reporter(quiet=args.quiet), args.recipe, args.force)
    print(f"validated: {bundle}")
    g = recipe.validation.gate
    th = g.thresholds()
    return apply_gate(bundle, None, th["min"], th["max"], g.max_quality_drop, g.max_slowdown)
