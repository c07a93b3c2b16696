"""The ``<stage>.quantize`` step with ONNX Runtime's ``quantize_dynamic``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.quantize.graphs import quantize_graphs
from cosycompile.runtime.graphs_dir import GraphsDir


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Quantize every quantizable graph of the stage; the others are linked through unchanged."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from cosycompile.onnx.tools import check_node_patterns

    s = ctx.spec
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)

    def one(name: str, src: GraphsDir, dst: Path) -> None:
        key = f"stages.{ctx.params['stage']}.quantize.exclude"
        excluded = check_node_patterns([src.graph_path(name)], list(s.exclude), key)
        ctx.log(f"{name}: dynamic int8 of {', '.join(s.op_types)} (per_channel={s.per_channel})")
        # MatMulConstBOnly: only MatMuls against a weight; attention's activation x activation
        # MatMuls would quantize both sides at run time and lose the most accuracy for little gain.
        quantize_dynamic(str(src.graph_path(name)), str(dst), op_types_to_quantize=list(s.op_types),
                         per_channel=s.per_channel, weight_type=QuantType.QInt8, nodes_to_exclude=excluded or None,
                         extra_options={"MatMulConstBOnly": True})

    return quantize_graphs(ctx, "int8", one)
