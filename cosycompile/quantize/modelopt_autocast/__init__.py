"""FP16 graphs for strongly typed runtimes (TensorRT 11, TensorRT-RTX) with ModelOpt AutoCast, for every
stage's quantizable graphs (the flow estimator, HiFT).

Those runtimes take precision only from the ONNX, so an FP16 engine needs an FP16 ONNX. The conversion
must not break audio silently: before AutoCast runs, every constant whose reciprocal the graph uses
(above all the Snake alphas of HiFT, ``x + sin(alpha x)^2 / alpha``) is scanned, and an alpha whose
reciprocal would overflow FP16 (65504) refuses the build unless the recipe asks to clamp it. Upstream
CosyVoice3 shipped a HiFT engine whose audio clipped to -1 because 4 of 10,752 alphas were < 1.6e-5.

``fp16`` is *not* weight-only: the FP32 graph runs on the stage's recorded real inputs (the ``calibrate``
step) and every node whose float inputs or outputs exceed ``data_max`` there stays FP32 (AutoCast's
data-driven mode, fed through its ``custom_rule`` hook). Activation overflow depends on data, not weights
(CosyVoice3's flow estimator gave NaN mels in plain FP16 and was fixed exactly this way, autocast with
``data_max 65504``); AutoCast's fallback, uniform random inputs in [-1, 1], says nothing about the ranges
a real mel or CFM state reaches.

HiFT: ``keep_fp32: ['/f0_predictor/', '/m_source/']`` keeps F0 and the NSF source FP32. The source integrates
F0 into a phase, so FP16 F0 errors accumulate over the utterance; on builtin:tiny keeping them FP32 lifts
the HiFT outputs' SNR against FP32 well above the all-FP16 graph's (docs/bench-log/2026-11-23-tensorrt-rtx-builds.md).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.core.targets import Target
from cosycompile.quantize import QuantizerInfo

FP16_MAX = 65504.0
# The smallest |alpha| kept: 1/alpha must stay finite in FP16, i.e. below 65504 (|alpha| >= 1.527e-5).
# With margin, as upstream's fix clamped 1/alpha to 6e4: |alpha| >= 1/60000 = 1.667e-5, so 1/alpha
# <= 60000 and the ~0.05% rounding of 1/alpha to FP16 cannot reach 65504 either.
SNAKE_ALPHA_MIN = 1.0 / 60000.0


class Spec(BaseModel):
    """``stages.<flow|hift>.quantize`` for ModelOpt AutoCast FP16."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: str | None = Field(None, description="this quantizer (chosen by format when absent)")
    format: Literal["fp16"] = Field(description="the format the graphs are quantized to")
    keep_fp32: list[str] = Field(default_factory=list, description="node-name regexes (searched) kept in FP32")
    data_max: float = Field(FP16_MAX, gt=0, le=FP16_MAX,
                            description="nodes whose inputs/outputs on the recorded real inputs exceed this stay FP32")
    snake_alpha: Literal["refuse", "clamp"] = Field(
        "refuse", description="alphas whose reciprocal overflows FP16: refuse the build, or clamp |alpha| "
                              "to snake_alpha_min keeping the sign")
    snake_alpha_min: float = Field(SNAKE_ALPHA_MIN, ge=1.0 / FP16_MAX, le=1.0,
                                   description="smallest |alpha| (or divisor) whose reciprocal is safe in FP16")


def check(spec: Spec, stage: str, target: Target) -> tuple[str, str] | None:
    """Every ``keep_fp32`` entry must be a valid regex (whether it matches a node is checked on the graph)."""
    for pat in spec.keep_fp32:
        try:
            re.compile(pat)
        except re.error as exc:
            return "keep_fp32", f"bad regex '{pat}' ({exc})"
    return None


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=("fp16",),
    # AutoCast rewrites graphs with onnx-graphsurgeon and types them with onnxslim's shape inference;
    # ONNX Runtime runs the FP32 range pass.
    tools=("nvidia-modelopt", "onnx", "onnxruntime", "onnx-graphsurgeon", "onnxslim"),
    weight_only=(),  # fp16 reads the recorded inputs: see the module docstring
    check=check,
)
