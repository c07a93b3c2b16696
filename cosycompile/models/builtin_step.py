"""The step that writes a built-in model in the real CosyVoice2 checkpoint layout."""

from __future__ import annotations

from typing import Any

from cosycompile.core.graph import StepContext


def materialize(ctx: StepContext) -> dict[str, Any]:
    """Write ``builtin:*`` into the step's output dir with the same loader-facing layout as a real dir."""
    from cosycompile.models.loader import init_model

    init_model(ctx.params["spec"], ctx.out, seed=ctx.params["seed"])
    return {"spec": ctx.params["spec"]}
