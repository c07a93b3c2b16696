"""Per-backend engine options (light pydantic models; validated when the recipe is loaded)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OnnxRuntimeOptions(BaseModel):
    """ONNX Runtime engine: an offline-optimized model plus the session settings to run it with."""

    model_config = ConfigDict(extra="forbid")

    optimization: Literal["disable", "basic", "extended", "all"] = Field(
        "extended",
        description="graph optimizations applied offline and saved; 'all' adds layout changes "
        "specific to the build machine's CPU",
    )
    execution_mode: Literal["sequential", "parallel"] = "sequential"


class TensorRTOptions(BaseModel):
    """TensorRT engine options (strongly typed builds; precision comes from the quantized ONNX)."""

    model_config = ConfigDict(extra="forbid")

    workspace_gib: float = Field(4.0, gt=0)
    builder_optimization_level: int = Field(3, ge=0, le=5)
    hardware_compatibility: Literal["none", "same_compute_capability", "ampere_plus"] = "none"
    version_compatible: bool = False
    max_frames: int = Field(3000, ge=16, description="max T of the estimator profile (60 s incl. prompt)")
    opt_frames: int = Field(500, ge=4)
    max_batch: int = Field(1, ge=1, description="utterances per estimator call (batch = 2x for CFG)")


class TrtLLMOptions(BaseModel):
    """TensorRT-LLM engine options for the speech-token LM."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(16, ge=1)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int = Field(2560, ge=1)
    max_num_tokens: int = Field(32768, ge=1)
    gemm_plugin: Literal["auto", "float16", "bfloat16", "disable"] = "auto"
