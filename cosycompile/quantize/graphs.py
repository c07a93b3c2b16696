"""The loop every quantizer of exported graphs shares (ONNX graphs and torch programs alike):
quantize the chosen graphs of a stage, link the others through unchanged, write the graphs dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cosycompile.core.graph import StepContext
from cosycompile.errors import RecipeError
from cosycompile.core.files import link_or_copy
from cosycompile.runtime.graphs_dir import GraphsDir, copy_assets, read_graphs_dir

_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
        "MatMulNBits", "MatMul", "Conv")


def rewrite_graphs(ctx: StepContext, fmt: str, chosen: list[str] | None,
                   one: Callable[[str, GraphsDir, Path], dict[str, Any]],
                   info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call ``one(name, src, dst)`` for each graph of ``ctx.params["stage"]`` in ``chosen`` (None: all
    of them); it writes ``dst`` and returns what it did. Returns the step's metadata, by graph."""
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
        done[name] = one(name, src, dst)
        out.graphs[name] = dict(g, precision=fmt)
    out.info.update({"precision": fmt, "quantized_graphs": names, **(info or {})})
    out.write()
    return {"quantized": done}


def quantize_graphs(ctx: StepContext, fmt: str, one: Callable[[str, GraphsDir, Path], None],
                    info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ONNX quantizers' form: ``one`` quantizes each quantizable graph of the stage; the metadata
    holds each quantized graph's op counts."""
    def counted(name: str, src: GraphsDir, dst: Path) -> dict[str, int]:
        one(name, src, dst)
        counts = op_counts(dst)
        ctx.log(f"{name}: {counts}")
        return counts

    return rewrite_graphs(ctx, fmt, quantizable_graphs(ctx.params["stage"]), counted, info)


def quantizable_graphs(stage: str) -> list[str]:
    """The graphs a stage marks as worth quantizing (the flow estimator, HiFT; none for the LLM)."""
    from cosycompile.stages import get_stage

    return [g.name for g in get_stage(stage).graphs if g.quantizable]


def op_counts(path: Path) -> dict[str, int]:
    """Counts of the quantization-related ops of a graph, and its ONNX opset."""
    from cosycompile.onnx.tools import load_structure

    model = load_structure(path)
    ops = [n.op_type for n in model.graph.node]
    counts = {op: ops.count(op) for op in _OPS}
    counts["opset"] = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return counts
