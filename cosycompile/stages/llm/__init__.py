"""LLM stage: the family's speech-token LM (CosyVoice2/3's Qwen2 body, CosyVoice-300M's Transformer) as
a decode step with KV cache (inputs_embeds + past -> logits + present).

Embedding lookups stay outside the graph as numpy tables, which keeps the engine's inputs the
same for prefill and decode and lets the prompt mix text and speech embeddings freely.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.runtime.stage_graphs.llm import LLM_STEP, LLM_STEP_STATIC
from cosycompile.stages import Metric, StageInfo


class LLMCheck(BaseModel):
    """The LLM check's workload: greedy decoding and teacher-forced logits on the eval items
    (thresholds live in ``validation.gate`` under the metric names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speed_tokens: int = Field(32, description="decode steps timed for the per-token speed")


PLUGIN = StageInfo(
    order=0,
    summary="speech-token LM decode step with KV cache -> speech-token logits",
    graphs=(LLM_STEP, LLM_STEP_STATIC),
    check_spec=LLMCheck,
    metrics=(
        Metric("max_abs_logit_error", "max_abs_logit_error", False, "", description="teacher-forced logits vs PyTorch"),
        Metric("greedy_identical_ratio", "greedy_identical_ratio", True, "ratio",
               description="eval items whose greedy tokens equal the reference's"),
        Metric("top1_agreement", "top1_agreement", True, "ratio"),
        Metric("logit_cosine", "logit_cosine", True, "cosine"),
        Metric("kl", "kl", False, "nats"),
        Metric("speedup_vs_fp32", "speedup_vs_fp32", True, "x", "speed", "decode steps vs the FP32 engine"),
    ),
    checkpoint_export=".hf_rewrite:export_checkpoint",
)
