"""The PyTorch FP32 reference: the same graphs as the builds, run eagerly through Runners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosycompile.runtime.graphspec import GraphSpec
from cosycompile.runtime.pipeline import Pipeline


class TorchRunner:
    """A Runner over an eval-mode torch module whose forward takes the graph's inputs in order."""

    def __init__(self, module: torch.nn.Module, spec: GraphSpec) -> None:
        self.module = module.eval()
        self.input_names = spec.input_names
        self.output_names = spec.output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names]
        with torch.inference_mode():
            outs = self.module(*args)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return {n: o.detach().cpu().numpy() for n, o in zip(self.output_names, outs)}


def reference_runtime(stage: str, models: Any) -> Any:
    """The stage runtime over PyTorch modules (assets and constants taken from the model itself)."""
    from cosycompile.core.plugins import load_object
    from cosycompile.stages import get_stage

    sinfo = get_stage(stage)
    modules, assets, info = sinfo.hook("modules")(models)
    # A graph only GPU programs carry (the static-cache LLM step) adds nothing to a CPU reference.
    runners = {g.name: TorchRunner(modules[g.name], g) for g in sinfo.graphs if not g.gpu_program_only}
    return load_object(sinfo.runtime).from_runners(runners, assets, info)


def load_reference(model_dir: Path, stages: tuple[str, ...] = ("llm", "flow", "hift"), threads: int = 2) -> Any:
    """LoadedModels for ``stages`` with torch limited to ``threads`` (fair speed comparisons)."""
    from cosycompile.models.loader import load_models

    torch.set_num_threads(threads)
    return load_models(model_dir, stages)


def reference_pipeline(models: Any) -> Pipeline:
    """Text -> wav on the PyTorch modules, through the same numpy control flow as every build."""
    return Pipeline(reference_runtime("llm", models), reference_runtime("flow", models),
                    reference_runtime("hift", models))
