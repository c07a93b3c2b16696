"""The ``<stage>.quantize`` step with ONNX Runtime's ``quantize_dynamic``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.quantize.graphs import quantize_graphs
from cosycompile.runtime.graphs_dir import GraphsDir
from cosycompile.runtime.host import u8s8_products_are_exact

SATURATING_U8S8 = ("this CPU has no VNNI, where ONNX Runtime's U8S8 products sum byte pairs into saturating 16-bit "
                   "integers and lose accuracy; `weights: uint8` runs its U8U8 kernels, which are exact")


def quantize(ctx: StepContext) -> dict[str, Any]:
    """Quantize every quantizable graph of the stage; the others are linked through unchanged."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from cosycompile.onnx.tools import check_node_patterns

    s = ctx.spec
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)

    def one(name: str, src: GraphsDir, dst: Path) -> None:
        key = f"stages.{ctx.params['stage']}.quantize.exclude"
        excluded = check_node_patterns([src.graph_path(name)], list(s.exclude), key)
        ctx.log(f"{name}: dynamic int8 of {', '.join(s.op_types)} (per_channel={s.per_channel}, weights {s.weights})")
        # MatMulConstBOnly: only MatMuls against a weight; attention's activation x activation
        # MatMuls would quantize both sides at run time and lose the most accuracy for little gain.
        weight_type = QuantType.QUInt8 if s.weights == "uint8" else QuantType.QInt8
        quantize_dynamic(str(src.graph_path(name)), str(dst), op_types_to_quantize=list(s.op_types),
                         per_channel=s.per_channel, weight_type=weight_type, nodes_to_exclude=excluded or None,
                         extra_options={"MatMulConstBOnly": True})

    meta = quantize_graphs(ctx, "int8", one)
    # The engine is built, validated and mostly served where it is quantized: say so before it is.
    if s.weights == "int8" and not u8s8_products_are_exact():
        ctx.reporter.warn(f"{ctx.name}: {SATURATING_U8S8}")
    return meta
