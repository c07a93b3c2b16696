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


def _reduced_precision(stage: object) -> bool:
    """Whether a stage's engine computes below FP32: a quantized format, or an engine dtype of 16 bits."""
    fmt = (stage.quantize or {}).get("format", "fp32")  # type: ignore[attr-defined]
    return fmt != "fp32" or stage.engine.options.get("dtype") in ("bfloat16", "float16")  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_reduced_precision_recipes_do_not_keep_fp32_limits(path: Path) -> None:
    """base.yaml's limits are an FP32 build's (logits within 1e-3, every greedy token equal, estimator
    within 1e-3), and so is cpu-fp32.yaml's rule of identical pipeline tokens. A recipe whose LLM or
    flow computes below FP32 cannot pass them on any machine, so it must switch them off and gate on
    what such a build keeps; the GPU recipes once inherited them, and cpu-torch-int8 the pipeline's."""
    from cosycompile.recipe.schema import load_recipe

    recipe = load_recipe(path)
    gate = recipe.validation.gate
    if "llm" in recipe.enabled_stages() and _reduced_precision(recipe.stages["llm"]):
        assert gate.max.get("llm.max_abs_logit_error") is None and gate.min.get("llm.greedy_identical_ratio") is None
        assert gate.min.get("llm.logit_cosine") is not None
        # The pipeline's tokens are the LLM's greedy tokens: the same FP32-only rule, end to end.
        assert gate.min.get("pipeline.tokens_identical_ratio") is None
    if "flow" in recipe.enabled_stages() and _reduced_precision(recipe.stages["flow"]):
        assert (gate.max.get("flow.estimator_max_abs_error") or 1.0) > 1e-3
        assert gate.min.get("flow.mel_snr_db") is not None
