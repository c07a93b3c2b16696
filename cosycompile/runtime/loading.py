"""Load built engine dirs into the pipeline's stage runtimes through the backend registry (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.errors import BackendUnavailable
from cosycompile.runtime.graphs_dir import read_graphs_dir

PASSPORT = "engine.json"


def load_assets(engine_dir: Path) -> dict[str, np.ndarray]:
    """The stage's numpy assets, memory-mapped (embedding tables can be hundreds of MB)."""
    gd = read_graphs_dir(engine_dir)
    return {name: np.load(gd.asset_path(name), mmap_mode="r") for name in gd.assets}


def read_passport(engine_dir: Path) -> dict[str, Any]:
    """The engine dir's passport (which backend built it, for what)."""
    path = engine_dir / PASSPORT
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackendUnavailable(f"{path}: not a readable engine passport ({exc})") from None


def load_runners(engine_dir: Path, threads: int) -> dict[str, Any]:
    """Runners for every graph of an engine dir, by the backend its passport names."""
    from cosycompile.backends import backend_infos

    backend = read_passport(engine_dir).get("backend")
    info = backend_infos().get(str(backend))
    if info is None:
        raise BackendUnavailable(f"{engine_dir}: built by backend '{backend}', which this installation does not have "
                                 f"(known: {', '.join(backend_infos())})")
    return info.hook("load")(engine_dir, threads)


def stage_runtime(stage: str, engine_dir: Path, threads: int) -> Any:
    """The runtime object of one stage over its built engine."""
    from cosycompile.core.plugins import load_object
    from cosycompile.stages import get_stage

    runners = load_runners(engine_dir, threads)
    gd = read_graphs_dir(engine_dir)
    return load_object(get_stage(stage).runtime).from_runners(runners, load_assets(engine_dir), gd.info)
