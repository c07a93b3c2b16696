"""Shared by the benchmarks that run PyTorch networks directly: a built-in model materialised once
through the build's own cached ``model`` step, then loaded like any checkpoint dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load_builtin(model: str, stages: tuple[str, ...], artifacts: Path, threads: int, name: str) -> Any:
    """The reference networks of ``stages`` of ``model`` (e.g. ``builtin:random-0.5b``), read from the
    cache entry of the model step of a throwaway recipe called ``name`` under ``artifacts/bench``."""
    import yaml

    from cosycompile.cache.local import Store
    from cosycompile.core.graph import Executor, Reporter, StateFile
    from cosycompile.plan import plan_build
    from cosycompile.recipe.schema import load_recipe
    from cosycompile.reference.runners import load_reference

    path = artifacts / "bench" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / "cpu-fp32.yaml"), "name": name, "model": model}))
    plan = plan_build(load_recipe(path))
    model_step = plan.stage_steps[stages[0]]["export"].deps["model"]
    store = Store(artifacts)
    result = Executor(store, [model_step], StateFile(store.root / "state" / f"{name}.json"), Reporter()).run()
    return load_reference(result.entries["model"].data, stages, threads)
