"""INT8 W8A8 of the speech-token LM as a compressed-tensors checkpoint (the HF rewrite with INT8
weights per channel and INT8 activations per token at run time), the quantized form vLLM loads:
its ModelOpt loader refuses SmoothQuant's per-layer smoothing vectors, while this format needs
none. Served by the ``vllm`` backend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.quantize import QuantizerInfo


class Spec(BaseModel):
    """``stages.llm.quantize`` for a compressed-tensors checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: str | None = Field(None, description="this quantizer (chosen by format when absent)")
    format: Literal["int8_dyn"] = Field(
        description="int8_dyn: INT8 weights per output channel, INT8 activations per token scaled at run time")
    reduce_range: bool = Field(
        False, description="weights within ±63 instead of ±127: exact INT8 GEMMs on x86 CPUs without VNNI (AVX2 only), "
                           "where oneDNN's int16 pair sums saturate; one bit less weight precision")
    exclude: list[str] = Field(default_factory=list, description="LM modules kept in high precision (wildcards)")
    exports: list[Literal["hf"]] = Field(default_factory=lambda: ["hf"],
                                         description="hf: the rewrite checkpoint in compressed-tensors form")


PLUGIN = QuantizerInfo(
    spec=Spec,
    formats=("int8_dyn",),
    tools=("torch", "transformers", "safetensors"),
    stages=("llm",),
    weight_only=("int8_dyn",),
    backends=("vllm",),
)
