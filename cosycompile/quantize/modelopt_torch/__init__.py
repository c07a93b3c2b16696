"""ModelOpt PyTorch PTQ of the speech-token LM (int8 SmoothQuant, int8/int4 weight-only with AWQ,
W4A8, FP8), calibrated on the recorded reference inputs; exports an ONNX decode step for CPUs and
HF / TensorRT-LLM checkpoints for GPU servers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosycompile.core.targets import Target
from cosycompile.quantize import CalibratedSpec, QuantizerInfo

METHODS: dict[str, tuple[str, ...]] = {
    "int8_sq": ("max",),
    "int8_wo": ("max",),
    "int4_awq": ("awq_lite", "awq_full", "awq_clip", "autoawq"),
    "w4a8_awq": ("awq_lite", "awq_full", "awq_clip"),
    "fp8": ("max",),
}


class Spec(CalibratedSpec):
    """``stages.llm.quantize`` for ModelOpt PyTorch PTQ."""

    METHODS = METHODS

    quantizer: str | None = Field(None, description="this quantizer (chosen by format when absent)")
    format: Literal["int8_sq", "int8_wo", "int4_awq", "w4a8_awq", "fp8"] = Field(
        description="the format the graphs are quantized to")
    method: str | None = Field(None, description="calibration method (default: per format)")
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="SmoothQuant migration strength (int8_sq; 0.5)")
    block_size: int | None = Field(None, ge=16, description="INT4 group size (int4_awq, w4a8_awq; 128)")
    exclude: list[str] = Field(default_factory=list, description="LM modules kept in high precision (wildcards)")
    calib_items: int = Field(16, ge=1, description="recorded calibration sequences used")
    exports: list[Literal["onnx", "hf", "trtllm"]] = Field(
        default_factory=lambda: ["onnx"], description="ONNX decode step (CPU), HF and/or TensorRT-LLM checkpoints")


def check(spec: Spec, stage: str, target: Target) -> tuple[str, str] | None:
    """Keys the chosen format does not read are errors, so a recipe never carries a dead setting."""
    problem = spec.method_problem()
    if problem:
        return problem
    if spec.method == "autoawq":
        from importlib.util import find_spec

        if find_spec("awq") is None:
            return "method", ("method 'autoawq' needs the optional AutoAWQ package (pip install 'cosycompile[autoawq]'); "
                              "ModelOpt's awq_lite/awq_full need nothing extra")
        return "method", ("method 'autoawq' is installed but not wired into this version: AutoAWQ's packed INT4 "
                          "kernels need a GPU and the project is deprecated upstream; use awq_lite or awq_full")
    if spec.alpha is not None and spec.format != "int8_sq":
        return "alpha", f"'alpha' is SmoothQuant's migration strength; format '{spec.format}' does not read it"
    if spec.block_size is not None and spec.format not in ("int4_awq", "w4a8_awq"):
        return "block_size", f"'block_size' is the INT4 group size; format '{spec.format}' does not read it"
    if spec.format == "int8_wo" and "calib_items" in spec.model_fields_set:
        return "calib_items", "format 'int8_wo' is calibrated from the weights alone; it reads no calibration items"
    if not spec.exports:
        return "exports", "at least one export (onnx, hf, trtllm) is needed"
    return None


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=tuple(METHODS),
    tools=("nvidia-modelopt", "torch", "transformers", "onnx", "onnxruntime"),
    stages=("llm",),
    weight_only=("int8_wo",),
    check=check,
)
