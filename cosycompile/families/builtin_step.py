"""The step that writes a built-in model as a model dir in its family's checkpoint layout."""

from __future__ import annotations

from typing import Any

from cosycompile.core.graph import StepContext


def materialize(ctx: StepContext) -> dict[str, Any]:
    """Write ``builtin:*`` into the step's output dir with the same loader-facing layout as a real dir.

    The family's ``init_model`` is reached through the registry; the planner adds its module to the
    step's code so that editing it rebuilds the model.
    """
    from cosycompile.families import get_family

    get_family(ctx.params["family"]).hook("init_model")(ctx.params["spec"], ctx.out, seed=ctx.params["seed"])
    return {"spec": ctx.params["spec"]}
