"""The ``<stage>.quantize`` step with ONNX Runtime's ``quantize_dynamic``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.runtime.graphs_dir import copy_assets, link_or_copy, read_graphs_dir


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Quantize every quantizable graph of the stage; the others are linked through unchanged."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from cosycompile.onnx.tools import check_node_patterns
    from cosycompile.stages import get_stage

    s = ctx.spec
    stage = ctx.params["stage"]
    quantizable = {g.name for g in get_stage(stage).graphs if g.quantizable}
    src = read_graphs_dir(ctx.inputs["graphs"])
    out = copy_assets(src, ctx.out)
    stats: dict[str, Any] = {}
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    for name, g in src.graphs.items():
        dst = ctx.out / g["file"]
        if name not in quantizable:
            link_or_copy(src.graph_path(name), dst)
            continue
        excluded = check_node_patterns([src.graph_path(name)], list(s.exclude), f"stages.{stage}.quantize.exclude")
        ctx.log(f"{name}: dynamic int8 of {', '.join(s.op_types)} (per_channel={s.per_channel})")
        # MatMulConstBOnly: only MatMuls against a weight; attention's activation x activation
        # MatMuls would quantize both sides at run time and lose the most accuracy for little gain.
        quantize_dynamic(str(src.graph_path(name)), str(dst), op_types_to_quantize=list(s.op_types),
                         per_channel=s.per_channel, weight_type=QuantType.QInt8, nodes_to_exclude=excluded or None,
                         extra_options={"MatMulConstBOnly": True})
        out.graphs[name] = dict(g, precision="int8")
        stats[name] = _op_counts(dst)
        ctx.log(f"{name}: {stats[name]}")
    out.info["precision"] = "int8"
    out.info["quantized_graphs"] = sorted(quantizable)
    out.write()
    return {"quantized": stats}


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    ops = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
    return {op: ops.count(op) for op in ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "MatMul", "Conv")}
