"""Load built engine dirs into the pipeline's stage runtimes (no torch needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.backends import get_backend_info
from cosycompile.errors import BackendUnavailable
from cosycompile.runtime.graphs_dir import read_graphs_dir
from cosycompile.runtime.pipeline import FlowRuntime, HiFTRuntime, LLMRuntime
from cosycompile.stage_io import FLOW_ENCODER, FLOW_ESTIMATOR, HIFT, LLM_STEP


def load_assets(engine_dir: Path) -> dict[str, np.ndarray]:
    """The stage's numpy assets, memory-mapped (embedding tables can be hundreds of MB)."""
    gd = read_graphs_dir(engine_dir)
    return {name: np.load(gd.asset_path(name), mmap_mode="r") for name in gd.assets}


def stage_runtime(stage: str, engine_dir: Path, backend: str, threads: int) -> Any:
    """The runtime object of one stage over its built engine."""
    info = get_backend_info(backend)
    if info is None:
        raise BackendUnavailable(f"{engine_dir}: unknown backend '{backend}'")
    runners = info.impl().load(engine_dir, threads)
    gd = read_graphs_dir(engine_dir)
    assets = load_assets(engine_dir)
    if stage == "llm":
        return LLMRuntime(runners[LLM_STEP.name], assets, gd.info)
    if stage == "flow":
        return FlowRuntime(runners[FLOW_ENCODER.name], runners[FLOW_ESTIMATOR.name], assets, gd.info)
    if stage == "hift":
        return HiFTRuntime(runners[HIFT.name], gd.info)
    raise KeyError(stage)
