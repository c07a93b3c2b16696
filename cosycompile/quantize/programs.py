"""The loop the torch-program quantizers share: rewrite the chosen programs of a stage, link the
others through unchanged, write the graphs dir (the torch twin of ``quantize/graphs.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cosycompile.core.graph import StepContext
from cosycompile.errors import RecipeError
from cosycompile.runtime.graphs_dir import copy_assets, link_or_copy, read_graphs_dir


def rewrite_programs(ctx: StepContext, fmt: str, chosen: list[str] | None,
                     one: Callable[[str, Path, Path], dict[str, Any]]) -> dict[str, Any]:
    """Call ``one(name, src_program, dst_program)`` for each program in ``chosen`` (None: every
    program of the stage); returns the step's metadata (what ``one`` returned, by graph)."""
    stage = ctx.params["stage"]
    src = read_graphs_dir(ctx.inputs["graphs"])
    names = list(chosen) if chosen is not None else list(src.graphs)
    unknown = sorted(set(names) - set(src.graphs))
    if unknown:
        raise RecipeError(f"stages.{stage}.quantize.graphs: {', '.join(unknown)} not in stage '{stage}' "
                          f"(graphs: {', '.join(src.graphs)})")
    out = copy_assets(src, ctx.out)
    done: dict[str, Any] = {}
    for name, g in src.graphs.items():
        dst = ctx.out / g["file"]
        if name not in names:
            link_or_copy(src.graph_path(name), dst)
            continue
        done[name] = one(name, src.graph_path(name), dst)
        out.graphs[name] = dict(g, precision=fmt)
    out.info.update({"precision": fmt, "quantized_graphs": names})
    out.write()
    return {"quantized": done}
