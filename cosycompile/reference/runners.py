"""The PyTorch FP32 reference: the same graphs as the builds, run eagerly through Runners."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosycompile.runtime.pipeline import FlowRuntime, HiFTRuntime, LLMRuntime, Pipeline
from cosycompile.stage_io import FLOW_ENCODER, FLOW_ESTIMATOR, HIFT, LLM_STEP, STAGE_GRAPHS, GraphIO


class TorchRunner:
    """A Runner over an eval-mode torch module whose forward takes the graph's inputs in order."""

    def __init__(self, module: torch.nn.Module, io: GraphIO) -> None:
        self.module = module.eval()
        self.io = io
        self.input_names = list(io.inputs)
        self.output_names = list(io.outputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.io.inputs]
        with torch.inference_mode():
            outs = self.module(*args)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return {n: o.detach().cpu().numpy() for n, o in zip(self.io.outputs, outs)}


def stage_impl(stage: str) -> Any:
    return importlib.import_module(f"cosycompile.stages.{stage}")


def reference_runtime(stage: str, models: Any) -> Any:
    """The stage runtime over PyTorch modules (assets and constants taken from the model itself)."""
    impl = stage_impl(stage)
    mods = impl.graph_modules(models)
    runners = {io.name: TorchRunner(mods[io.name], io) for io in STAGE_GRAPHS[stage]}
    assets = impl.assets(models)
    info = impl.info(models)
    if stage == "llm":
        return LLMRuntime(runners[LLM_STEP.name], assets, info)
    if stage == "flow":
        return FlowRuntime(runners[FLOW_ENCODER.name], runners[FLOW_ESTIMATOR.name], assets, info)
    if stage == "hift":
        return HiFTRuntime(runners[HIFT.name], info)
    raise KeyError(stage)


def load_reference(model_dir: Path, stages: tuple[str, ...] = ("llm", "flow", "hift"), threads: int = 2) -> Any:
    """LoadedModels for ``stages`` with torch limited to ``threads`` (fair speed comparisons)."""
    from cosycompile.models.loader import load_models

    torch.set_num_threads(threads)
    return load_models(model_dir, stages)


def reference_pipeline(models: Any) -> Pipeline:
    return Pipeline(reference_runtime("llm", models), reference_runtime("flow", models),
                    reference_runtime("hift", models))
