"""ONNX Runtime dynamic INT8 quantization of a stage's quantizable graphs (the flow estimator,
HiFT): per-channel INT8 weights, activations quantized at run time per tensor
(``DynamicQuantizeLinear`` + ``MatMulInteger``/``ConvInteger``), no calibration data.

The alternative to ModelOpt's static Q/DQ for CPUs, where activation ranges measured on a few
calibration items may not hold: the range is taken from each tensor as it flows. Chosen with
``quantize: {format: int8, quantizer: ort_dynamic}``; ONNX Runtime only (TensorRT has no
integer-MatMul path for these ops).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.quantize import QuantizerInfo


class Spec(BaseModel):
    """``stages.<flow|hift>.quantize`` for ONNX Runtime dynamic quantization."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: Literal["ort_dynamic"] = Field("ort_dynamic", description="this quantizer (chosen by format when absent)")
    format: Literal["int8"] = Field(description="the format the graphs are quantized to")
    op_types: list[Literal["MatMul", "Gemm", "Conv"]] = Field(
        default_factory=lambda: ["MatMul", "Gemm"],
        description="op types quantized (Conv -> ConvInteger, which ONNX Runtime's CPU kernels run slowly)")
    per_channel: bool = Field(True, description="one weight scale per output channel (else per tensor)")
    weights: Literal["int8", "uint8"] = Field(
        "int8", description="weight type: int8 runs ONNX Runtime's U8S8 kernels, fastest and exact with VNNI; "
                            "on x86 CPUs without VNNI they saturate, and uint8 (U8U8 kernels, exact everywhere) "
                            "keeps the accuracy")
    exclude: list[str] = Field(default_factory=list, description="node-name regexes kept in FP32")


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=("int8",),
    tools=("onnx", "onnxruntime"),
    weight_only=("int8",),  # no recorded activations: ranges are computed at run time
    backends=("onnxruntime",),
)
