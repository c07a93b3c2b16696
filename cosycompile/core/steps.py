"""Step bodies shared by every stage: graph simplification and engine building."""

from __future__ import annotations

from typing import Any

from cosycompile.backends import get_backend_info
from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import copy_assets, read_graphs_dir
from cosycompile.onnx.tools import simplify as simplify_graph
from cosycompile.recipe.targets import TARGETS


def simplify(ctx: StepContext) -> dict[str, Any]:
    """Simplify every graph of the input graphs dir with the recipe's method."""
    src = read_graphs_dir(ctx.inputs["graphs"])
    out = copy_assets(src, ctx.out)
    stats = {}
    for name, g in src.graphs.items():
        stats[name] = simplify_graph(src.graph_path(name), ctx.out / g["file"], ctx.params["method"])
        ctx.log(f"{name}: {stats[name]['nodes_before']} -> {stats[name]['nodes_after']} nodes")
    out.write()
    return {"simplify": stats}


def build_engine(ctx: StepContext) -> dict[str, Any]:
    """Hand the graphs dir to the recipe's backend (its ``build`` verb)."""
    info = get_backend_info(ctx.params["backend"])
    assert info is not None
    target = TARGETS[ctx.target or "cpu"]
    return info.impl().build(ctx.inputs["graphs"], ctx.params["options"], target, ctx.out)
