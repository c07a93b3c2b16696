"""INT8 and FP8 linears for the ``torch`` backend, with activations quantized at run time.

Every ``aten.linear`` of a chosen program whose weight is a constant is rewritten in the program
itself: the weight is stored quantized (INT8 per output channel, or FP8 E4M3 per tensor), and the
input is quantized as it flows (INT8 per row, FP8 per tensor; after a GELU, the INT8 row scale is bounded
from the GELU's input so that the GELU is computed once) before ``torch._int_mm`` or
``torch._scaled_mm``; the result is rescaled to FP32. With ``attention: int8`` (CPU targets) the
attention products go to INT8 too, each attention one call of the project's ``cosycompile::int8_attention``
(``attention.py``). With ``kernel: cosycompile`` each INT8 linear is
one call of the project's ``cosycompile::int8_linear`` operator (``runtime/torch_ops``), the same
arithmetic, which reads the weights once for a decode step's row. With ``convolutions: bf16`` the
convolutions compute in BF16 (``convolutions.py``); otherwise they stay FP32, as the normalisations do.
No calibration data: the ranges come from each call's own activations.

The programs are the same for a CPU and a GPU target except one thing CUDA's INT8 GEMM demands:
more than 16 rows, so GPU programs pad the rows by 16 zeros and slice them off. ``_int_mm`` has
fast CPU kernels; ``_scaled_mm`` runs on a CPU only as a slow emulation, so FP8 is for sm89+ GPUs
(on a CPU it checks numerics).
"""

from __future__ import annotations

from typing import Literal

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cosycompile.core.targets import Target
from cosycompile.quantize import QuantizerInfo


class Spec(BaseModel):
    """``stages.<stage>.quantize`` for quantized linears in torch programs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: Literal["torch_dynamic"] = Field("torch_dynamic", description="this quantizer (chosen by format when absent)")
    format: Literal["int8", "fp8"] = Field(description="the format the graphs are quantized to")
    graphs: list[str] | None = Field(None, description="graphs to quantize (default: the stage's quantizable "
                                                        "graphs, or all of them when it marks none, as the LLM)")
    attention: Literal["fp32", "int8"] = Field(
        "fp32", description="precision of the attention products (Q.K and P.V) of the quantized graphs; "
                            "int8 is for CPU targets (the project's operator, compiled with the quantize step and "
                            "carried in the engine dir)")
    kernel: Literal["int_mm", "cosycompile"] = Field(
        "int_mm", description="the INT8 linears' kernel: 'int_mm' (torch._int_mm, the activation's quantization fused "
                              "by Inductor into the code around it) or 'cosycompile' (the project's operator, compiled "
                              "with the quantize step and carried in the engine dir: up to 8 rows in one AVX512-VNNI "
                              "or AVX2 pass over the weights, a blocked GEMM beyond; for decode steps on CPU targets)")
    convolutions: Literal["fp32", "bf16"] = Field(
        "fp32", description="precision of the quantized graphs' convolutions: bf16 stores their weights in BF16 "
                            "and computes them in BF16, FP32 around them; for CPUs with AVX512-BF16 or AMX (slower "
                            "than FP32 elsewhere) and GPUs")
    keep_fp32: list[str] = Field(default_factory=list,
                                 description="regexes on weight names (as in the program, e.g. 'llm_decoder') "
                                             "whose linears, and with convolutions: bf16 whose convolutions, "
                                             "stay FP32")

    @field_validator("keep_fp32")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {p!r} ({exc})") from None
        return patterns


def check(spec: Spec, stage: str, target: Target) -> tuple[str, str] | None:
    """INT8 attention is for CPU targets: its frame counts are not the multiples of 8 CUDA's INT8 GEMM needs."""
    if spec.kernel == "cosycompile" and (spec.format != "int8" or target.kind == "gpu"):
        return "kernel", ("'cosycompile' is an INT8 operator for CPU targets; "
                          f"this block is {spec.format} for target '{target.name}': use kernel 'int_mm'")
    if spec.attention == "int8" and target.kind == "gpu":
        return "attention", ("int8 runs on CPU targets only (CUDA's INT8 GEMM needs inner sizes that are "
                             f"multiples of 8, which a frame count is not); target '{target.name}' is a GPU")
    return None


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=("int8", "fp8"),
    tools=("torch",),
    stages=("llm", "flow", "hift"),
    weight_only=("int8", "fp8"),  # nothing recorded: activation ranges are taken at run time
    backends=("torch",),
    check=check,
)
