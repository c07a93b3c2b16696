"""ModelOpt ONNX PTQ of a stage's quantizable graphs (the flow estimator, HiFT): int8 max/entropy,
fp8, int4, calibrated on the inputs recorded from the FP32 reference."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosycompile.core.targets import Target
from cosycompile.quantize import CalibratedSpec, QuantizerInfo

METHODS: dict[str, tuple[str, ...]] = {
    "int8": ("max", "entropy"),
    "fp8": ("max", "entropy"),
    "int4": ("awq_clip", "awq_lite", "rtn_dq"),
}


class Spec(CalibratedSpec):
    """``stages.<flow|hift>.quantize`` for ModelOpt ONNX PTQ."""

    METHODS = METHODS

    quantizer: str | None = Field(None, description="this quantizer (chosen by format when absent)")
    format: Literal["int8", "fp8", "int4"] = Field(description="the format the graphs are quantized to")
    method: str | None = Field(None, description="calibration method (default: per format)")
    block_size: int | None = Field(None, ge=16, description="INT4 block size (int4; 128)")
    exclude: list[str] = Field(default_factory=list, description="node-name regexes kept in high precision")
    high_precision_dtype: Literal["auto", "fp32", "fp16"] = Field(
        "auto", description="dtype of the non-quantized parts; auto = fp32 on CPUs, fp16 on GPUs")


def check(spec: Spec, stage: str, target: Target) -> tuple[str, str] | None:
    """Keys the chosen format does not read are errors."""
    problem = spec.method_problem()
    if problem:
        return problem
    if spec.block_size is not None and spec.format != "int4":
        return "block_size", f"'block_size' is the INT4 block size; format '{spec.format}' does not read it"
    return None


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=tuple(METHODS),
    tools=("nvidia-modelopt", "onnx", "onnxruntime"),
    check=check,
)
