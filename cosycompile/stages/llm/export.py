"""The LLM stage's export step; what it exports of a network (decode steps, embedding tables) is the family's ``parts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def stage_parts(models: Any) -> tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of the LLM stage, from the family that loaded ``models``."""
    from cosycompile.families import stage_parts as family_parts

    return family_parts(models, "llm")


def export(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.export`` step."""
    from cosycompile.stages.common import export_stage

    return export_stage(ctx, "llm")
