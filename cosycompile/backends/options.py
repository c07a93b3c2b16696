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
