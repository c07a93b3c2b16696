"""TensorRT-LLM backend for the speech-token LM (planned: builds are refused until it lands)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.backends import BackendInfo


class Options(BaseModel):
    """TensorRT-LLM engine options for the speech-token LM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(16, ge=1)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int = Field(2560, ge=1)
    max_num_tokens: int = Field(32768, ge=1)
    gemm_plugin: Literal["auto", "float16", "bfloat16", "disable"] = "auto"


PLUGIN = BackendInfo(
    options=Options,
    tools=("tensorrt-llm",),
    target_kinds=("gpu",),
    consumes="checkpoint",
    stages=("llm",),
    unavailable="the TensorRT-LLM backend is not part of this version of cosycompile yet",
)
