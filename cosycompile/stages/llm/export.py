"""The LLM stage's PyTorch side: the decode-step module, its embedding tables and constants."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosycompile.core.graph import StepContext


def stage_parts(models: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(graph modules, numpy assets, runtime constants) of the loaded LM."""
    from cosycompile.models.qwen2lm import LLMDecodeStep, LLMStaticStep

    lm = models.llm
    c = models.config.llm
    assets = {
        "text_embedding": lm.llm.model.model.embed_tokens.weight.detach().float().numpy(),
        "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
        "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
    }
    info = {"num_layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.hidden_size // c.num_heads,
            "hidden_size": c.hidden_size, "speech_token_size": models.config.speech_token_size,
            "vocab_size": models.config.speech_token_size + 3}
    return {"llm_step": LLMDecodeStep(lm).eval(), "llm_step_static": LLMStaticStep(lm).eval()}, assets, info


def export(ctx: StepContext) -> dict[str, Any]:
    """The ``llm.export`` step."""
    from cosycompile.stages.common import export_stage

    return export_stage(ctx, "llm")
