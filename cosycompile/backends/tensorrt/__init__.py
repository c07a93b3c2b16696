"""TensorRT backend for the flow and HiFT graphs (planned: builds are refused until it lands)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.backends import BackendInfo


class Options(BaseModel):
    """TensorRT engine options (strongly typed builds; precision comes from the quantized ONNX)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workspace_gib: float = Field(4.0, gt=0)
    builder_optimization_level: int = Field(3, ge=0, le=5)
    hardware_compatibility: Literal["none", "same_compute_capability", "ampere_plus"] = "none"
    version_compatible: bool = False
    max_batch: int = Field(1, ge=1, description="utterances per estimator call (batch = 2x for CFG)")


PLUGIN = BackendInfo(
    options=Options,
    tools=("tensorrt",),
    target_kinds=("gpu",),
    consumes="onnx",
    stages=("flow", "hift"),
    unavailable="the TensorRT backend is not part of this version of cosycompile yet",
)
