"""The ``<stage>.simplify`` step: every graph of a graphs dir through onnxslim / onnxsim."""

from __future__ import annotations

from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.onnx.tools import simplify as simplify_graph
from cosycompile.runtime.graphs_dir import copy_assets, read_graphs_dir


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
