"""LLM stage: the Qwen2 LM as a decode step with KV cache (inputs_embeds + past -> logits + present).

Embedding lookups stay outside the graph as numpy tables, which keeps the engine's inputs the
same for prefill and decode and lets the prompt mix text and speech embeddings freely.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cosycompile.runtime.graphspec import Dim, GraphSpec, Tensor
from cosycompile.stages import Metric, StageInfo

LLM_STEP = GraphSpec(
    name="llm_step",
    inputs=(Tensor("inputs_embeds", "float32", ("batch", "seq", "hidden_size")),
            Tensor("past_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "past", "head_dim"))),
    outputs=(Tensor("logits", "float32", ("batch", "seq", "vocab_size")),
             Tensor("present_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "total", "head_dim"))),
    dims=(Dim("batch", 1, 1, 16, 1), Dim("seq", 1, 1, 1024, 3), Dim("past", 0, 512, 2560, 2),
          Dim("total", 1, 513, 3584, 5)),
    tolerance=1e-3,
    calib_crop_dim="seq",
)

# The decode step over a cache of fixed size (a family's LLMStaticStep, e.g. cosyvoice2.qwen2lm) that the torch backend's
# runtime replays as a CUDA graph; only torch programs for a GPU target carry it.
LLM_STEP_STATIC = GraphSpec(
    name="llm_step_static",
    inputs=(Tensor("inputs_embeds", "float32", ("batch", 1, "hidden_size")),
            Tensor("key_values", "float32", ("num_layers", 2, "batch", "kv_heads", "slots", "head_dim")),
            Tensor("position", "int64", (1,), value_range=(0, 2))),
    outputs=(Tensor("logits", "float32", ("batch", 1, "vocab_size")),
             Tensor("new_key_values", "float32", ("num_layers", 2, "batch", "kv_heads", 1, "head_dim"))),
    dims=(Dim("batch", 1, 1, 16, 1), Dim("slots", 2, 1024, 4096, 4)),
    tolerance=1e-3,
    gpu_program_only=True,
)


class LLMCheck(BaseModel):
    """The LLM check's workload: greedy decoding and teacher-forced logits on the eval items
    (thresholds live in ``validation.gate`` under the metric names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speed_tokens: int = Field(32, description="decode steps timed for the per-token speed")


PLUGIN = StageInfo(
    order=0,
    summary="Qwen2 LM decode step with KV cache -> speech-token logits",
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
