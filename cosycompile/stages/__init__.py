"""Stages as plug-ins: each sub-folder is one stage, named as recipes name it (``stages.<name>``).

A stage folder's ``__init__.py`` is light: it defines ``PLUGIN = StageInfo(...)`` with the graphs
the stage exports (their specs), its check's workload spec and the metrics its check reports. A
stage is a role (text -> tokens -> mel -> wav); the files it reads from a model dir and the runtime
that runs its graphs are the model family's (``cosycompile.families``). Its heavy code sits beside
it: ``export.py`` (``export(ctx)``, and the torch modules, assets and constants of its graphs) and
``check.py`` (``reference(...)`` computed once per model into the reference step, and ``check(ctx)``
comparing an engine with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from cosycompile.core.plugins import discover, load_object, resolve_ref
from cosycompile.runtime.graphspec import GraphSpec


@dataclass(frozen=True)
class Metric:
    """A named figure: ``key`` is where the producing check stores it, ``higher`` its good direction.

    Declared by each stage plug-in (its check's figures) and by ``validate.registry`` (the pipeline
    and speed figures); the registry gives each its full name.
    """

    name: str
    key: str
    higher: bool
    unit: str = ""
    kind: str = "quality"  # or "speed"
    description: str = ""
    # The smallest change of a quality figure a baseline comparison counts: below it two builds differ
    # by rounding (another CPU's kernels), not by quality.
    resolution: float = 1e-4


@dataclass(frozen=True)
class StageInfo:
    """What the planner, recipes and runtimes need to know about a stage, without importing torch."""

    order: int  # position in text -> tokens -> mel -> wav
    summary: str
    graphs: tuple[GraphSpec, ...]
    check_spec: type[BaseModel]
    metrics: tuple[Metric, ...]
    export: str = ".export:export"
    # The export for backends that consume a checkpoint (``BackendInfo.consumes == "checkpoint"``),
    # e.g. the LLM's HF rewrite; None: the stage cannot feed such a backend.
    checkpoint_export: str | None = None
    modules: str = ".export:stage_parts"  # (modules, assets, info) of the PyTorch network
    check: str = ".check:check"
    reference: str = ".check:reference"
    # Runtime constants a recipe may set under ``stages.<name>.runtime`` (e.g. the flow's CFM steps):
    # they change what the engines compute, not the graphs, and are written into the graphs' info
    # at export so every engine and bundle built from them runs with them. None: nothing to set.
    runtime_spec: type[BaseModel] | None = None
    name: str = ""
    package: str = ""

    def ref(self, attr: str) -> str:
        """An absolute ``module:attr`` reference for one of the stage's hooks."""
        return resolve_ref(self.package, getattr(self, attr))

    def hook(self, attr: str) -> Any:
        """Import and return one of the stage's hooks (heavy imports happen here)."""
        return load_object(self.ref(attr))

    def graph(self, name: str) -> GraphSpec:
        return next(g for g in self.graphs if g.name == name)


def stage_infos() -> dict[str, StageInfo]:
    """Every stage plug-in, in pipeline order."""
    return dict(sorted(discover("stages").items(), key=lambda kv: kv[1].order))


def pipeline_stages() -> tuple[str, ...]:
    """The stage names in pipeline order (text -> tokens -> mel -> wav)."""
    return tuple(stage_infos())


def get_stage(name: str) -> StageInfo:
    """One stage's info (KeyError for an unknown stage; recipes reject those earlier)."""
    return stage_infos()[name]


def graph_spec(name: str) -> GraphSpec:
    """The spec of a graph by name, whichever stage exports it."""
    for stage in stage_infos().values():
        for g in stage.graphs:
            if g.name == name:
                return g
    raise KeyError(name)
