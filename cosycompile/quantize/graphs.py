"""The loop every ONNX quantizer shares: quantize the stage's quantizable graphs, link the others
through unchanged, record each quantized graph's op counts, write the graphs dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import GraphsDir, copy_assets, link_or_copy, read_graphs_dir

_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
        "MatMul", "Conv")


def quantize_graphs(ctx: StepContext, fmt: str, one: Callable[[str, GraphsDir, Path], None],
                    info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call ``one(name, src, dst)`` for each quantizable graph of ``ctx.params["stage"]`` (it writes
    ``dst``); returns the step's metadata (op counts per quantized graph)."""
    from cosycompile.stages import get_stage

    quantizable = [g.name for g in get_stage(ctx.params["stage"]).graphs if g.quantizable]
    src = read_graphs_dir(ctx.inputs["graphs"])
    out = copy_assets(src, ctx.out)
    stats: dict[str, Any] = {}
    for name, g in src.graphs.items():
        dst = ctx.out / g["file"]
        if name not in quantizable:
            link_or_copy(src.graph_path(name), dst)
            continue
        one(name, src, dst)
        out.graphs[name] = dict(g, precision=fmt)
        stats[name] = op_counts(dst)
        ctx.log(f"{name}: {stats[name]}")
    out.info.update({"precision": fmt, "quantized_graphs": quantizable, **(info or {})})
    out.write()
    return {"quantized": stats}


def op_counts(path: Path) -> dict[str, int]:
    """Counts of the quantization-related ops of a graph, and its ONNX opset."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    counts = {op: ops.count(op) for op in _OPS}
    counts["opset"] = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return counts
