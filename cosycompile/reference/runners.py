"""The PyTorch FP32 reference: the same graphs as the builds, run eagerly through Runners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosycompile.runtime.graphspec import GraphSpec
from cosycompile.runtime.pipeline import Pipeline
from cosycompile.stages import pipeline_stages


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
    """The stage runtime of the models' family over PyTorch modules (assets and constants taken from
    the model itself)."""
    from cosycompile.families import get_family
    from cosycompile.stages import get_stage

    sinfo = get_stage(stage)
    modules, assets, info = sinfo.hook("modules")(models)
    # The static-cache LLM step (a torch program only) adds nothing to the eager reference: it decodes the same.
    runners = {g.name: TorchRunner(modules[g.name], g) for g in sinfo.graphs if not g.torch_program_only}
    return get_family(models.family).hook("runtimes", stage).from_runners(runners, assets, info)


def load_reference(model_dir: Path, stages: tuple[str, ...] | None = None, threads: int = 2,
                   family: str | None = None) -> Any:
    """The family's loaded models for ``stages`` (every stage of the pipeline by default) with torch
    limited to ``threads`` (fair speed comparisons); ``family``: the recipe's, else read from the dir."""
    from cosycompile.families import load_models

    torch.set_num_threads(threads)
    return load_models(model_dir, stages if stages is not None else pipeline_stages(), family)


def reference_pipeline(models: Any) -> Pipeline:
    """Text -> wav on the PyTorch modules, through the same numpy control flow as every build."""
    return Pipeline({s: reference_runtime(s, models) for s in pipeline_stages()})
