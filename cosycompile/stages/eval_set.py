"""The eval items every check and the reference run on.

Its own module: the reference step needs only this, and a step's cache key covers every module its
code can import, so a change to how checks time engines (check_tools) must not rerun the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext
from cosycompile.stages.common import model_dir


def eval_inputs(ctx: StepContext) -> list[tuple[np.ndarray, Any]]:
    """(text ids, prompt) of the eval items the checks use: the same head of the set as the reference."""
    from cosycompile.runtime.dataset import load_dataset
    from cosycompile.runtime.frontend import Frontend

    frontend = Frontend(model_dir(ctx))
    items = load_dataset(ctx.file_roots["eval"]).head(ctx.params["max_items"])
    return [frontend.item_inputs(i) for i in items]
