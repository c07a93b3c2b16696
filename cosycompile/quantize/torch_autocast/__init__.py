"""BF16 / FP16 torch programs for the ``torch`` backend: each exported program is traced again under
``torch.autocast``, so matmuls, linears and convolutions compute in the low-precision type while
reductions, softmax and normalisations stay in FP32 (autocast's per-op policy). The casts become
explicit ops in the program, so the same program compiles for CPU or CUDA. No calibration data.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.quantize import QuantizerInfo


class Spec(BaseModel):
    """``stages.<stage>.quantize`` for the torch backend's autocast."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: Literal["torch_autocast"] = Field("torch_autocast", description="this quantizer (chosen by format when absent)")
    format: Literal["bf16", "fp16"] = Field(description="the format the graphs are quantized to")
    graphs: list[str] | None = Field(None, description="graphs of the stage to cast (default: all of them)")


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=("bf16", "fp16"),
    tools=("torch",),
    stages=("llm", "flow", "hift"),
    weight_only=("bf16", "fp16"),  # nothing to calibrate: a cast
    backends=("torch",),
)
